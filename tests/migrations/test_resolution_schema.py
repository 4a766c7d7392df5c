"""What the database itself guarantees about resolutions (migration 0012): the ledger, the guard, the API role."""

from __future__ import annotations

import psycopg
import pytest
from support.factories import add_execution

from maintenance.operations import resolution as reconciliation
from maintenance.operations.resolution import Close, Evidence, Resume

UNCERTAIN = (("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),)
EVIDENCE = Evidence("RESULT_VERIFIED", "CASE-7", "seen in the provider's console")

# A ledger row for an execution, with a token of the test's choosing (what a resolution inserts first).
INSERT_LEDGER_ROW = """
INSERT INTO core.execution_resolutions
       (execution_id, job_id, consumer, business_scope, idempotency_key, operator, command, command_body,
        command_fingerprint, evidence_kind, evidence_reference, evidence_reason, checkpoints_before, fencing_token,
        status_after, response_status, response_body)
SELECT id, job_id, consumer, business_scope, 'k-' || %(token)s, 'ops:test', 'RESUME', '{}', 'f', 'RESULT_VERIFIED',
       'CASE-1', 'checked', '[]', %(token)s, 'PENDING', 200, '{}'
  FROM core.executions WHERE id = %(id)s"""


def published():
    from support.resolution_consumers import ledger_points

    return {ledger_points.name: ledger_points}


def resolve(conn, execution_id, command, key="k-1"):
    """``command`` applied by operator ops:ana of scope loyalty, with the tests' published definition."""
    return reconciliation.resolve(
        conn,
        execution_id=execution_id,
        idempotency_key=key,
        operator="ops:ana",
        command=command,
        consumers=published(),
        scopes=frozenset({"loyalty"}),
    )


def resume(conn, execution_id, evidence=EVIDENCE):
    return resolve(conn, execution_id, Resume(results=(("notify", {"message_id": "m-1"}),), evidence=evidence))


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.execution_resolutions SET operator = 'someone else'",
        "DELETE FROM core.execution_resolutions",
        "TRUNCATE core.execution_resolutions",
    ],
    ids=["update", "delete", "truncate"],
)
def test_the_resolution_ledger_is_append_only(conn, statement):
    """Even the owner cannot change, delete or truncate a recorded resolution."""
    resume(conn, add_execution(conn, checkpoints=UNCERTAIN))
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
        conn.execute(statement)
    assert conn.execute("SELECT count(*) FROM core.execution_resolutions").fetchone()[0] == 1


@pytest.mark.parametrize("target", ["PENDING", "FAILED"])
def test_no_one_releases_reconciliation_required_without_a_resolution_in_the_ledger(conn, target):
    """RECONCILIATION_REQUIRED -> PENDING/FAILED with a new token but no ledger row is refused, even to the owner."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    with pytest.raises(psycopg.errors.CheckViolation, match="only an operator's resolution"):
        conn.execute(
            "UPDATE core.executions SET status = %s, fencing_token = nextval('core.execution_fencing_seq'),"
            " reason = 'forced' WHERE id = %s",
            (target, execution_id),
        )


def test_a_ledger_row_releases_only_to_its_own_token_and_state(conn):
    """A resolution row for token T and PENDING allows exactly that move: not another token, not FAILED, not RUNNING."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    (token,) = conn.execute("SELECT nextval('core.execution_fencing_seq')").fetchone()
    conn.execute(INSERT_LEDGER_ROW, {"id": execution_id, "token": token})
    for status, with_token in (("PENDING", token + 1000), ("FAILED", token), ("RUNNING", token)):
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute(
                "UPDATE core.executions SET status = %s, fencing_token = %s, reason = 'x',"
                " lease_expires_at = CASE WHEN %s = 'RUNNING' THEN now() + interval '1 minute' END WHERE id = %s",
                (status, with_token, status, execution_id),
            )
    conn.execute(
        "UPDATE core.executions SET status = 'PENDING', fencing_token = %s WHERE id = %s", (token, execution_id)
    )
    assert conn.execute("SELECT status FROM core.executions WHERE id = %s", (execution_id,)).fetchone()[0] == "PENDING"


