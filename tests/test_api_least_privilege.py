"""The API's database role core_jobs_api can do what its endpoints need and nothing more (issue 11, migration 0009)."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from factories import QUEUE, add_dead_letters, add_execution
from psycopg import sql

from maintenance.runtime import migrate

ROLE = "core_jobs_api"


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM core.dead_letters WHERE id = {id}",
        "TRUNCATE core.dead_letters",
        "UPDATE core.dead_letters SET payload = '{{\"points\": 1000000}}' WHERE id = {id}",
        "UPDATE core.dead_letters SET queue = 'elsewhere' WHERE id = {id}",
        "SELECT count(*) FROM core.processed_jobs",
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)"
        " VALUES (gen_random_uuid(), 'c', gen_random_uuid(), now() + interval '1 day')",
        "DELETE FROM core.processed_jobs",
        "UPDATE core.processed_jobs SET expires_at = now()",
        "INSERT INTO core.dead_letter_actions (dead_letter_id, action, operator) VALUES ({id}, 'replayed', 'forged')",
        "SELECT payload FROM core.queue_messages",
        "DELETE FROM core.queue_messages",
        "DELETE FROM core.api_idempotency_keys",
        "INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error)"
        " VALUES (gen_random_uuid(), 'q', '{{}}', 1, 'e')",
    ],
    ids=[
        "delete-dead-letter",
        "truncate-dead-letters",
        "change-payload",
        "change-queue",
        "read-fences",
        "write-fence",
        "delete-fences",
        "update-fences",
        "forge-audit-row",
        "read-queue-payloads",
        "delete-queue-messages",
        "delete-idempotency-keys",
        "insert-dead-letter",
    ],
)
def test_the_api_role_is_refused_everything_its_endpoints_do_not_need(as_api_role, conn, statement):
    """Deleting a dead letter, changing a payload, touching processed_jobs, forging the audit: permission denied."""
    letter = add_dead_letters(conn, QUEUE, 1, payload={"points": 1})[0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_api_role.execute(statement.format(id=letter))
    assert conn.execute("SELECT payload->>'points', queue FROM core.dead_letters").fetchall() == [
        ("1", "points.credit")
    ]


def test_the_api_role_can_do_what_the_endpoints_do(as_api_role, conn):
    """Read, replay (status + a queue message), discard with a reason; the trigger audits both under the operator."""
    from harness import operations

    replayed, discarded = add_dead_letters(conn, QUEUE, 2)
    operations.replay(as_api_role, [replayed], operator="ops:ana")
    operations.discard(as_api_role, [discarded], operator="ops:ana", reason="dup")
    assert operations.get_dead_letter(as_api_role, replayed).actions[0].operator == "ops:ana"
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0] == 1
    assert [r[0] for r in conn.execute("SELECT action FROM core.dead_letter_actions ORDER BY id")] == [
        "replayed",
        "discarded",
    ]


def test_the_api_role_cannot_log_in(conn):
    """core_jobs_api is NOLOGIN: it is granted to a login, never used as one."""
    assert conn.execute("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone() == (
        False,
        False,
    )


def test_a_downgrade_keeps_the_role_while_another_database_still_uses_it(empty_database_url, conn):
    """Roles are cluster-wide: going down to base here leaves the role that other databases grant (this test's own)."""
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")
    assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone()[0] == 1
    with psycopg.connect(empty_database_url) as down:
        assert down.execute("SELECT has_schema_privilege(%s, 'core', 'USAGE')", (ROLE,)).fetchone()[0] is False


def test_the_role_is_dropped_when_no_database_uses_it_any_more(conn):
    """The downgrade's drop statement removes an unused role and keeps a used one (on a role of this test's own)."""
    from importlib import import_module

    drop = import_module("migrations.versions.0009_operations_api").DROP_ROLE_IF_UNUSED
    role = f"core_jobs_api_test_{secrets.token_hex(4)}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    conn.execute(sql.SQL("GRANT SELECT ON core.dead_letters TO {}").format(sql.Identifier(role)))
    conn.execute(drop.format(role=role))
    assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0] == 1
    conn.execute(sql.SQL("REVOKE ALL ON core.dead_letters FROM {}").format(sql.Identifier(role)))
    conn.execute(drop.format(role=role))
    assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0] == 0


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.executions SET status = 'PENDING' WHERE id = {id}",
        "UPDATE core.executions SET payload = '{{\"points\": 1000000}}' WHERE id = {id}",
        "DELETE FROM core.executions WHERE id = {id}",
        "INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload)"
        " VALUES (gen_random_uuid(), 'c', 'q', gen_random_uuid(), '{{}}')",
        "UPDATE core.execution_checkpoints SET status = 'SUCCEEDED', result = '{{}}' WHERE execution_id = {id}",
        "DELETE FROM core.execution_checkpoints WHERE execution_id = {id}",
        "INSERT INTO core.execution_events (execution_id, kind, fencing_token) VALUES ({id}, 'FAILED', 1)",
    ],
    ids=[
        "release-execution",
        "change-execution-payload",
        "delete-execution",
        "insert-execution",
        "forge-checkpoint",
        "delete-checkpoint",
        "forge-event",
    ],
)
def test_the_api_role_may_only_read_executions(as_api_role, conn, statement):
    """Outside a resolution the API role cannot move, change, add or delete an execution or its rows.

    Refused by a grant, or — for the columns a resolution writes (0012) — by the database's guard
    of the API role, which allows them only in a resolution recorded in the ledger.
    """
    execution = add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)):
        as_api_role.execute(statement.format(id=execution))
    assert conn.execute("SELECT status, payload->>'points' FROM core.executions").fetchall() == [
        ("RECONCILIATION_REQUIRED", "10")
    ]
    assert conn.execute("SELECT status FROM core.execution_checkpoints").fetchall() == [("UNCERTAIN",)]


def test_the_api_role_can_read_what_the_execution_endpoints_show(as_api_role, conn):
    """A page and a detail with its checkpoints and history, read as core_jobs_api (0010's grants)."""
    from harness import execution_views

    execution = add_execution(
        conn,
        checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),),
        events=(("RECONCILIATION_REQUIRED", "notify"),),
    )
    assert [r.id for r in execution_views.list_executions(as_api_role).rows] == [execution]
    detail = execution_views.get_execution(as_api_role, execution)
    assert detail is not None
    assert [c.action for c in detail.checkpoints] == ["notify"]
    assert [e.kind for e in detail.events] == ["RECONCILIATION_REQUIRED"]
