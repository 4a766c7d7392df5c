"""The worker's and the relay's roles (migration 0020) do what the harness's SQL needs and nothing more.

Each test runs as a deployment would: a login granted the role and nothing else, its connections
switched to the role by ``SET ROLE`` (``database_role``, ``CORE_JOBS_WORKER_DATABASE_ROLE``).
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from support.factories import QUEUE, add_dead_letters, dead_letter, publish
from support.harness_support import make_due, points, replay_state, run_worker, scalar
from support.ledger_support import PAYLOAD, execution, make_execution_due

from core_jobs_demo.ledger import Fault
from harness.consumer.consumer import Consumer
from harness.examples.points import CreditPoints, OutageLedger, make_consumer
from harness.examples.points import consumer as points_consumer
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.relay import RELAY_CONSUMER, Relay
from harness.worker import WorkerStats
from maintenance.cli import main
from maintenance.operations.dead_letters import replay

WORKER_ROLE = "core_jobs_worker"
RELAY_ROLE = "core_jobs_relay"
DEEP = "(repeat('[', 150) || repeat(']', 150))"  # valid jsonb Python cannot decode: the relay refuses it


@pytest.fixture
def worker_login(login_role) -> str:
    """A URL of this test's database as a login granted core_jobs_worker and nothing more."""
    return login_role(f"IN ROLE {WORKER_ROLE}")


@pytest.fixture
def relay_login(login_role) -> str:
    """A URL of this test's database as a login granted core_jobs_relay and nothing more."""
    return login_role(f"IN ROLE {RELAY_ROLE}")


def drain(url: str, consumer=points_consumer) -> WorkerStats:
    """``consumer`` run once over every ready message, its connections switched to core_jobs_worker."""
    return run_worker(url, consumer, database_role=WORKER_ROLE)


def test_the_worker_s_connections_run_as_its_role(conn, worker_login):
    """A handler's SQL runs as core_jobs_worker (SET ROLE), not as the login that connected."""
    seen: list[tuple[str, str]] = []
    whoami = Consumer(
        name="whoami",
        queue="whoami",
        payload_schema=CreditPoints,
        handler=lambda c, payload, ctx: seen.append(c.execute("SELECT current_user, session_user").fetchone()),
    )
    publish(conn, {"member_id": "m-1", "points": 5}, queue="whoami")
    assert drain(worker_login, whoami).processed == 1
    assert seen == [(WORKER_ROLE, conninfo_to_dict(worker_login)["user"])]


def test_the_worker_role_drains_the_reference_queue_for_a_plain_consumer(conn, worker_login):
    """Credits, a retry, a poison payload dead-lettered, a replay handled: all as core_jobs_worker, one effect each."""
    consumer = make_consumer(OutageLedger(timeouts={"m-4": 1}))
    publish(conn, {"member_id": "m-1", "points": 5})
    publish(conn, {"member_id": "m-1", "points": 7})
    publish(conn, {"member_id": "m-4", "points": 3})
    poison = publish(conn, {"member_id": "m-2", "points": "many"})
    letter, _ = dead_letter(conn, {"member_id": "m-3", "points": 2})
    replay(conn, [letter], operator="ops:ana")

    stats = drain(worker_login, consumer)
    assert (stats.processed, stats.retried, stats.dead_lettered) == (3, 1, 1)
    make_due(conn)
    assert drain(worker_login, consumer).processed == 1

    assert (points(conn, "m-1"), points(conn, "m-3"), points(conn, "m-4")) == (12, 2, 3)
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", (poison,)) == 1
    assert replay_state(conn, letter) == ("processed", True)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_the_worker_role_runs_a_durable_consumer_through_retry_and_success(conn, worker_login, ledger, ledger_consumer):
    """A 503 schedules a retry (queue and execution), the next run succeeds: the execution is gone, the fence written."""
    ledger.fail("credits", Fault.unavailable(retry_after="5"))
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    assert drain(worker_login, ledger_consumer).retried == 1
    assert execution(conn, job_id)["status"] == "RETRY_WAIT"
    make_due(conn)
    make_execution_due(conn, job_id)
    assert drain(worker_login, ledger_consumer).processed == 1
    assert execution(conn, job_id) is None
    assert scalar(conn, "SELECT count(*) FROM core.processed_jobs WHERE job_id = %s", (job_id,)) == 1
    assert points(conn, "m-7") == 25 and len(ledger.effects(endpoint="credits")) == 1