def test_the_api_role_can_resolve_with_its_own_grants(as_api_role, conn):
    """RESUME and CLOSE run as core_jobs_api: the ledger, checkpoints, state, event and queue are within its grants."""
    resumed = add_execution(conn, checkpoints=UNCERTAIN)
    closed = add_execution(conn, checkpoints=UNCERTAIN)
    assert resume(as_api_role, resumed).body["status"] == "PENDING"
    command = Close(evidence=Evidence("ABSENT_VERIFIED", "CASE-8", "the provider has no such message"))
    assert resolve(as_api_role, closed, command, key="k-2").body["status"] == "FAILED"
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0] == 1


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.executions SET payload = '{{\"points\": 1000000}}' WHERE id = {id}",
        "UPDATE core.executions SET business_scope = 'billing' WHERE id = {id}",
        "DELETE FROM core.executions WHERE id = {id}",
        "UPDATE core.execution_checkpoints SET action = 'other' WHERE execution_id = {id}",
        "UPDATE core.execution_checkpoints SET attempts = 0 WHERE execution_id = {id}",
        "DELETE FROM core.execution_events WHERE execution_id = {id}",
        "INSERT INTO core.execution_events (execution_id, kind, fencing_token, run_at)"
        " VALUES ({id}, 'RETRY_SCHEDULED', 1, now())",
        "UPDATE core.execution_resolutions SET operator = 'forged'",
        "DELETE FROM core.execution_resolutions",
        "INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload)"
        " VALUES (gen_random_uuid(), 'c', 'q', gen_random_uuid(), '{{}}')",
        "SELECT count(*) FROM core.processed_jobs",
        "INSERT INTO core.execution_events (execution_id, kind, fencing_token) VALUES ({id}, 'EXECUTION_RESOLVED', 1)",
    ],
    ids=[
        "change-payload",
        "change-scope",
        "delete-execution",
        "rename-checkpoint",
        "reset-attempts",
        "delete-history",
        "forge-retry-event",
        "rewrite-ledger",
        "delete-ledger",
        "insert-execution",
        "read-fences",
        "forge-resolved-event",
    ],
)
def test_the_api_role_cannot_do_what_a_resolution_does_not_need(as_api_role, conn, statement):
    """Beyond a resolution's writes the API role is refused: no payload, scope, history, ledger rewrite or fence."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_api_role.execute(statement.format(id=execution_id))


@pytest.mark.parametrize(
    "evidence, problem",
    [
        (Evidence("ABSENT_VERIFIED", "CASE-7", "checked"), "RESUME takes evidence RESULT_VERIFIED"),
        (Evidence("RESULT_VERIFIED", " ", "checked"), "reference must not be blank"),
        (Evidence("RESULT_VERIFIED", "CASE-7", "Bearer abcdefghijklmnopqrstu"), "reason looks like a Bearer"),
    ],
    ids=["wrong-kind", "blank-reference", "secret-reason"],
)
def test_a_caller_in_code_gets_the_evidence_rules_too(conn, evidence, problem):
    """resolve() itself refuses evidence the API's model would refuse, before touching the database."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    with pytest.raises(reconciliation.ResolutionRefused, match=problem):
        resume(conn, execution_id, evidence)
    assert conn.execute("SELECT status FROM core.executions WHERE id = %s", (execution_id,)).fetchone()[0] == (
        "RECONCILIATION_REQUIRED"
    )


@pytest.mark.parametrize(
    "status, statement",
    [
        ("FAILED", "UPDATE core.executions SET status = 'PENDING', reason = NULL WHERE id = {id}"),
        ("RUNNING", "UPDATE core.executions SET fencing_token = nextval('core.execution_fencing_seq') WHERE id = {id}"),
        ("RECONCILIATION_REQUIRED", "UPDATE core.executions SET run_at = now() + interval '1 day' WHERE id = {id}"),
        (
            "RECONCILIATION_REQUIRED",
            "UPDATE core.execution_checkpoints SET status = 'SUCCEEDED', result = '{{}}' WHERE execution_id = {id}",
        ),
        ("RUNNING", "UPDATE core.execution_checkpoints SET result = '{{}}' WHERE execution_id = {id}"),
        ("FAILED", "DELETE FROM core.execution_checkpoints WHERE execution_id = {id}"),
    ],
    ids=[
        "restart-failed",
        "fence-out-worker",
        "reschedule-uncertain",
        "forge-result",
        "touch-running-checkpoint",
        "delete-failed-checkpoints",
    ],
)
def test_the_api_role_writes_executions_only_within_a_resolution(as_api_role, conn, status, statement):
    """The columns a resolution may write cannot be written by the API role outside one: the guard refuses."""
    checkpoints = (("lookup", "READ_ONLY", "SUCCEEDED", {"member_id": "m-1"}),) + (
        UNCERTAIN if status == "RECONCILIATION_REQUIRED" else ()
    )
    execution_id = add_execution(conn, status=status, checkpoints=checkpoints, reason="credit: provider said no")
    with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api"):
        as_api_role.execute(statement.format(id=execution_id))


@pytest.mark.parametrize("to_status", ["FAILED", "STARTED"])
def test_an_uncertain_write_cannot_be_turned_into_one_the_worker_sends_again(as_api_role, conn, to_status):
    """Even within a ledger-backed release, an UNCERTAIN checkpoint may only become SUCCEEDED, never FAILED or STARTED (re-sent)."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    (token,) = conn.execute("SELECT nextval('core.execution_fencing_seq')").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="UNCERTAIN"), as_api_role.transaction():
        as_api_role.execute(INSERT_LEDGER_ROW, {"id": execution_id, "token": token})
        as_api_role.execute(
            "UPDATE core.execution_checkpoints SET status = %s, fencing_token = %s WHERE execution_id = %s",
            (to_status, token, execution_id),
        )
        as_api_role.execute(
            "UPDATE core.executions SET status = 'PENDING', fencing_token = %s WHERE id = %s", (token, execution_id)
        )
    assert conn.execute(
        "SELECT status FROM core.execution_checkpoints WHERE execution_id = %s", (execution_id,)
    ).fetchone() == ("UNCERTAIN",)


def test_only_a_resolution_records_the_result_of_an_uncertain_write(conn):
    """Without a ledger row of its new token, not even the owner may mark an UNCERTAIN checkpoint SUCCEEDED."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN)
    with pytest.raises(psycopg.errors.CheckViolation, match="UNCERTAIN"):
        conn.execute(
            "UPDATE core.execution_checkpoints SET status = 'SUCCEEDED', result = '{}',"
            " fencing_token = nextval('core.execution_fencing_seq') WHERE execution_id = %s",
            (execution_id,),
        )
