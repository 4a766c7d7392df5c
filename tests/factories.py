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
from harness.pgqueue import PgQueue
from harness.queue import Envelope

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
INSERT_DEAD_LETTERS = """
INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, created_at, consumer,
                               tenant_id)
SELECT coalesce(%(job_id)s::uuid, gen_random_uuid()), %(queue)s, %(payload)s, 5, %(error)s,
       'corr-' || %(queue)s || '-' || g,
       coalesce(%(created_at)s::timestamptz, now() - %(age)s::interval - interval '1 second')
         - (g - 1) * interval '1 second',
       %(consumer)s, %(tenant_id)s::uuid
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
) -> list[int]:
    """Insert ``count`` pending dead letters written ``age`` ago (or at ``created_at``), a second apart; their ids."""
    rows = conn.execute(
        INSERT_DEAD_LETTERS,
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
        assert mark_replay_handled(conn, letter_id, handled)
    return letter_id


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
