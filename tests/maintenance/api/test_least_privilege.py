"""The API's database role core_jobs_api can do what its endpoints need and nothing more (issue 11, migration 0009)."""

from __future__ import annotations

import secrets
import uuid

import psycopg
import pytest
from psycopg import sql
from support.factories import QUEUE, add_dead_letters, add_execution

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
    from maintenance.operations import dead_letters as operations

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
    from maintenance.operations import executions as execution_views

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


# What a replay publishes, copied from the dead letter (maintenance.operations.dead_letters.replay); each forgery
# below changes one thing of it, or publishes without marking the letter replayed first.
MARK_REPLAYED = "UPDATE core.dead_letters SET status = 'replayed' WHERE id = {letter}"
COPY_OF_LETTER = """
INSERT INTO core.queue_messages (queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent,
                                 tracestate)
SELECT {queue}, {job_id}, coalesce(tenant_id, '00000000-0000-0000-0000-000000000000'), correlation_id, {payload},
       {replay_of}, {traceparent}, {tracestate}
  FROM core.dead_letters WHERE id = {{letter}}"""
AS_REPLAYED = {
    "queue": "queue",
    "job_id": "job_id",
    "payload": "payload",
    "replay_of": "id",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
}


def copy_of_letter(**changes: str) -> str:
    """The replay's message of letter ``{letter}`` with ``changes`` (column: SQL expression)."""
    return COPY_OF_LETTER.format(**(AS_REPLAYED | changes))


@pytest.mark.parametrize(
    "statements",
    [
        [
            "INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload)"
            " VALUES ('points.credit', gen_random_uuid(), gen_random_uuid(), '{{\"points\": 1000000}}')"
        ],
        [MARK_REPLAYED, copy_of_letter(payload="'{{\"points\": 1000000}}'")],
        [MARK_REPLAYED, copy_of_letter(queue="'points.bonus'")],
        [MARK_REPLAYED, copy_of_letter(job_id="gen_random_uuid()")],
        [MARK_REPLAYED, copy_of_letter(replay_of="{other}")],
        [MARK_REPLAYED, copy_of_letter(replay_of="NULL")],
        [copy_of_letter()],
        [MARK_REPLAYED, copy_of_letter(), copy_of_letter()],
        [copy_of_letter().replace("{letter}", "{other}")],
        [MARK_REPLAYED, copy_of_letter(traceparent="'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'")],
    ],
    ids=[
        "new-job",
        "other-payload",
        "other-queue",
        "other-job-id",
        "replay-of-unrelated-letter",
        "no-replay-of",
        "letter-not-marked",
        "twice-for-one-letter",
        "letter-replayed-earlier",
        "into-another-trace",
    ],
)
def test_the_api_role_publishes_only_the_replay_of_a_letter_it_marks_replayed(as_api_role, conn, statements):
    """Each forged message — a new job, another payload, queue, job id or trace, a replay_of of another letter, a copy — is refused."""
    from maintenance.operations import dead_letters as operations

    letter, other = add_dead_letters(conn, QUEUE, 2, payload={"points": 1})
    operations.replay(conn, [other], operator="ops:earlier")
    with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api publishes"), as_api_role.transaction():
        for statement in statements:
            as_api_role.execute(statement.format(letter=letter, other=other))
    assert conn.execute("SELECT replay_of, payload->>'points' FROM core.queue_messages").fetchall() == [(other, "1")]


def test_the_api_roles_batch_publish_is_refused_whole_for_one_forged_message(as_api_role, conn):
    """PgQueue.publish_many (what a replay uses) as the API role: true replays plus one new job are refused together; alone they pass."""
    from harness.queue.pgqueue import PgQueue
    from harness.queue.port import NO_TENANT, Envelope

    letters = add_dead_letters(conn, QUEUE, 2, payload={"points": 1})
    replays = [
        (
            QUEUE,
            Envelope(
                job_id=job_id,
                payload={"points": 1},
                tenant_id=tenant_id or NO_TENANT,
                correlation_id=correlation_id,
                replay_of=letter,
            ),
        )
        for letter, job_id, tenant_id, correlation_id in conn.execute(
            "SELECT id, job_id, tenant_id, correlation_id FROM core.dead_letters WHERE id = ANY (%s) ORDER BY id",
            (letters,),
        )
    ]
    forged = (QUEUE, Envelope(job_id=uuid.uuid4(), payload={"points": 1000000}))
    with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api publishes"), as_api_role.transaction():
        for letter in letters:
            as_api_role.execute(MARK_REPLAYED.format(letter=letter))
        PgQueue(as_api_role).publish_many([*replays, forged])
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)

    with as_api_role.transaction():
        for letter in letters:
            as_api_role.execute(MARK_REPLAYED.format(letter=letter))
        PgQueue(as_api_role).publish_many(replays)
    assert [r[0] for r in conn.execute("SELECT replay_of FROM core.queue_messages ORDER BY id")] == letters


