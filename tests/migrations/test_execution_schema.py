"""What the database itself guarantees about executions (migration 0010), whoever writes: the state
machine, the fencing token, SUCCEEDED checkpoints, and that nothing unresolved can be deleted."""

from __future__ import annotations

import psycopg
import pytest
from support.factories import add_execution

SUCCEEDED_LOOKUP = (("lookup", "READ_ONLY", "SUCCEEDED", {"member_id": "m-1", "tier": "gold"}),)
NEW_TOKEN = "fencing_token = nextval('core.execution_fencing_seq')"
LEASE = "lease_expires_at = now() + interval '30 seconds'"
NO_LEASE = "lease_expires_at = NULL"


def status_of(conn: psycopg.Connection, execution_id: int) -> tuple[str, int]:
    row = conn.execute("SELECT status, fencing_token FROM core.executions WHERE id = %s", (execution_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_an_execution_must_start_pending(conn):
    """An execution inserted in any other state is refused."""
    with pytest.raises(psycopg.errors.CheckViolation, match="must start PENDING"):
        conn.execute(
            "INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload, status, lease_expires_at)"
            " VALUES (gen_random_uuid(), 'c', 'q', gen_random_uuid(), '{}', 'RUNNING', now() + interval '1 minute')"
        )
    assert conn.execute("SELECT count(*) FROM core.executions").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("start", "target", "assignments"),
    [
        ("PENDING", "RECONCILIATION_REQUIRED", f"reason = 'x', {NO_LEASE}"),
        ("PENDING", "FAILED", f"reason = 'x', {NO_LEASE}"),
        ("RETRY_WAIT", "FAILED", f"reason = 'x', {NO_LEASE}"),
        ("RETRY_WAIT", "RECONCILIATION_REQUIRED", f"reason = 'x', {NO_LEASE}"),
        ("FAILED", "RUNNING", f"{NEW_TOKEN}, {LEASE}"),
        ("FAILED", "RETRY_WAIT", NO_LEASE),
    ],
)
def test_moves_outside_the_state_machine_are_refused(conn, start, target, assignments):
    """Only the transitions of migration 0010 are allowed: e.g. no PENDING -> FAILED, no FAILED -> RUNNING."""
    execution_id = add_execution(conn, status=start)
    before = status_of(conn, execution_id)
    with pytest.raises(psycopg.errors.CheckViolation, match=f"cannot move from {start} to {target}"):
        conn.execute(
            f"UPDATE core.executions SET status = %s, {assignments} WHERE id = %s",
            (target, execution_id),
        )
    assert status_of(conn, execution_id) == before


@pytest.mark.parametrize("start", ["PENDING", "RETRY_WAIT"])
def test_a_take_must_draw_a_new_fencing_token(conn, start):
    """A take (PENDING or RETRY_WAIT -> RUNNING) that keeps the old token is refused.

    (RUNNING -> RUNNING with the same token is the holder renewing its lease; a take-over is one
    with a new token, which every later write of the old holder then fails to match.)
    """
    execution_id = add_execution(conn, status=start)
    before = status_of(conn, execution_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="new fencing token"):
        conn.execute(f"UPDATE core.executions SET status = 'RUNNING', {LEASE} WHERE id = %s", (execution_id,))
    assert status_of(conn, execution_id) == before


def test_the_fencing_token_never_goes_back(conn):
    """Writing an older fencing token — what a stale worker would hold — is refused."""
    execution_id = add_execution(conn, status="RUNNING")
    _, token = status_of(conn, execution_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="may not go back"):
        conn.execute("UPDATE core.executions SET fencing_token = %s WHERE id = %s", (token - 1, execution_id))
    assert status_of(conn, execution_id) == ("RUNNING", token)


@pytest.mark.parametrize(
    ("column", "value"),
    [("payload", '{"member_id": "m-2", "points": 999}'), ("job_id", "00000000-0000-4000-8000-000000000001")],
)
def test_the_business_data_of_an_execution_never_changes(conn, column, value):
    """An execution keeps its job's payload and identity: rewriting them is refused."""
    execution_id = add_execution(conn, status="RETRY_WAIT")
    with pytest.raises(psycopg.errors.CheckViolation, match="only its state, lease, schedule and reason"):
        conn.execute(f"UPDATE core.executions SET {column} = %s WHERE id = %s", (value, execution_id))


def test_a_running_execution_needs_a_lease_and_no_other_has_one(conn):
    """RUNNING without a lease, or RETRY_WAIT with one, breaks executions_lease_while_running."""
    running = add_execution(conn, status="RUNNING")
    waiting = add_execution(conn, status="RETRY_WAIT")
    with pytest.raises(psycopg.errors.CheckViolation, match="executions_lease_while_running"):
        conn.execute(f"UPDATE core.executions SET {NO_LEASE} WHERE id = %s", (running,))
    with pytest.raises(psycopg.errors.CheckViolation, match="executions_lease_while_running"):
        conn.execute(f"UPDATE core.executions SET {LEASE} WHERE id = %s", (waiting,))


@pytest.mark.parametrize("status", ["PENDING", "RETRY_WAIT", "RECONCILIATION_REQUIRED"])
def test_only_a_running_or_failed_execution_can_be_deleted(conn, status):
    """Deleting a PENDING, RETRY_WAIT or RECONCILIATION_REQUIRED execution would lose a job: refused."""
    execution_id = add_execution(conn, status=status)
    with pytest.raises(psycopg.errors.CheckViolation, match="may be deleted"):
        conn.execute("DELETE FROM core.executions WHERE id = %s", (execution_id,))
    assert status_of(conn, execution_id)[0] == status


def test_deleting_a_success_takes_its_checkpoints_and_history_along(conn):
    """The final transaction's delete of a RUNNING execution leaves no checkpoint or event behind (J-AC8)."""
    execution_id = add_execution(conn, status="RUNNING", checkpoints=SUCCEEDED_LOOKUP)
    conn.execute(
        "INSERT INTO core.execution_events (execution_id, kind, fencing_token, detail)"
        " SELECT id, 'TAKEN_OVER', fencing_token, 'test' FROM core.executions WHERE id = %s",
        (execution_id,),
    )
    conn.execute("DELETE FROM core.executions WHERE id = %s", (execution_id,))
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM core.execution_checkpoints), (SELECT count(*) FROM core.execution_events)"
    ).fetchone()
    assert counts == (0, 0)


