"""The rows tests arrange: fences, dead letters and queue messages — one factory each, used by every test file.

Two ways in, on purpose:

- **plain SQL** (:func:`add_fence`, :func:`add_fences`, :func:`add_dead_letter`, :func:`add_dead_letters`):
  rows placed at explicit times (PostgreSQL's clock, back-dated — no test sleeps), as a psql
  session or an older writer would leave them; for the jobs (purge, alerts, metrics) that read them;
- **the harness's own writers** (:func:`publish`, :func:`dead_letter`): a message or a dead
  letter exactly as a worker produces it (tenant, consumer, correlation id), for the harness tests.

Schema tests that try an illegal write keep their SQL inline: the statement is what they test.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness.dead_letters import DeadLetter, mark_replay_handled, write_dead_letter
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope

TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000aa")
QUEUE = "points.credit"
CONSUMER = "points.credit"
DEFAULT_ERROR = "ProviderUnavailable: HTTP 503 from loyalty ledger"

# `count` fences of one consumer and tenant; processed now() (of the inserting transaction) unless
# given, expiring 7 days after processing unless given. One job_id may be given for a single fence.
INSERT_FENCES = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT coalesce(%(job_id)s::uuid, gen_random_uuid()), %(consumer)s, %(tenant_id)s::uuid,
       coalesce(%(processed_at)s::timestamptz, now()),
       coalesce(%(expires_at)s::timestamptz, coalesce(%(processed_at)s::timestamptz, now()) + interval '7 days')
  FROM generate_series(1, %(count)s) AS g
 ORDER BY g
RETURNING job_id"""

# `count` pending dead letters of one queue, the first written at `created_at` (default: `age` and a
# second ago), each next one a second earlier; correlation ids corr-<queue>-<n>; consumer and tenant if given.
# Without the traceback column (as a schema before migration 0022 has it) unless one is given.
INSERT_DEAD_LETTERS = """
INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, traceback, correlation_id, created_at,
                               consumer, tenant_id, traceparent, tracestate)
SELECT coalesce(%(job_id)s::uuid, gen_random_uuid()), %(queue)s, %(payload)s, 5, %(error)s, %(traceback)s,
       'corr-' || %(queue)s || '-' || g,
       coalesce(%(created_at)s::timestamptz, now() - %(age)s::interval - interval '1 second')
         - (g - 1) * interval '1 second',
       %(consumer)s, %(tenant_id)s::uuid, %(traceparent)s, %(tracestate)s
  FROM generate_series(1, %(count)s) AS g
 ORDER BY g
RETURNING id"""

# Move a dead letter out of pending_review (the reason is what a discard requires).
SET_DEAD_LETTER_STATUS = "UPDATE core.dead_letters SET status = %s, discard_reason = %s WHERE id = %s"


