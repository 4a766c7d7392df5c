"""An in-memory queue: the queue port without a broker, for a consumer service's own unit tests.

httpx ships ``MockTransport`` so that a client's tests need no server; this is the same for a
consumer: its tests publish, run the worker (or :func:`harness.handling.handle`) and look at what
happened, with no RabbitMQ and no ``core.queue_messages`` table. Only the queue is in memory: the
work, its fence and the dead letters are written in PostgreSQL as on every adapter, on the
connection the port is opened on — what the consumer's tests are about. It keeps the port's whole
contract (the conformance kit, harness/testing/conformance.py, runs on it), so a test that passes
here does not pass by a laxer queue. docs/harness.md, "Testing a consumer".
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from harness.dead_letters import DeadLetter, write_dead_letter
from harness.queue.port import Delivery, Envelope, check_envelope, decode_payload, payload_json
from harness.queue.publishing import publish_span

if TYPE_CHECKING:
    import psycopg

__all__ = ["MemoryBroker", "MemoryQueue", "memory_broker"]


@dataclass
class _Message:
    queue: str
    envelope: Envelope  # its payload as JSON text: decoded anew at each claim, as from a real queue
    attempt: int = 1
    redelivered: bool = False
    due: float = 0.0  # on the broker's clock (seconds)
    seq: int = 0  # publication order, kept by a release


@dataclass(eq=False)
class _Receipt:
    message: _Message
    port: MemoryQueue
    expires: float  # the lease's end on the broker's clock: then the message is delivered again
    settled: bool = False


@dataclass
class MemoryBroker:
    """The queues of one test (or process): every port opened on it shares them. Its clock moves only when told.

    A delayed message (a retry's backoff, a ``publish(delay=)``) waits for :meth:`advance` or :meth:`make_due`,
    never for time to pass; so does a lease's expiry (a claimed message comes back, redelivered, once the clock
    has moved past its port's ``lease`` and it is not settled). The inspection methods (:meth:`ready`, :meth:`delayed`, :meth:`in_flight`) are for
    assertions.
    """

    now: float = 0.0
    _waiting: list[_Message] = field(default_factory=list)  # published, retried or released: ready once due
    _in_flight: dict[_Receipt, None] = field(default_factory=dict)  # claimed, not yet settled
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def advance(self, by: timedelta) -> None:
        """The broker's clock moves on by ``by``: what was delayed until then is ready."""
        with self._lock:
            self.now += by.total_seconds()

    def make_due(self, queue: str | None = None) -> None:
        """Every delayed message (of ``queue``, or of every queue) is ready now."""
        with self._lock:
            for message in self._waiting:
                if queue is None or message.queue == queue:
                    message.due = min(message.due, self.now)

    def ready(self, queue: str) -> int:
        """Messages of ``queue`` a claim would hand out now (or after the one redelivered message a claim takes)."""
        with self._lock:
            return sum(1 for m in self._waiting if m.queue == queue and m.due <= self.now)

    def delayed(self, queue: str) -> int:
        """Messages of ``queue`` not due yet."""
        with self._lock:
            return sum(1 for m in self._waiting if m.queue == queue and m.due > self.now)

    def in_flight(self, queue: str) -> int:
        """Deliveries of ``queue`` claimed and not settled."""
        with self._lock:
            return sum(1 for r in self._in_flight if r.message.queue == queue)

    def _put(self, message: _Message, delay: timedelta = timedelta(0), *, keep_order: bool = False) -> None:
        message.due = self.now + max(delay, timedelta(0)).total_seconds()
        if not keep_order:
            message.seq = next(self._order)
        self._waiting.append(message)

    def _claim(self, port: MemoryQueue, queue: str, limit: int) -> list[_Receipt]:
        """Up to ``limit`` due messages of ``queue`` in order, at most one of them redelivered (a killer runs alone)."""
        with self._lock:
            self._expire()
            due = sorted((m for m in self._waiting if m.queue == queue and m.due <= self.now), key=lambda m: m.seq)
            taken: list[_Message] = []
            redelivered = False
            for message in due:
                if len(taken) == limit:
                    break
                if message.redelivered and redelivered:
                    continue
                redelivered |= message.redelivered
                taken.append(message)
            receipts = [_Receipt(message, port, self.now + port.lease.total_seconds()) for message in taken]
            chosen = {id(m) for m in taken}
            self._waiting = [m for m in self._waiting if id(m) not in chosen]
            self._in_flight.update(dict.fromkeys(receipts))
            return receipts

    def _settle(self, receipt: _Receipt) -> bool:
        """Take ``receipt`` out of flight: True once, False if it was settled already (or its port closed)."""
        with self._lock:
            self._expire()
            if receipt.settled or receipt not in self._in_flight:
                return False
            receipt.settled = True
            del self._in_flight[receipt]
            return True

    def _requeue(self, message: _Message, delay: timedelta = timedelta(0), *, keep_order: bool = False) -> None:
        with self._lock:
            self._put(message, delay, keep_order=keep_order)

    def _drop_port(self, port: MemoryQueue) -> None:
        """``port``'s process is gone: its unsettled deliveries come back, redelivered, their attempt counted."""
        with self._lock:
            self._redeliver([r for r in self._in_flight if r.port is port])

    def _expire(self) -> None:
        """The deliveries whose lease has ended come back (under the lock)."""
        self._redeliver([r for r in self._in_flight if r.expires <= self.now])

    def _redeliver(self, receipts: list[_Receipt]) -> None:
        for receipt in receipts:
            del self._in_flight[receipt]
            receipt.settled = True  # its settling is refused from now on: the lease was lost
            message = receipt.message
            self._put(replace(message, attempt=message.attempt + 1, redelivered=True), keep_order=True)


# The brokers ``memory://<name>`` URLs name, by name: one per name in the process.
_BROKERS: dict[str, MemoryBroker] = {}
_BROKERS_LOCK = threading.Lock()


def memory_broker(name: str = "") -> MemoryBroker:
    """The process's broker of that name (made on first use): what ``CORE_JOBS_QUEUE_URL=memory://<name>`` opens."""
    with _BROKERS_LOCK:
        return _BROKERS.setdefault(name, MemoryBroker())


class MemoryQueue:
    """The queue port on a :class:`MemoryBroker`, opened on the PostgreSQL connection where the dead letters go."""

    system = "memory"

    def __init__(
        self,
        broker: MemoryBroker,
        conn: psycopg.Connection | None = None,
        *,
        worker: str = "",
        lease: timedelta = timedelta(seconds=30),
    ) -> None:
        self.broker = broker
        self.conn = conn
        self.worker = worker or f"memory-{uuid.uuid4().hex[:8]}"
        self.lease = lease

    @classmethod
    def from_url(
        cls, url: str, conn: psycopg.Connection, *, worker: str = "", lease: timedelta = timedelta(seconds=30)
    ) -> MemoryQueue:
        """``memory://<name>``: the process's broker of that name (:func:`memory_broker`); ``memory://`` the unnamed one."""
        return cls(memory_broker(url.split("://", 1)[1].split("?", 1)[0].strip("/")), conn, worker=worker, lease=lease)

    def __repr__(self) -> str:
        return f"MemoryQueue(worker={self.worker!r})"

    def publish(self, queue: str, envelope: Envelope, *, delay: timedelta = timedelta(0)) -> uuid.UUID:
        """Queue ``envelope`` on ``queue``, ready after ``delay`` on the broker's clock; return its job id."""
        self.publish_many([(queue, envelope)], delay=delay)
        return envelope.job_id

    def publish_many(self, messages: Sequence[tuple[str, Envelope]], *, delay: timedelta = timedelta(0)) -> None:
        """Queue every ``(queue, envelope)`` or none: every one is checked first, as every adapter does."""
        stored = []
        for queue, envelope in messages:
            check_envelope(queue, envelope)
            stored.append((queue, replace(envelope, payload=payload_json(envelope.payload))))
        with publish_span(stored, system=self.system) as traced, self.broker._lock:
            for queue, envelope in traced:
                self.broker._put(_Message(queue, envelope), delay)

    def claim(self, queue: str, limit: int) -> list[Delivery]:
        """Up to ``limit`` ready messages of ``queue``, at once (an empty list when none is ready)."""
        if limit < 1:
            return []
        return [
            Delivery(
                queue=queue,
                envelope=replace(r.message.envelope, payload=decode_payload(r.message.envelope.payload)),
                attempt=r.message.attempt,
                receipt=r,
                redelivered=r.message.redelivered,
            )
            for r in self.broker._claim(self, queue, limit)
        ]

    def ack(self, deliveries: Sequence[Delivery]) -> int:
        """The deliveries are gone; how many were still in flight."""
        return sum(self.broker._settle(d.receipt) for d in deliveries)

    def retry(self, delivery: Delivery, delay: timedelta, error: str) -> bool:
        """Deliver again after ``delay`` as the next attempt; False if the delivery was settled already."""
        if not self.broker._settle(delivery.receipt):
            return False
        message = delivery.receipt.message
        self.broker._requeue(replace(message, attempt=delivery.attempt + 1, redelivered=False), delay)
        return True

    def dead_letter(self, delivery: Delivery, letter: DeadLetter) -> bool:
        """Write the dead letter on the port's connection and commit, then ack, as a broker adapter does."""
        if self.conn is None:
            raise ValueError("a MemoryQueue writes its dead letters in PostgreSQL: open it on a connection")
        receipt: _Receipt = delivery.receipt
        if receipt.settled:
            return False
        with self.conn.transaction():
            write_dead_letter(self.conn, letter)  # or finds the job's failure already a pending letter: settled too
        return self.broker._settle(receipt)

    def release(self, deliveries: Sequence[Delivery]) -> int:
        """Give deliveries back where they were, attempt uncounted (a redelivered one stays so)."""
        released = 0
        for delivery in deliveries:
            if self.broker._settle(delivery.receipt):
                self.broker._requeue(delivery.receipt.message, keep_order=True)
                released += 1
        return released

    def figures(self, queue: str) -> tuple[int, float]:
        """(ready messages, seconds the oldest has been due, on the broker's clock)."""
        with self.broker._lock:
            due = [m.due for m in self.broker._waiting if m.queue == queue and m.due <= self.broker.now]
            return len(due), (self.broker.now - min(due)) if due else 0.0

    def close(self) -> None:
        """The port is gone: what it claimed and did not settle comes back, redelivered (a closed connection)."""
        self.broker._drop_port(self)
