"""The queue port: what the harness needs from a broker, and the outcomes it hands back.

A broker adapter implements :class:`QueuePort`. The harness decides each delivery's
:data:`Outcome` (harness/handling.py); :func:`settle` maps it onto the port:

=====================  =================================================================
outcome                what the adapter does
=====================  =================================================================
``Acked``              ack: the message is gone (the work and its fence are committed)
``Duplicate``          ack: the fence was already there, nothing was done (J-B2)
``RetryAfter(delay)``  record the failed attempt, deliver again after ``delay`` (R-1)
``DeadLettered``       write the dead letter and remove the message, together (J-B4)
=====================  =================================================================

Every settling call returns whether it took effect: False means the delivery's lease was lost
(it expired and the message is, or will be, delivered again), and the write changed nothing.
Only the reference adapter exists (harness/pgqueue.py); other brokers are out of scope.

Replays. A replay publishes ``Envelope(replay_of=<the dead letter's id>)``; an adapter carries
``replay_of`` with the message, unchanged across retries and redeliveries, exactly as it carries
``job_id``. The harness needs nothing else from the broker: the delivery's final outcome
(``Acked``, ``Duplicate``, ``DeadLettered``) marks the replay handled in its own transaction,
and until then the purge keeps the job's fences however long the message waits. A broker that
loses the message, or an adapter that drops ``replay_of``, leaves the replay outstanding: its
fences are kept (never a double effect) until an operator releases it (``core-jobs dead-letters
release``). README.md, "Replays and the purge".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol, Union
from uuid import UUID

from harness.dead_letters import DeadLetter

__all__ = [
    "Acked", "DeadLettered", "Delivery", "Duplicate", "Envelope", "NO_TENANT", "Outcome", "QueuePort",
    "RetryAfter", "settle",
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


@dataclass(frozen=True)
class Delivery:
    """One delivery of an envelope; ``receipt`` is the adapter's handle to settle it."""

    queue: str
    envelope: Envelope
    attempt: int  # 1 on the first delivery
    receipt: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Acked:
    """The work and its fence committed."""


@dataclass(frozen=True)
class Duplicate:
    """The fence already existed: nothing done, acked silently (J-B2)."""


@dataclass(frozen=True)
class RetryAfter:
    """A transient failure: deliver again after ``delay``."""

    delay: timedelta
    error: str


@dataclass(frozen=True)
class DeadLettered:
    """Poison, permanent, or out of attempts: ``letter`` is what to write."""

    reason: Literal["poison", "permanent", "exhausted"]
    letter: DeadLetter


Outcome = Union[Acked, Duplicate, RetryAfter, DeadLettered]


class QueuePort(Protocol):
    """What a broker adapter provides. Every settling method returns False on a lost lease."""

    def publish(self, queue: str, envelope: Envelope, *, delay: timedelta = timedelta(0)) -> object: ...

    def claim(self, queue: str, limit: int) -> list[Delivery]: ...

    def ack(self, deliveries: Sequence[Delivery]) -> int: ...

    def retry(self, delivery: Delivery, delay: timedelta, error: str) -> bool: ...

    def dead_letter(self, delivery: Delivery, letter: DeadLetter) -> bool: ...

    def release(self, deliveries: Sequence[Delivery]) -> int: ...


def settle(port: QueuePort, delivery: Delivery, outcome: Outcome) -> bool:
    """Apply one outcome to the port; False when the delivery's lease was lost."""
    if isinstance(outcome, (Acked, Duplicate)):
        return port.ack([delivery]) == 1
    if isinstance(outcome, RetryAfter):
        return port.retry(delivery, outcome.delay, outcome.error)
    return port.dead_letter(delivery, outcome.letter)
