"""bench/fence_scale.py: the v7 ids it mints in SQL for the bulk load (the drained jobs' are harness.new_job_id's), and a tiny run.

The benchmark's figures are only as good as its ids: a v7 id that is not time-ordered would load
a v7 table shaped like a v4 one. The tiny run keeps the script working (CI runs it; the real run
is in docs/performance.md, "The fence at scale").
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from bench import fence_scale


def _ms(u: uuid.UUID) -> int:
    return u.int >> 80


def test_sql_uuidv7_is_version_7_and_ordered_by_its_timestamp(pg_server_url: str) -> None:
    t0 = datetime(2026, 12, 1, 11, 42, tzinfo=UTC)
    times = [t0 + timedelta(milliseconds=ms) for ms in (0, 1, 2, 1000, 86_400_000)]
    expression = fence_scale.UUIDV7_SQL.format(ts="t.at")
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT t.at, {expression} FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS t(at, n) ORDER BY t.n",
            (times,),
        ).fetchall()
    ids = [u for _, u in rows]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert [_ms(u) for u in ids] == [int(at.timestamp() * 1000) for at in times]
    assert ids == sorted(ids)


def test_a_tiny_run_grows_the_table_and_prints_each_kind_and_ratio(
    pg_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--sizes", "1000,3000", "--jobs", "20", "--rounds", "1", "--fence-samples", "8", "--server", pg_server_url]
    assert fence_scale.main(argv) == 0
    out = capsys.readouterr().out
    for kind in ("v4", "v7"):
        assert f"{kind} job ids" in out
        assert f"  {kind}:        3,000 fences (+2,000)" in out  # grown from 1 000, not rebuilt
    assert out.count("ratio to 1,000 fences:") == 2
    assert "projected: growing to 30,000 fences" in out