# A letter whose job was published in a trace (0017): its replay must carry exactly this context.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "vendor=opaque,other=1"
# Each forgery changes one part of the trace context and nothing else.
TRACE_FORGERIES = {
    "other-tracestate": {"tracestate": "'vendor=chosen'"},
    "tracestate-dropped": {"tracestate": "NULL"},
    "other-trace-id": {"traceparent": "'00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01'"},
    "only-the-flags-byte": {"traceparent": "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'"},
    "trace-context-dropped": {"traceparent": "NULL", "tracestate": "NULL"},
}


def traced_letter(conn: psycopg.Connection) -> int:
    """One pending dead letter of ``QUEUE`` whose job carried TRACEPARENT and TRACESTATE; its id."""
    (letter,) = add_dead_letters(conn, QUEUE, 1, payload={"points": 1}, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    return letter


@pytest.mark.parametrize("changes", TRACE_FORGERIES.values(), ids=TRACE_FORGERIES.keys())
def test_the_api_role_replays_a_traced_letter_only_into_its_own_trace_context(as_api_role, conn, changes):
    """A replay of a letter with a traceparent and tracestate whose message carries another tracestate, none, another trace id or only another flags byte is refused."""
    letter = traced_letter(conn)
    with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api publishes"), as_api_role.transaction():
        as_api_role.execute(MARK_REPLAYED.format(letter=letter))
        as_api_role.execute(copy_of_letter(**changes).format(letter=letter))
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)


def test_the_api_role_replays_a_traced_letter_with_its_exact_trace_context(as_api_role, conn):
    """The exact copy of a letter with a traceparent and tracestate is accepted, and the message carries both."""
    letter = traced_letter(conn)
    with as_api_role.transaction():
        as_api_role.execute(MARK_REPLAYED.format(letter=letter))
        as_api_role.execute(copy_of_letter().format(letter=letter))
    assert conn.execute("SELECT replay_of, traceparent, tracestate FROM core.queue_messages").fetchall() == [
        (letter, TRACEPARENT, TRACESTATE)
    ]


def test_the_api_role_replays_one_letter_or_a_whole_queue(as_api_role, conn):
    """A replay by ids and a bulk replay of a queue, each inside an outer transaction as the API runs them, publish."""
    from maintenance.operations import dead_letters as operations

    by_id, *of_queue = add_dead_letters(conn, QUEUE, 4)
    with as_api_role.transaction():
        operations.replay(as_api_role, [by_id], operator="ops:ana")
    with as_api_role.transaction():
        operations.replay(as_api_role, queue=QUEUE, operator="ops:ana", max_rows=10)
    assert [r[0] for r in conn.execute("SELECT replay_of FROM core.queue_messages ORDER BY replay_of")] == [
        by_id,
        *of_queue,
    ]


def test_the_api_role_publishes_only_what_a_resolution_in_the_same_transaction_requeues(as_api_role, conn):
    """A copy of a resumed execution's job outside its resolution, or with another payload, is refused."""
    from support.factories import resolve_execution

    execution = add_execution(conn)
    resolve_execution(conn, execution)  # RESUME, by the owner: PENDING with its message queued
    copy = """
    INSERT INTO core.queue_messages (queue, job_id, tenant_id, correlation_id, payload)
    SELECT queue, job_id, tenant_id, correlation_id, {payload} FROM core.executions WHERE id = %s"""
    for payload in ("payload", "'{\"points\": 1000000}'"):
        with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api publishes"):
            as_api_role.execute(copy.format(payload=payload), (execution,))
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0] == 1