@pytest.mark.parametrize("table", ["core.executions", "core.execution_checkpoints"])
def test_executions_and_checkpoints_cannot_be_truncated(conn, table):
    """TRUNCATE would lose unresolved executions without a row trigger noticing: refused."""
    add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    with pytest.raises(psycopg.errors.CheckViolation, match="may not be truncated"):
        conn.execute(f"TRUNCATE {table} CASCADE")
    assert conn.execute("SELECT count(*) FROM core.execution_checkpoints").fetchone()[0] == 1


@pytest.mark.parametrize(
    "assignments",
    ['result = \'{"member_id": "m-9", "tier": "none"}\'', "status = 'FAILED', result = NULL"],
    ids=["another-result", "another-status"],
)
def test_a_succeeded_checkpoint_is_never_rewritten(conn, assignments):
    """A SUCCEEDED checkpoint keeps its status and result for ever (R-3), even against the owner."""
    execution_id = add_execution(conn, status="RUNNING", checkpoints=SUCCEEDED_LOOKUP)
    with pytest.raises(psycopg.errors.CheckViolation, match="never run again nor overwritten"):
        conn.execute(
            f"UPDATE core.execution_checkpoints SET {assignments} WHERE execution_id = %s",
            (execution_id,),
        )
    row = conn.execute(
        "SELECT status, result FROM core.execution_checkpoints WHERE execution_id = %s", (execution_id,)
    ).fetchone()
    assert row == ("SUCCEEDED", SUCCEEDED_LOOKUP[0][3])


def test_a_checkpoints_effect_class_is_fixed_once_written(conn):
    """Relabelling a NON_IDEMPOTENT_WRITE as IDEMPOTENT (to get it retried) is refused."""
    execution_id = add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    with pytest.raises(psycopg.errors.CheckViolation, match="action, position and effect never change"):
        conn.execute(
            "UPDATE core.execution_checkpoints SET effect = 'IDEMPOTENT_WRITE' WHERE execution_id = %s",
            (execution_id,),
        )


def test_the_checkpoints_of_an_unresolved_execution_cannot_be_deleted(conn):
    """While RECONCILIATION_REQUIRED, the evidence of the uncertain write stays: deleting it is refused."""
    execution_id = add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    with pytest.raises(psycopg.errors.CheckViolation, match="while it is RECONCILIATION_REQUIRED"):
        conn.execute("DELETE FROM core.execution_checkpoints WHERE execution_id = %s", (execution_id,))


def test_history_events_never_change(conn):
    """An execution's history is written once: UPDATE of an event is refused."""
    execution_id = add_execution(conn, status="RETRY_WAIT", reason_action=None)
    conn.execute(
        "INSERT INTO core.execution_events (execution_id, kind, fencing_token, run_at, detail)"
        " SELECT id, 'RETRY_SCHEDULED', fencing_token, now(), 'test' FROM core.executions WHERE id = %s",
        (execution_id,),
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="never change"):
        conn.execute("UPDATE core.execution_events SET detail = 'rewritten'")
