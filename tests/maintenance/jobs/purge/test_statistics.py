"""The purge without current statistics (a restore, a bulk load, autovacuum behind): each batch reads only its rows.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.purge_support import (
    LOAD_FENCES,
    PROTECTED,
    REPLAY_GUARDS,
    STATISTICS,
    TTL,
    load_executions,
    load_unanalyzed_fences,
    planner_statistics,
    purger,
    rows_read,
)

from maintenance.jobs.purge.paths import fetch_limited
from maintenance.jobs.purge.sql import (
    DELETE_EXPIRED_IDEMPOTENCY_KEYS,
    DELETE_FAILED_EXECUTIONS,
    INDEX_BATCH,
    INDEX_BATCH_END,
    INDEX_TIED_BATCH,
    SET_ROW_BATCH_LIMITS,
    SWEEP_BATCH,
)


@STATISTICS
@REPLAY_GUARDS
def test_an_index_batch_reads_only_its_rows_without_current_statistics(conn, now, hashed_pending_limit, statistics):
    """Never analyzed, or analyzed before 20 000 expired fences were loaded: a 100-row index batch finds its end
    reading 101 entries of the expires_at index, and its DELETE reads the range's 100 rows, no sort of every expired row."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cursor": "-infinity", "cutoff": now, "protected_from": now - PROTECTED, "batch_size": 100}
    read, node_types = rows_read(conn, INDEX_BATCH_END, params, "processed_jobs")
    assert (read, "Sort" in node_types) == (101, False)
    (end,) = fetch_limited(conn, "5s", INDEX_BATCH_END, params)
    read, node_types = rows_read(conn, INDEX_BATCH[guard], params | {"end": end}, "processed_jobs")
    assert (read, "Sort" in node_types) == (100, False)


@STATISTICS
@REPLAY_GUARDS
def test_an_index_batch_inside_a_tie_reads_only_the_tie_without_current_statistics(
    conn, now, hashed_pending_limit, statistics
):
    """Never analyzed, or stale: a 100-row batch among 20 000 fences sharing one expires_at reads 100 rows of them, no sort."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    tied = {"at": now - timedelta(days=1)}  # the 20 000 loaded ones (not the 2 000 fresh ones of "stale")
    conn.execute("UPDATE core.processed_jobs SET expires_at = %(at)s WHERE processed_at < %(at)s", tied)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cursor": now - timedelta(days=1), "cutoff": now, "protected_from": now - PROTECTED, "batch_size": 100}
    read, node_types = rows_read(conn, INDEX_TIED_BATCH[guard], params, "processed_jobs")
    assert (read, "Sort" in node_types) == (100, False)


@STATISTICS
@REPLAY_GUARDS
def test_a_sweep_batch_reads_only_its_blocks_without_current_statistics(conn, now, hashed_pending_limit, statistics):
    """Never analyzed, or analyzed before 20 000 expired fences were loaded: a sweep batch of blocks [40, 50) (~900 rows) reads only those blocks' rows, by a TID range scan."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cutoff": now, "protected_from": now - PROTECTED, "from_block": 40, "to_block": 50}
    in_blocks = conn.execute(
        "SELECT count(*) FROM core.processed_jobs WHERE ctid >= '(40,0)'::tid AND ctid < '(50,0)'::tid"
    ).fetchone()[0]
    read, node_types = rows_read(conn, SWEEP_BATCH[guard], params, "processed_jobs")
    assert (read, "Tid Range Scan" in node_types) == (in_blocks, True)
    assert in_blocks > 100


@STATISTICS
def test_a_failed_executions_batch_reads_only_its_rows_without_current_statistics(conn, now, statistics):
    """Never analyzed, or analyzed while it held only 300 live executions, and as compact as a restore leaves it: a 10-row batch of DELETE_FAILED_EXECUTIONS among 300 old FAILED ones reads 10 of them in order, no sort, no scan of the whole table."""
    conn.execute("ALTER TABLE core.executions SET (autovacuum_enabled = false)")
    if statistics == "stale":
        load_executions(conn, "RUNNING", 300)
        conn.execute("ANALYZE core.executions")
    load_executions(conn, "FAILED", 300, age=f"{TTL.days + 1} days")
    assert (planner_statistics(conn, "executions")[0] == -1) == (statistics == "never")
    params = {"failed_before": now - TTL, "protected_from": now - PROTECTED, "batch_size": 10}
    read, node_types = rows_read(conn, DELETE_FAILED_EXECUTIONS, params, "executions", SET_ROW_BATCH_LIMITS)
    assert (read, "Sort" in node_types, "Seq Scan" in node_types) == (10, False, False)


