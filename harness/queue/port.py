"""The queue port: what the harness needs from a broker, and the outcomes it hands back.

A broker adapter implements :class:`QueuePort`. The harness decides each delivery's
:data:`Outcome` (harness/handling.py); :func:`settle` maps it onto the port:

=====================  =================================================================
outcome                what the adapter does
=====================  =================================================================
``Acked``              ack: the message is gone (the work and its fence are committed)
``Duplicate``          ack: the fence was already there, nothing was done (J-B2); or a
                       redelivered delivery's failure is already a pending dead letter
``RetryAfter(delay)``  record the failed attempt, deliver again after ``delay`` (R-1)
``DeadLettered``       write the dead letter and remove the message, together (J-B4)
``Held``               ack: a durable execution waits for an operator (its resolution re-queues it)
``Stale``              nothing: this worker lost the execution's lease; another one owns the job
=====================  =================================================================

Every settling call returns whether it took effect: False means the delivery's lease was lost
(it expired and the message is, or will be, delivered again), and the write changed nothing —
except a broker adapter's ``dead_letter`` whose ack was lost after its letter committed: False, and
the redelivery finds the letter (harness/handling.py). ``dead_letter`` is True when the delivery is
settled, whether it wrote the letter or found the job's failure already a pending letter (one per failure).

Adapters. The reference adapter keeps the queue in PostgreSQL (harness/queue/pgqueue.py); an
adapter on a broker (RabbitMQ: harness/queue/rabbitmq.py, or a third party's) implements the same
port, and :func:`harness.queue.adapters.open_queue` picks one from a URL. Besides the settling
calls a port has:

- ``publish_many(messages, delay=)`` — every ``(queue, envelope)`` or none: ``check_payload``
  runs on every payload before anything is sent. A broker that cannot be all or none (RabbitMQ
  confirms each message) says, when it fails midway, how many of the first messages it has: an
  ``int`` attribute ``published`` on the error it raises (absent: none), so a caller that must
  not send them twice (the relay, harness/queue/relay.py) can tell;
- ``close()`` — what the port holds of its own (a broker connection) is let go; the PostgreSQL
  connection it was opened on is the caller's and stays open. The worker closes its port when its
  thread ends;
- optionally ``figures(queue)`` — ``(ready messages, seconds the oldest has been due)`` for the
  worker's gauges, or None when the adapter cannot tell (the gauges are then left alone);
- optionally ``system`` — the ``messaging.system`` its spans carry (``postgresql``, ``rabbitmq``).

A delivery says ``redelivered`` when the queue tells that it may have been handled before
without being settled — its worker crashed, perhaps killed by this very job, or crashed between
the database commit and the broker's ack (the reference queue: a claim of a message whose lease
expired). The harness then looks for what that first delivery may already have written
(harness/handling.py) and runs it alone, after the rest of its batch is settled and acked
(harness/worker.py); and **a claim hands out at most one redelivered delivery**, so that a job
that kills its worker takes only itself, never its batch-mates, down with it again (each of them
would use an attempt per crash). The conformance kit checks both.

A payload is JSON that PostgreSQL's ``jsonb`` can store: the queue, the dead letters and a
replay all keep it there. :func:`check_payload` refuses the rest — NaN and ±Infinity (JSON has
neither; Python's ``json`` reads them, and reads ``1e400`` as inf), ``\\u0000`` in a string or a key,
a lone UTF-16 surrogate, a value that is not JSON (a datetime, a set) — with
:class:`InvalidPayload` naming where (``payload.items[1].note``). ``publish`` calls it first,
so a bad payload is that error, never a database error, and nothing is queued. It also refuses
what jsonb stores but a consumer could not read back: nesting deeper than
:data:`MAX_PAYLOAD_DEPTH` levels and an integer too long for Python to read (over 4 300 digits).
:func:`payload_json` is the same check returning the payload's JSON text: an adapter that writes
text (the reference queue's batch publish) checks and serializes in one pass.

The envelope's other fields are held to the constraints of the tables they reach, with the
constraints' own predicates (harness/queue/fields.py): :func:`check_envelope` — what every
adapter's ``publish`` and ``publish_many`` run first — raises :class:`InvalidEnvelope` naming the
field (a ``traceparent`` of another version, a blank queue, a NUL in the correlation id…), of which
:class:`InvalidPayload` is the payload's kind; nothing is written or sent. What another producer
sent is not refused but kept only where valid, at the adapter's decode (a new trace, no correlation id).

A stored payload a worker cannot decode all the same (written by SQL, or by an older version)
is read by :func:`decode_payload` as an :class:`UndecodablePayload`, never an exception at claim
time: the harness makes it that delivery's poison dead letter (harness/handling.py), keeping the
payload as it was stored, and the worker goes on with the rest of its batch.

Replays. A replay publishes ``Envelope(replay_of=<the dead letter's id>)``; an adapter carries
``replay_of`` with the message, unchanged across retries and redeliveries, exactly as it carries
``job_id``. The harness needs nothing else from the broker: the delivery's final outcome
(``Acked``, ``Duplicate``, ``DeadLettered``) marks the replay handled in its own transaction,
and until then the purge keeps the job's fences however long the message waits. A broker that
loses the message, or an adapter that drops ``replay_of``, leaves the replay outstanding: its
fences are kept (never a double effect) until an operator releases it (``core-jobs dead-letters
release``). docs/harness.md, "Replays and the purge".

Traces. An adapter carries ``traceparent`` and ``tracestate`` (the W3C trace context) with the
message like ``replay_of``: ``publish`` sets them from its ``<queue> publish`` span, unless the
envelope is a replay, which keeps its dead letter's (harness/tracing.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

from harness.dead_letters import DeadLetter, UndecodablePayload
from harness.queue.fields import (
    InvalidEnvelope,
    correlation_id_problem,
    queue_problem,
    replay_of_problem,
    trace_context_problem,
)
from harness.queue.payload import MAX_PAYLOAD_DEPTH, InvalidPayload, check_payload, decode_payload, payload_json

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "NO_TENANT",
    "Acked",
    "DeadLettered",
    "Delivery",
    "Duplicate",
    "Envelope",
    "Held",
    "InvalidEnvelope",
    "InvalidPayload",
    "Outcome",
    "QueuePort",
    "RetryAfter",
    "Stale",
    "UndecodablePayload",
    "check_envelope",
    "check_fields",
    "check_payload",
    "decode_payload",
    "payload_json",
    "settle",
]

# The tenant of platform-level jobs that belong to no tenant (processed_jobs.tenant_id is NOT NULL).
NO_TENANT = UUID(int=0)


@dataclass(frozen=True)
class Envelope:
    """A message as published: the job's identity travels with it, unchanged across replays (J-B6)."""

    job_id: UUID
    payload: Any  # JSON
    tenant_id: UUID = NO_TENANT
    correlation_id: str | None = None
    replay_of: int | None = None  # the dead letter a replay republished; None for every other message
    # The W3C trace context the job travels in (harness/tracing.py): set by publish from its span, kept
    # unchanged by retries, the dead letter and a replay. None: published without tracing.
    traceparent: str | None = None
    tracestate: str | None = None


