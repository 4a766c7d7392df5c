"""The queue port: what the harness needs from a broker, and the outcomes it hands back.

Why a port: the harness decides each delivery's :data:`Outcome` (harness/handling.py) and
:func:`settle` maps it onto whichever adapter holds the queue — the reference one in PostgreSQL
(harness/queue/pgqueue.py), RabbitMQ (harness/queue/rabbitmq.py), a third party's, or the in-memory
one for unit tests — all held to the same contract by the conformance kit
(harness/testing/conformance.py). The outcome table, what a settling call's answer means, the
port's other calls, redelivered deliveries, payloads and envelopes, replays and traces are
docs/harness.md, "The queue port".
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

    Optional, looked up with ``getattr`` (docs/harness.md, "The queue port"): ``figures(queue) -> tuple[int, float] | None``
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