def test_the_worker_role_holds_an_execution_it_cannot_finish(conn, worker_login, ledger, ledger_consumer):
    """notify answered 503: RECONCILIATION_REQUIRED, its event appended, the message acked, as core_jobs_worker."""
    ledger.fail("notify", Fault.unavailable())
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    assert drain(worker_login, ledger_consumer).held == 1
    assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_core_jobs_worker_switches_to_its_role_by_default(conn, worker_login, clean_env):
    """`core-jobs worker --once` from a login granted only core_jobs_worker: the points are credited."""
    publish(conn, {"member_id": "m-1", "points": 5})
    clean_env.setenv("CORE_JOBS_DATABASE_URL", worker_login)
    assert main(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == 0
    assert points(conn, "m-1") == 5


def test_the_relay_role_relays_the_outbox_and_refuses_what_it_cannot_publish(conn, relay_login, relay_target):
    """A replay reaches the target, an undecodable row becomes the relay's dead letter ending its replay."""
    (sent,) = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1", "points": 5})
    (stuck,) = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-2", "points": 5})
    replay(conn, [sent, stuck], operator="ops:ana")
    conn.execute(f"UPDATE core.queue_messages SET payload = {DEEP}::jsonb WHERE replay_of = %s", (stuck,))

    with connect(relay_login, autocommit=True, role=RELAY_ROLE) as as_relay:
        result = Relay(PgQueue(as_relay), relay_target.port(), [QUEUE]).run_once()

    assert (result.published, result.refused) == (1, 1)
    assert [d.envelope.replay_of for d in relay_target.take(QUEUE)] == [sent]
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE consumer = %s", (RELAY_CONSUMER,)) == 1
    assert replay_state(conn, stuck) == ("dead_lettered", True)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


# What neither role may do: each statement refused with a permission error, nothing changed.
REFUSED_TO_BOTH = {
    "delete-dead-letter": "DELETE FROM core.dead_letters WHERE id = {id}",
    "review-dead-letter": "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'x' WHERE id = {id}",
    "change-payload": "UPDATE core.dead_letters SET payload = '{{}}' WHERE id = {id}",
    "truncate-dead-letters": "TRUNCATE core.dead_letters",
    "truncate-queue": "TRUNCATE core.queue_messages",
    "publish": "INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload)"
    " VALUES ('q', gen_random_uuid(), gen_random_uuid(), '{{}}')",
    "change-queue-payload": "UPDATE core.queue_messages SET payload = '{{}}'",
    "read-idempotency-ledger": "SELECT count(*) FROM core.api_idempotency_keys",
    "read-audit": "SELECT count(*) FROM core.dead_letter_actions",
    "forge-audit": "INSERT INTO core.dead_letter_actions (dead_letter_id, action, operator)"
    " VALUES ({id}, 'replayed', 'forged')",
    "read-alerts": "SELECT count(*) FROM core.dead_letter_alerts",
    "read-installation": "SELECT count(*) FROM core.installation",
    "delete-fences": "DELETE FROM core.processed_jobs",
    "update-fences": "UPDATE core.processed_jobs SET expires_at = now()",
    "ddl": "CREATE TABLE core.forged (id int)",
    "alter": "ALTER TABLE core.dead_letters DISABLE TRIGGER USER",
}
REFUSED_TO_THE_RELAY = {
    "read-fences": "SELECT count(*) FROM core.processed_jobs",
    "write-fence": "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)"
    " VALUES (gen_random_uuid(), 'c', gen_random_uuid(), now() + interval '1 day')",
    "read-executions": "SELECT count(*) FROM core.executions",
    "retry-message": "UPDATE core.queue_messages SET run_at = now(), last_error = 'x'",
    "example-table": "SELECT count(*) FROM example.loyalty_points",
}
REFUSED_TO_THE_WORKER = {
    # The release of a replay is an operator's: its audit row is not the worker's to write.
    "release-replay": "SELECT set_config('core_jobs.reason', 'never delivered', false);"
    " UPDATE core.dead_letters SET replay_outcome = 'released' WHERE id = {id}",
    "change-execution-payload": "UPDATE core.executions SET payload = '{{}}'",
    "resolve-execution": "INSERT INTO core.execution_resolutions DEFAULT VALUES",
    "forge-execution-history": "UPDATE core.execution_events SET detail = 'x'",
}


def refused_cases() -> list:
    cases = [
        pytest.param(role, sql, id=f"{role}-{name}")
        for name, sql in REFUSED_TO_BOTH.items()
        for role in ("worker", "relay")
    ]
    cases += [pytest.param("relay", sql, id=f"relay-{name}") for name, sql in REFUSED_TO_THE_RELAY.items()]
    cases += [pytest.param("worker", sql, id=f"worker-{name}") for name, sql in REFUSED_TO_THE_WORKER.items()]
    return cases


@pytest.mark.parametrize(("role", "statement"), refused_cases())
def test_the_roles_are_refused_what_their_work_does_not_need(conn, login_role, role, statement):
    """Deleting or reviewing a dead letter, truncating, publishing, reading the API's or the alerts' tables, DDL."""
    (letter,) = add_dead_letters(conn, QUEUE, 1, payload={"points": 1})
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter,))
    granted = WORKER_ROLE if role == "worker" else RELAY_ROLE
    with (
        connect(login_role(f"IN ROLE {granted}"), autocommit=True, role=granted) as as_role,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        as_role.execute(statement.format(id=letter))
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 1
    assert scalar(conn, "SELECT replay_outcome FROM core.dead_letters WHERE id = %s", (letter,)) is None


def test_a_login_that_is_not_a_member_cannot_switch_to_the_role(login_role):
    """A login granted nothing: the worker's connection fails at once with PostgreSQL's permission error."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        connect(login_role(), role=WORKER_ROLE)


@pytest.mark.parametrize("role", [WORKER_ROLE, RELAY_ROLE])
def test_the_roles_cannot_log_in(conn, role):
    """NOLOGIN, no superuser: each is granted to a login, never used as one."""
    row = conn.execute("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row == (False, False)


def test_a_downgrade_revokes_the_roles_grants_and_keeps_the_roles_other_databases_use(empty_database_url, conn):
    """Down to 0019 takes this database's grants away; the cluster-wide roles stay (this test's own database grants them)."""
    from maintenance.runtime import migrate

    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "0019_publish_guard_by_job")
    for role in (WORKER_ROLE, RELAY_ROLE):
        assert scalar(conn, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)) == 1
        with psycopg.connect(empty_database_url) as down:
            assert scalar(down, "SELECT has_schema_privilege(%s, 'core', 'USAGE')", (role,)) is False
            assert scalar(down, "SELECT has_table_privilege(%s, 'core.queue_messages', 'SELECT')", (role,)) is False
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as up:
        assert scalar(up, "SELECT has_table_privilege(%s, 'core.queue_messages', 'DELETE')", (WORKER_ROLE,)) is True