def check_envelope(queue: str, envelope: Envelope) -> None:
    """Raise :class:`InvalidEnvelope` naming the first field of ``(queue, envelope)`` the database would refuse.

    The fields' predicates are the constraints' own (harness/queue/fields.py, :func:`check_fields`); the
    payload is :func:`check_payload`'s, except an :class:`UndecodablePayload` read back as stored, which an
    adapter writes back as it was (a RESUME of such an execution).
    """
    check_fields(queue, envelope)
    if not isinstance(envelope.payload, UndecodablePayload):
        check_payload(envelope.payload)


def check_fields(queue: str, envelope: Envelope) -> None:
    """:func:`check_envelope` but the payload: for an adapter that checks the payload as it writes it."""
    problems = (
        ("queue", queue_problem(queue)),
        (
            "correlation_id",
            None if envelope.correlation_id is None else correlation_id_problem(envelope.correlation_id),
        ),
        ("replay_of", None if envelope.replay_of is None else replay_of_problem(envelope.replay_of)),
        ("job_id", _uuid_problem(envelope.job_id)),
        ("tenant_id", _uuid_problem(envelope.tenant_id)),
    )
    for name, problem in problems:
        if problem is not None:
            raise InvalidEnvelope(f"{name}: {problem}")
    if problem := trace_context_problem(envelope.traceparent, envelope.tracestate):
        raise InvalidEnvelope(problem)


