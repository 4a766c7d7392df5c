"""The purge of durable executions: which it keeps while their fences are needed, which it deletes.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

import psycopg
import pytest
from support.factories import CONSUMER, add_dead_letter, add_dead_letters, add_execution, mark_handled
from support.purge_support import (
    BOTH_PATHS,
    PROTECTED,
    REPLAY_GUARDS,
    SECOND,
    TTL,
    add_old_expired_fences,
    executions,
    handled_at,
    purger,
    remaining,
)


@BOTH_PATHS
@REPLAY_GUARDS
def test_keeps_a_fence_while_its_job_and_consumer_has_an_execution_not_failed(
    db, conn, now, hashed_pending_limit, strategy
):
    """PENDING, RUNNING, RETRY_WAIT and RECONCILIATION_REQUIRED executions hold their fence; FAILED, or another consumer's, do not."""
    pending, running, waiting, uncertain, failed, elsewhere = add_old_expired_fences(conn, now, 6)
    for job_id, status in ((pending, "PENDING"), (running, "RUNNING"), (waiting, "RETRY_WAIT")):
        add_execution(conn, job_id=job_id, consumer=CONSUMER, status=status)
    add_execution(conn, job_id=uncertain, consumer=CONSUMER)
    add_execution(conn, job_id=failed, consumer=CONSUMER, status="FAILED")
    add_execution(conn, job_id=elsewhere, consumer="points.other")  # same job, another consumer's execution
    result = purger(db, hashed_pending_limit=hashed_pending_limit, purge_strategy=strategy).run_once(now)
    assert remaining(conn) == {pending, running, waiting, uncertain}
    assert (result.num_deleted, result.rows_left) == (2, 0)


def test_deletes_failed_executions_nothing_needs_once_a_fence_ttl_old(db, conn, now):
    """FAILED more than the fence TTL ago with no dead letter holding a fence: deleted with its checkpoints; the rest kept."""
    old = f"{TTL.days} days 1 minute"
    ids = {
        name: add_execution(conn, status="FAILED", age=age, consumer=CONSUMER, checkpoints=checkpoints)
        for name, age, checkpoints in (
            ("old", old, (("lookup", "READ_ONLY", "SUCCEEDED", {"m": 1}),)),
            ("young", f"{TTL.days - 1} days 23 hours", ()),
            ("pending_letter", old, ()),
            ("outstanding_replay", old, ()),
            ("discarded_letter", old, ()),
            ("other_consumers_letter", old, ()),
        )
    }
    job = dict(conn.execute("SELECT id, job_id FROM core.executions").fetchall())
    add_dead_letter(conn, job_id=job[ids["pending_letter"]])
    add_dead_letter(conn, job_id=job[ids["outstanding_replay"]], status="replayed")
    add_dead_letter(conn, job_id=job[ids["discarded_letter"]], status="discarded")
    add_dead_letters(conn, "points.other", 1, job_id=job[ids["other_consumers_letter"]], consumer="points.other")
    uncertain = add_execution(conn, age=old)  # RECONCILIATION_REQUIRED: never deleted

    result = purger(db).run_once(now)

    kept = {ids["young"], ids["pending_letter"], ids["outstanding_replay"], uncertain}
    assert {r[0] for r in conn.execute("SELECT id FROM core.executions")} == kept
    assert result.executions_deleted == 3
    assert conn.execute("SELECT count(*) FROM core.execution_checkpoints").fetchone()[0] == 0
    assert purger(db).run_once(now).executions_deleted == 0


def test_failed_executions_are_deleted_in_batches(db, conn, now):
    """Batch size 2 and 5 deletable FAILED executions: three statements, all deleted."""
    for _ in range(5):
        add_execution(conn, status="FAILED", age=f"{TTL.days + 1} days")
    result = purger(db, purge_batch_size=2, purge_min_batch_size=1).run_once(now)
    assert result.executions_deleted == 5 and executions(conn) == {}


def test_the_database_refuses_to_delete_an_execution_awaiting_reconciliation(conn):
    """Whatever the statement, a RECONCILIATION_REQUIRED execution cannot be deleted."""
    uncertain = add_execution(conn, age="400 days")
    with pytest.raises(psycopg.errors.CheckViolation, match="only a RUNNING execution"):
        conn.execute("DELETE FROM core.executions WHERE id = %s", (uncertain,))


def test_a_failed_execution_is_kept_a_window_after_its_replay_was_handled(db, conn, now):
    """Its dead letter's replay handled less than margin x window ago keeps it; a second later than that, it goes."""
    failed = add_execution(conn, status="FAILED", age=f"{TTL.days + 1} days", consumer=CONSUMER)
    (job_id,) = conn.execute("SELECT job_id FROM core.executions WHERE id = %s", (failed,)).fetchone()
    letter = add_dead_letter(conn, job_id=job_id, status="replayed")
    assert mark_handled(conn, letter, "dead_lettered")
    handled = handled_at(conn, job_id)
    assert purger(db).run_once(handled + PROTECTED - SECOND).executions_deleted == 0
    assert purger(db).run_once(handled + PROTECTED + SECOND).executions_deleted == 1
    assert executions(conn) == {}
