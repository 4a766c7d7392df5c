"""The dead-letter writer: one ``core.dead_letters`` row per job the harness gives up on (J-B4).

A dead letter carries the full payload, the attempts made, the last error as ``"Type:
message"`` bounded to :data:`harness.errors.MAX_ERROR_CHARS` (:func:`harness.errors.describe_error`,
which renders any exception, even one that cannot be printed), its stack trace masked and bounded
to :data:`harness.errors.MAX_TRACEBACK_CHARS` (:func:`harness.errors.describe_traceback`; NULL
for a failure that has none: a poison, a letter written before migration 0022), the correlation id, the queue, the consumer, the
tenant, the job id and the message's trace context, so that a replay republishes exactly the same
job (J-B6) in the same trace (harness/tracing.py). It is born
``pending_review``; the database enforces its lifecycle. The caller supplies the transaction —
the reference queue writes the letter in the one that removes the message, so a failure is
neither lost nor recorded twice.

One dead letter per failure: a consumer has at most one ``pending_review`` letter of a job
(migration 0018's partial unique index), and the writer inserts ``ON CONFLICT DO NOTHING`` on it,
returning None when the letter was already there. A broker adapter commits the letter, then acks
the broker's message; a crash in between redelivers a failure already recorded, and writing it
again changes nothing (harness/handling.py does not even run such a redelivery). Once the letter is
replayed or discarded, a new failure of the job is a new letter.

A replayed delivery (``replay_of``: the dead letter it replays) marks that replay handled when it
reaches a final outcome, in the transaction of the outcome (:func:`mark_replay_handled`): the
work's for ``processed``, the fence probe's for ``duplicate`` (harness/handling.py), and this
writer's for ``dead_lettered`` — the new pending letter takes over holding the job's fences in
the same commit. Until then the purge keeps those fences, however long the delivery waits
(maintenance/jobs/purge/paths.py). The database stamps ``replay_handled_at`` and refuses a second
outcome; a mark that finds the replay already handled (a redelivery after a lost ack, or an
operator's release) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from harness.errors import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS

__all__ = [
    "DeadLetter",
    "mark_replay_handled",
    "write_dead_letter",
]


@dataclass(frozen=True)
class DeadLetter:
    job_id: UUID
    queue: str
    consumer: str
    payload: Any
    attempts: int
    last_error: str
    tenant_id: UUID | None = None
    correlation_id: str | None = None
    replay_of: int | None = None  # the dead letter whose replayed delivery failed again, if any
    # The message's W3C trace context (harness/tracing.py), kept so that a replay joins the job's trace.
    traceparent: str | None = None
    tracestate: str | None = None
    # The failure's stack trace (harness.errors.describe_traceback), None when it has none.
    traceback: str | None = field(default=None, compare=False)


# A replay's final outcome, once: the database stamps replay_handled_at and refuses a second one.
# A replay is the replay of a letter of its own job and consumer (or of a letter naming no consumer, as the seed's
# schema writes them): a message naming another's letter (a foreign producer's x-core-jobs-replay-of,
# docs/rabbitmq.md) marks nothing.
MARK_REPLAY_HANDLED = """
UPDATE core.dead_letters
   SET replay_outcome = %(outcome)s
 WHERE id = %(replay_of)s AND job_id = %(job_id)s AND coalesce(consumer, %(consumer)s) = %(consumer)s
   AND status = 'replayed' AND replay_outcome IS NULL
"""

# The letter, unless this consumer already has a pending letter of the job (one dead letter per
# failure: migration 0018's partial unique index, so a redelivery after a lost ack writes nothing),
# and — for a replayed delivery failing again — its replay marked dead_lettered, in one statement:
# atomic whatever the caller's transaction. The replay is marked whether the INSERT wrote or found
# the pending letter already there: either way a pending letter of the job now holds its fences, and
# the replay's delivery is over. No replay, or a replay_of naming a letter of another job or consumer: the
# UPDATE matches nothing. The SELECT always returns one row: the new letter's id, NULL when the INSERT was a no-op.
INSERT_DEAD_LETTER = """
WITH replay_handled AS (
    UPDATE core.dead_letters
       SET replay_outcome = 'dead_lettered'
     WHERE id = %(replay_of)s AND job_id = %(job_id)s AND coalesce(consumer, %(consumer)s) = %(consumer)s
       AND status = 'replayed' AND replay_outcome IS NULL
),
written AS (
    INSERT INTO core.dead_letters
           (job_id, queue, consumer, payload, attempts, last_error, traceback, tenant_id, correlation_id,
            traceparent, tracestate)
    VALUES (%(job_id)s, %(queue)s, %(consumer)s, %(payload)s, %(attempts)s, %(last_error)s, %(traceback)s,
            %(tenant_id)s, %(correlation_id)s, %(traceparent)s, %(tracestate)s)
    ON CONFLICT (consumer, job_id) WHERE status = 'pending_review' DO NOTHING
    RETURNING id
)
SELECT (SELECT id FROM written)
"""


@dataclass(frozen=True)
class UndecodablePayload:
    """A stored payload this process cannot decode: its text as stored, and why (never a value).

    Here, below the queue port that decodes payloads, because a dead letter keeps it as it was stored."""

    text: str
    reason: str


def mark_replay_handled(conn: psycopg.Connection, replay_of: int, outcome: str, *, job_id: UUID, consumer: str) -> bool:
    """Record the final ``outcome`` of the replay of dead letter ``replay_of`` by ``consumer``'s delivery of
    ``job_id``, in the caller's transaction; False when one was already recorded (a redelivery, or an operator's
    release), or when ``replay_of`` is not a letter of that job and consumer (:data:`MARK_REPLAY_HANDLED`)."""
    params = {"replay_of": replay_of, "outcome": outcome, "job_id": job_id, "consumer": consumer}
    return conn.execute(MARK_REPLAY_HANDLED, params).rowcount == 1


def write_dead_letter(conn: psycopg.Connection, letter: DeadLetter) -> int | None:
    """Insert the dead letter in the caller's transaction; return its id, or None when it was not written.

    Not written: ``letter.consumer`` already has a ``pending_review`` letter of ``letter.job_id``
    (one dead letter per failure — a redelivery of a failure already recorded, whose ack was lost;
    :data:`INSERT_DEAD_LETTER`). The result is truthy exactly when it wrote. A letter of a replayed
    delivery (``replay_of``) marks that replay ``dead_lettered`` in the same statement, written or not.
    """
    row = conn.execute(
        INSERT_DEAD_LETTER,
        {
            "job_id": letter.job_id,
            "queue": letter.queue,
            "consumer": letter.consumer,
            # A payload the worker could not decode is kept as it was stored (harness/queue/port.py).
            "payload": Jsonb(letter.payload.text, dumps=str)
            if isinstance(letter.payload, UndecodablePayload)
            else Jsonb(letter.payload),
            "attempts": letter.attempts,
            "last_error": letter.last_error[:MAX_ERROR_CHARS],
            "traceback": letter.traceback[:MAX_TRACEBACK_CHARS] if letter.traceback is not None else None,
            "tenant_id": letter.tenant_id,
            "correlation_id": letter.correlation_id,
            "replay_of": letter.replay_of,
            "traceparent": letter.traceparent,
            "tracestate": letter.tracestate,
        },
    ).fetchone()
    assert row is not None  # the final SELECT always returns one row
    written: int | None = row[0]
    return written