def test_the_publish_guard_finds_a_resumed_execution_by_its_job_not_by_walking_the_pending_ones(as_api_role, conn):
    """With 300 executions PENDING that the last ANALYZE never saw, a RESUME's guard reads none of them through the status index."""
    from support.factories import resolve_execution

    execution = add_execution(conn)
    many = """
    INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload, status, reason)
    SELECT gen_random_uuid(), 'points.ledger', 'points.ledger', gen_random_uuid(), '{}', %s, %s
      FROM generate_series(1, %s)"""
    conn.execute("SET session_replication_role = replica")  # rows arranged in bulk, past the status machine
    conn.execute(many, ("RECONCILIATION_REQUIRED", "notify: uncertain", 5000))  # others awaiting an operator
    conn.execute("ANALYZE core.executions")  # statistics that saw no PENDING execution, as between a worker's takes
    conn.execute(many, ("PENDING", None, 300))  # then 300 resumed jobs a stopped worker has not taken yet
    conn.execute("RESET session_replication_role")
    with as_api_role.transaction():
        resolve_execution(as_api_role, execution)
        (read,) = as_api_role.execute(
            "SELECT pg_stat_get_xact_tuples_returned('core.executions_status_idx'::regclass)"  # this transaction's
        ).fetchone()
    assert read == 0
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (1,)


@pytest.mark.parametrize("changes", [{}, *TRACE_FORGERIES.values()], ids=["exact", *TRACE_FORGERIES.keys()])
def test_the_api_role_requeues_a_resumed_replay_only_into_its_held_letters_trace_context(
    as_api_role, conn, monkeypatch, changes
):
    """A RESUME, as the API role, of an execution holding a traced letter's replay: its re-queue carrying the letter's traceparent and tracestate is accepted; with another tracestate, none, another trace id or only another flags byte it is refused."""
    from support.factories import resolve_execution

    from maintenance.operations import resolution

    execution = add_execution(conn)
    (job_id,) = conn.execute("SELECT job_id FROM core.executions WHERE id = %s", (execution,)).fetchone()
    (letter,) = add_dead_letters(conn, QUEUE, 1, job_id=job_id, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter,))  # the replay it holds
    requeue = resolution.REQUEUE_JOB
    for column, forged in changes.items():
        requeue = requeue.replace(f"held.{column},", f"{forged},", 1)
    assert requeue != resolution.REQUEUE_JOB or not changes, "each forgery changes the re-queue"
    monkeypatch.setattr(resolution, "REQUEUE_JOB", requeue)

    if changes:
        with pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api publishes"):
            resolve_execution(as_api_role, execution)
        assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)
    else:
        resolve_execution(as_api_role, execution)
        assert conn.execute("SELECT replay_of, traceparent, tracestate FROM core.queue_messages").fetchall() == [
            (letter, TRACEPARENT, TRACESTATE)
        ]


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload)"
        " VALUES ('points.credit', gen_random_uuid(), gen_random_uuid(), '{{\"points\": 1000000}}')",
        "UPDATE core.executions SET run_at = now() + interval '1 day' WHERE id = {execution}",
    ],
    ids=["publish-new-job", "reschedule-uncertain-execution"],
)
def test_a_login_that_inherits_the_api_role_is_bound_like_the_role(login_role, conn, statement):
    """Without SET ROLE a login granted core_jobs_api uses its grants as itself: the database's guards bind it too."""
    execution = add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    with (
        psycopg.connect(login_role("IN ROLE core_jobs_api"), autocommit=True) as login,
        pytest.raises(psycopg.errors.CheckViolation, match="core_jobs_api"),
    ):
        login.execute(statement.format(execution=execution))


def test_the_api_role_resumes_under_a_recording_span_and_its_requeue_starts_no_trace_of_its_own(
    spans, as_api_role, conn
):
    """A RESUME as the API role inside a recording span (the API's request) publishes its re-queue, which holds no replay, with no trace context: the guard accepts it and no publish span is recorded."""
    from support.factories import resolve_execution

    from harness import tracing

    execution = add_execution(conn)
    with tracing.span("POST /v1/core/executions/{id}/resolve"):
        resolve_execution(as_api_role, execution)
    assert conn.execute("SELECT replay_of, traceparent, tracestate FROM core.queue_messages").fetchall() == [
        (None, None, None)
    ]
    assert not [s for s in spans.get_finished_spans() if s.name.endswith(" publish")]