def _uuid_problem(value: object) -> str | None:
    """A ``uuid`` column takes a UUID (exactly: a subclass's text could be anything, harness/queue/pgqueue.py)."""
    return None if type(value) is UUID else f"must be a UUID, got {type(value).__name__}"


@dataclass(frozen=True)
class Delivery:
    """One delivery of an envelope; ``receipt`` is the adapter's handle to settle it."""

    queue: str
    envelope: Envelope
    attempt: int  # 1 on the first delivery
    receipt: Any = field(default=None, compare=False)
    # The broker says this message may have been handled before without being settled (delivered, not acked,
    # its consumer gone). PgQueue settles atomically with the database: always False there.
    redelivered: bool = False

    def letter(self, consumer: str, *, attempts: int, last_error: str, traceback: str | None = None) -> DeadLetter:
        """This delivery's dead letter: the envelope whole — identity, payload, replay, trace context (J-B6)."""
        envelope = self.envelope
        return DeadLetter(
            job_id=envelope.job_id,
            queue=self.queue,
            consumer=consumer,
            payload=envelope.payload,
            attempts=attempts,
            last_error=last_error,
            traceback=traceback,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            replay_of=envelope.replay_of,
            traceparent=envelope.traceparent,
            tracestate=envelope.tracestate,
        )


@dataclass(frozen=True)
class Acked:
    """The work and its fence committed."""


@dataclass(frozen=True)
class Duplicate:
    """The fence already existed: nothing done, acked silently (J-B2).

    ``already_dead_lettered``: not the fence but the job's pending dead letter showed a
    redelivered delivery's failure was already recorded (harness/handling.py): acked unrun.
    """

    already_dead_lettered: bool = False


@dataclass(frozen=True)
class RetryAfter:
    """A transient failure: deliver again after ``delay``."""

    delay: timedelta
    error: str
    traceback: str | None = field(default=None, compare=False)  # the failure's (harness.errors.describe_traceback)


@dataclass(frozen=True)
class DeadLettered:
    """Poison, permanent, or out of attempts: ``letter`` is what to write."""

    reason: Literal["poison", "permanent", "exhausted"]
    letter: DeadLetter


@dataclass(frozen=True)
class Held:
    """A durable execution is RECONCILIATION_REQUIRED: the message goes, the execution waits for an operator."""

    execution_id: int
    reason: str


@dataclass(frozen=True)
class Stale:
    """This worker's fencing token or lease on the execution was superseded: it changed nothing."""

    execution_id: int


Outcome = Acked | Duplicate | RetryAfter | DeadLettered | Held | Stale


class QueuePort(Protocol):
    """What a broker adapter provides. Every settling method returns False on a lost lease.

    Optional, looked up with ``getattr`` (the module docstring): ``figures(queue) -> tuple[int, float] | None``
    and ``system: str``.
    """

    def publish(self, queue: str, envelope: Envelope, *, delay: timedelta = timedelta(0)) -> object: ...

    def publish_many(self, messages: Sequence[tuple[str, Envelope]], *, delay: timedelta = timedelta(0)) -> None: ...

    def claim(self, queue: str, limit: int) -> list[Delivery]: ...

    def ack(self, deliveries: Sequence[Delivery]) -> int: ...

    def retry(self, delivery: Delivery, delay: timedelta, error: str) -> bool: ...

    def dead_letter(self, delivery: Delivery, letter: DeadLetter) -> bool: ...

    def release(self, deliveries: Sequence[Delivery]) -> int: ...

    def close(self) -> None: ...


def settle(port: QueuePort, delivery: Delivery, outcome: Outcome) -> bool:
    """Apply one outcome to the port; False when the delivery's lease was lost."""
    if isinstance(outcome, (Acked, Duplicate, Held)):
        return port.ack([delivery]) == 1
    if isinstance(outcome, Stale):
        return False  # the lease is another worker's: settling anything could undo its work
    if isinstance(outcome, RetryAfter):
        return port.retry(delivery, outcome.delay, outcome.error)
    return port.dead_letter(delivery, outcome.letter)