def add_fences(
    conn: psycopg.Connection,
    consumer: str,
    count: int,
    processed_at: datetime | None = None,
    *,
    expires_at: datetime | None = None,
    tenant_id: uuid.UUID | str = TENANT,
    job_id: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """``count`` fences of ``consumer`` processed at ``processed_at`` (default now()), expiring 7 days later unless ``expires_at``; their job ids."""
    rows = conn.execute(
        INSERT_FENCES,
        {
            "job_id": job_id,
            "consumer": consumer,
            "tenant_id": tenant_id,
            "processed_at": processed_at,
            "expires_at": expires_at,
            "count": count,
        },
    )
    return [r[0] for r in rows.fetchall()]


def add_fence(
    conn: psycopg.Connection,
    *,
    processed_at: datetime | None = None,
    expires_at: datetime | None = None,
    consumer: str = CONSUMER,
    job_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """One fence of ``consumer`` (default the points consumer); its job id."""
    (fenced,) = add_fences(conn, consumer, 1, processed_at, expires_at=expires_at, job_id=job_id)
    return fenced


def add_dead_letters(
    conn: psycopg.Connection,
    queue: str,
    count: int,
    *,
    age: str = "1 hour",
    created_at: datetime | None = None,
    error: str = DEFAULT_ERROR,
    job_id: uuid.UUID | None = None,
    payload: Any = None,
    consumer: str | None = None,
    tenant_id: uuid.UUID | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    traceback: str | None = None,
) -> list[int]:
    """Insert ``count`` pending dead letters written ``age`` ago (or at ``created_at``), a second apart; their ids."""
    statement = INSERT_DEAD_LETTERS
    if traceback is None:  # the column left to its default: the statement also fits a schema from before 0022
        statement = statement.replace(" traceback,", "", 1).replace(" %(traceback)s,", "", 1)
    rows = conn.execute(
        statement,
        {
            "job_id": job_id,
            "queue": queue,
            "payload": Jsonb(payload or {}),
            "error": error,
            "created_at": created_at,
            "age": age,
            "count": count,
            "consumer": consumer,
            "tenant_id": tenant_id,
            "traceparent": traceparent,
            "tracestate": tracestate,
            "traceback": traceback,
        },
    )
    return [r[0] for r in rows.fetchall()]


def add_dead_letter(
    conn: psycopg.Connection,
    *,
    queue: str = QUEUE,
    status: str = "pending_review",
    handled: str | None = None,
    job_id: uuid.UUID | None = None,
    created_at: datetime | None = None,
    age: str = "1 hour",
    error: str = DEFAULT_ERROR,
) -> int:
    """One dead letter in ``status``; a replayed one is outstanding unless ``handled`` gives its delivery's outcome; its id."""
    (letter_id,) = add_dead_letters(conn, queue, 1, age=age, created_at=created_at, error=error, job_id=job_id)
    if status != "pending_review":
        conn.execute(
            SET_DEAD_LETTER_STATUS, (status, "duplicate, ticket OPS-1" if status == "discarded" else None, letter_id)
        )
    if handled is not None:
        assert mark_handled(conn, letter_id, handled)
    return letter_id


def mark_handled(conn: psycopg.Connection, letter_id: int, outcome: str) -> bool:
    """What the harness does when the replay of ``letter_id`` ends: its job's delivery, by its consumer, marks it."""
    job_id, consumer = conn.execute(
        "SELECT job_id, consumer FROM core.dead_letters WHERE id = %s", (letter_id,)
    ).fetchone()
    return mark_replay_handled(conn, letter_id, outcome, job_id=job_id, consumer=consumer or CONSUMER)


def publish(
    conn: psycopg.Connection,
    payload: Any,
    *,
    job_id: uuid.UUID | None = None,
    queue: str = QUEUE,
    correlation_id: str | None = None,
    delay: timedelta = timedelta(0),
) -> uuid.UUID:
    """A message on ``queue`` as the harness's queue publishes it (tenant :data:`TENANT`); its job id."""
    job_id = job_id or uuid.uuid4()
    envelope = Envelope(job_id=job_id, payload=payload, tenant_id=TENANT, correlation_id=correlation_id)
    PgQueue(conn).publish(queue, envelope, delay=delay)
    return job_id


def dead_letter(
    conn: psycopg.Connection,
    payload: Any,
    *,
    job_id: uuid.UUID | None = None,
    queue: str = QUEUE,
    error: str = "TransientError: ledger timeout",
) -> tuple[int, uuid.UUID]:
    """A pending dead letter of the points consumer, as the harness writes it; returns (id, job_id)."""
    job_id = job_id or uuid.uuid4()
    letter = DeadLetter(
        job_id=job_id,
        queue=queue,
        consumer=CONSUMER,
        payload=payload,
        attempts=5,
        last_error=error,
        tenant_id=TENANT,
        correlation_id=f"corr-{job_id.hex[:6]}",
    )
    return write_dead_letter(conn, letter), job_id


# An execution as the harness would leave it, walked through the transitions the database allows
# (migration 0010): inserted PENDING, taken (RUNNING), then moved to its final `status`.
INSERT_EXECUTION = """
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, correlation_id, payload, business_scope)
VALUES (%(job_id)s, %(consumer)s, %(queue)s, %(tenant_id)s, %(correlation_id)s, %(payload)s, %(business_scope)s)
RETURNING id"""

TAKE_EXECUTION = """
UPDATE core.executions
   SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),
       lease_expires_at = now() + interval '30 seconds', leased_by = 'factory', takes = takes + 1
 WHERE id = %(id)s"""

SETTLE_EXECUTION = """
UPDATE core.executions
   SET status = %(status)s, lease_expires_at = NULL, leased_by = NULL, reason = %(reason)s,
       reason_action = %(reason_action)s, run_at = now() + %(delay)s
 WHERE id = %(id)s"""

INSERT_CHECKPOINT = """
INSERT INTO core.execution_checkpoints
       (execution_id, action, position, effect, status, attempts, result, last_error, fencing_token, finished_at)
SELECT %(id)s, %(action)s, %(position)s, %(effect)s, %(status)s, %(attempts)s, %(result)s, %(error)s, e.fencing_token,
       CASE WHEN %(status)s = 'STARTED' THEN NULL ELSE now() END
  FROM core.executions AS e WHERE e.id = %(id)s"""

# One entry of an execution's history, under its current token; a RETRY_SCHEDULED one runs 4 s from now.
INSERT_EXECUTION_EVENT = """
INSERT INTO core.execution_events (execution_id, kind, action, attempt, fencing_token, run_at, detail)
SELECT e.id, %(kind)s, %(action)s, 1, e.fencing_token,
       CASE WHEN %(kind)s = 'RETRY_SCHEDULED' THEN now() + interval '4 seconds' END, %(detail)s
  FROM core.executions AS e WHERE e.id = %(id)s"""

# Back-date when an execution entered its state (the alert feed and the metrics read its age).
BACKDATE_EXECUTION = """
ALTER TABLE core.executions DISABLE TRIGGER executions_guard;
UPDATE core.executions SET status_changed_at = now() - %(age)s::interval, created_at = now() - %(age)s::interval
 WHERE id = %(id)s;
ALTER TABLE core.executions ENABLE TRIGGER executions_guard"""


def add_execution(
    conn: psycopg.Connection,
    *,
    status: str = "RECONCILIATION_REQUIRED",
    consumer: str = "points.ledger",
    queue: str = "points.ledger",
    job_id: uuid.UUID | None = None,
    payload: Any = None,
    business_scope: str | None = "loyalty",
    checkpoints: tuple[tuple[str, str, str, Any], ...] = (),
    reason: str = "notify: the worker was lost while the request may have been sent",
    reason_action: str | None = "notify",
    age: str | None = None,
    events: tuple[tuple[str, str | None], ...] = (),
) -> int:
    """One execution in ``status`` with ``checkpoints`` ``(action, effect, status, result)`` in order; its id.

    ``events`` ``(kind, action)`` are written to its history in that order, after the checkpoints.

    ``age`` back-dates when it entered that state (by disabling the guard trigger for one
    statement: a test arranging the past, not a writer the database must accept).
    """
    job_id = job_id or uuid.uuid4()
    (execution_id,) = conn.execute(
        INSERT_EXECUTION,
        {
            "job_id": job_id,
            "consumer": consumer,
            "queue": queue,
            "tenant_id": TENANT,
            "correlation_id": f"corr-{job_id.hex[:6]}",
            "payload": Jsonb(payload if payload is not None else {"member_id": "m-1", "points": 10}),
            "business_scope": business_scope,
        },
    ).fetchone()
    if status != "PENDING":
        conn.execute(TAKE_EXECUTION, {"id": execution_id})
    for position, (action, effect, checkpoint_status, result) in enumerate(checkpoints):
        conn.execute(
            INSERT_CHECKPOINT,
            {
                "id": execution_id,
                "action": action,
                "position": position,
                "effect": effect,
                "status": checkpoint_status,
                "attempts": 0 if checkpoint_status == "STARTED" and effect == "READ_ONLY" else 1,
                "result": Jsonb(result) if checkpoint_status == "SUCCEEDED" else None,
                "error": "TransientError: ledger timeout" if checkpoint_status in ("FAILED", "UNCERTAIN") else None,
            },
        )
    for kind, action in events:
        conn.execute(
            INSERT_EXECUTION_EVENT, {"id": execution_id, "kind": kind, "action": action, "detail": f"{kind} (factory)"}
        )
    if status not in ("PENDING", "RUNNING"):
        conn.execute(
            SETTLE_EXECUTION,
            {
                "id": execution_id,
                "status": status,
                "reason": reason if status in ("FAILED", "RECONCILIATION_REQUIRED") else None,
                "reason_action": reason_action,
                "delay": timedelta(seconds=4) if status == "RETRY_WAIT" else timedelta(0),
            },
        )
    if age is not None:
        for statement in BACKDATE_EXECUTION.split(";"):
            conn.execute(statement, {"age": age, "id": execution_id} if "%(" in statement else None)
    return execution_id


def resolve_execution(
    conn: psycopg.Connection, execution_id: int, status: str = "PENDING", *, evidence: str = "COMPENSATED_VERIFIED"
) -> None:
    """An operator's real resolution (maintenance/operations/resolution.py) of a RECONCILIATION_REQUIRED execution of the
    example ledger consumer: RESUME (→ ``PENDING``, re-queued) or CLOSE_WITHOUT_TRANSITION (→ ``FAILED``).

    ``evidence`` is a CLOSE's kind (ABSENT_VERIFIED or COMPENSATED_VERIFIED). RESUME states no result: it suits executions arranged without UNCERTAIN checkpoints (the
    resolution refuses to leave an uncertainty behind). Whatever the execution's consumer is named,
    the example's actions are published as its definition.
    """
    from dataclasses import replace

    from harness.examples.ledger_points import consumer as example
    from maintenance.operations.resolution import Close, Evidence, Resume, resolve

    (name,) = conn.execute("SELECT consumer FROM core.executions WHERE id = %s", (execution_id,)).fetchone()
    consumer = replace(example, name=name)

    command = (
        Resume(results=(), evidence=Evidence("RESULT_VERIFIED", "OPS-1", "checked at the ledger"))
        if status == "PENDING"
        else Close(evidence=Evidence(evidence, "OPS-1", "reversed at the ledger"))  # type: ignore[arg-type]
    )
    resolve(
        conn,
        execution_id=execution_id,
        idempotency_key=f"factory-{execution_id}-{status}-{evidence}",
        operator="factory-operator",
        command=command,
        consumers={consumer.name: consumer},
        scopes=frozenset({"loyalty"}),
    )


def make_uncertain_again(conn: psycopg.Connection, execution_id: int) -> None:
    """A resumed (PENDING) execution taken by a worker and left uncertain once more: a new episode."""
    conn.execute(TAKE_EXECUTION, {"id": execution_id})
    conn.execute(
        SETTLE_EXECUTION,
        {
            "id": execution_id,
            "status": "RECONCILIATION_REQUIRED",
            "reason": "notify: the worker was lost while the request may have been sent",
            "reason_action": "notify",
            "delay": timedelta(0),
        },
    )
