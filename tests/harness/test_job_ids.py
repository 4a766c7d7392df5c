"""harness.new_job_id: the UUID version 7 the harness mints when a producer gives none (RFC 9562)."""

from __future__ import annotations

import uuid

import harness


def test_a_minted_id_is_version_7_of_the_rfc_variant_and_carries_its_millisecond():
    at = 1_765_000_000_123_456_789  # ns
    minted = harness.new_job_id(lambda: at)
    assert (minted.version, minted.variant) == (7, uuid.RFC_4122)
    assert int.from_bytes(minted.bytes[:6], "big") == at // 1_000_000


def test_ids_of_a_later_millisecond_sort_after_and_ids_of_one_millisecond_differ():
    at = 1_765_000_000_123_000_000
    same = {harness.new_job_id(lambda: at) for _ in range(1000)}
    assert len(same) == 1000  # 74 random bits each
    assert harness.new_job_id(lambda: at + 1_000_000) > max(same)


def test_postgresql_reads_the_id_as_a_uuid_of_the_same_text(conn):
    minted = harness.new_job_id()
    assert conn.execute("SELECT %s::uuid::text", (minted,)).fetchone()[0] == str(minted)
