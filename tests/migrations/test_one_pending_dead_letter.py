"""Migration 0018: at most one pending dead letter per (consumer, job_id); duplicates found at upgrade are discarded,
audited, naming the letter that supersedes each."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from support.factories import add_dead_letters

from maintenance.runtime import migrate

BEFORE = "0017_trace_context"
INDEX = "dead_letters_one_pending_per_job_idx"


def index_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"core.{INDEX}",)).fetchone()[0]


def test_a_second_pending_letter_of_a_job_and_consumer_is_refused_by_the_database(conn):
    """A plain INSERT of a second pending letter for the same (consumer, job_id) violates the unique index."""
    job_id = uuid.uuid4()
    add_dead_letters(conn, "points.credit", 1, job_id=job_id, consumer="points.credit")
    with pytest.raises(psycopg.errors.UniqueViolation, match=INDEX):
        add_dead_letters(conn, "points.credit", 1, job_id=job_id, consumer="points.credit")


def test_letters_without_a_consumer_are_not_constrained(conn):
    """Letters written by plain SQL without a consumer (older writers) may repeat a job: NULLs are distinct."""
    job_id = uuid.uuid4()
    assert len(add_dead_letters(conn, "points.credit", 3, job_id=job_id)) == 3


def test_upgrade_discards_all_but_the_newest_pending_letter_of_a_job_with_an_audit_row(empty_database_url):
    """Duplicates at upgrade: the older ones become discarded, each audited naming the newest; the rest untouched."""
    migrate.upgrade(empty_database_url, BEFORE)
    job_id, other_job = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        # Three letters a second apart, the first the newest; one more of another job, one of another consumer.
        newest, older, oldest = add_dead_letters(conn, "points.credit", 3, job_id=job_id, consumer="points.credit")
        [alone] = add_dead_letters(conn, "points.credit", 1, job_id=other_job, consumer="points.credit")
        [audit] = add_dead_letters(conn, "points.credit", 1, job_id=job_id, consumer="points.audit")
        migrate.upgrade(empty_database_url)
        statuses = dict(conn.execute("SELECT id, status FROM core.dead_letters").fetchall())
        assert statuses == {
            newest: "pending_review",
            older: "discarded",
            oldest: "discarded",
            alone: "pending_review",
            audit: "pending_review",
        }
        ledger = conn.execute(
            "SELECT dead_letter_id, action, operator, reason FROM core.dead_letter_actions ORDER BY dead_letter_id"
        ).fetchall()
        assert [(i, action, operator) for i, action, operator, _reason in ledger] == [
            (letter_id, "discarded", "migration 0018_one_pending_dead_letter") for letter_id in sorted((older, oldest))
        ]
        assert all(f"superseded by dead letter {newest}" in reason for *_, reason in ledger)
        assert index_exists(conn)


def test_downgrade_drops_the_index_and_keeps_the_discards(empty_database_url):
    """Down to 0017: the index is gone (duplicates may be written again); the upgrade's discards stay in the ledger."""
    migrate.upgrade(empty_database_url, BEFORE)
    job_id = uuid.uuid4()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        add_dead_letters(conn, "points.credit", 2, job_id=job_id, consumer="points.credit")
        migrate.upgrade(empty_database_url)
        migrate.downgrade(empty_database_url, BEFORE)
        assert not index_exists(conn)
        add_dead_letters(conn, "points.credit", 1, job_id=job_id, consumer="points.credit")
        assert conn.execute("SELECT count(*) FROM core.dead_letter_actions").fetchone()[0] == 1