@STATISTICS
@pytest.mark.parametrize("old_keys", [5000, 300], ids=["5000-old", "300-old"])
def test_an_idempotency_keys_batch_reads_only_its_rows_without_current_statistics(conn, now, statistics, old_keys):
    """Never analyzed, or analyzed while it held only 300 recent keys: a 10-row batch of DELETE_EXPIRED_IDEMPOTENCY_KEYS among 5 000 old keys, or 300 (a table of a few blocks), reads 10 rows, no sort, no scan of the whole table."""
    conn.execute("ALTER TABLE core.api_idempotency_keys SET (autovacuum_enabled = false)")
    add_keys = (
        "INSERT INTO core.api_idempotency_keys (idempotency_key, operator, method, route, request_fingerprint,"
        " response_status, response_body, created_at)"
        " SELECT %(prefix)s || g, 'ops:ana@example.com', 'POST', '/v1/core/dead-letters/{id}/replay', 'f', 200, '{}',"
        "        %(created_at)s + g * interval '1 second' FROM generate_series(1, %(rows)s) AS g"
    )
    if statistics == "stale":
        conn.execute(add_keys, {"prefix": "recent-", "created_at": now - timedelta(days=1), "rows": 300})
        conn.execute("ANALYZE core.api_idempotency_keys")
    conn.execute(add_keys, {"prefix": "old-", "created_at": now - timedelta(days=100), "rows": old_keys})
    assert (planner_statistics(conn, "api_idempotency_keys")[0] == -1) == (statistics == "never")
    params = {"kept_from": now - timedelta(days=30), "batch_size": 10}
    read, node_types = rows_read(
        conn, DELETE_EXPIRED_IDEMPOTENCY_KEYS, params, "api_idempotency_keys", SET_ROW_BATCH_LIMITS
    )
    assert (read, "Sort" in node_types, "Seq Scan" in node_types) == (10, False, False)


@pytest.mark.parametrize(
    ("analyzed_shuffled", "expired_share", "strategy"),
    [(True, 0.3, "index"), (False, 0.7, "sweep")],
    ids=["analyzed-shuffled-now-ordered", "analyzed-ordered-now-shuffled"],
)
def test_auto_chooses_from_the_sample_when_the_statistics_are_stale(
    db, conn, now, events, analyzed_shuffled, expired_share, strategy
):
    """Auto, analyzed in one layout then reloaded in the other: the correlation comes from the sample of the rows there now, not from pg_stats (in order 30 % expired: index; shuffled 70 %: sweep)."""
    conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
    analyzed_layout, layout = ("random()", "t.processed_at") if analyzed_shuffled else ("t.processed_at", "random()")
    conn.execute(LOAD_FENCES.format(layout=analyzed_layout), {"rows": 2000, "expired_share": 0.5, "now": now})
    conn.execute("ANALYZE core.processed_jobs")
    conn.execute("DELETE FROM core.processed_jobs")
    conn.execute(LOAD_FENCES.format(layout=layout), {"rows": 3000, "expired_share": expired_share, "now": now})
    stale = conn.execute(
        "SELECT correlation FROM pg_stats WHERE schemaname = 'core' AND tablename = 'processed_jobs'"
        " AND attname = 'expires_at'"
    ).fetchone()[0]
    assert abs(stale) < 0.1 if analyzed_shuffled else stale > 0.9
    result = purger(db, purge_strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.num_deleted) == (strategy, round(3000 * expired_share))
    assert chosen["correlation"] > 0.9 if analyzed_shuffled else abs(chosen["correlation"]) < 0.1
