"""The relay: what the operations layer and producers publish in PostgreSQL, published on the broker.

A producer's job written in its own transaction (``harness.publish_in_transaction``,
harness/queue/outbox.py) is an outbox row like a replay's, and relayed the same way.

A replay (``core-jobs dead-letters replay``, the operations API, a bulk replay) and a RESUME
publish through ``PgQueue.publish_many`` **inside their own transaction**: the dead letter's
status and its audit row, or the resolution's ledger row, commit together with the message in
``core.queue_messages`` — or none of them does. For a queue served by the reference adapter that
row *is* the message. For a queue that lives on a broker the table is the **outbox**: nothing
consumes it there, and the relay moves its rows to the broker.

:meth:`Relay.run_once`, for each queue it serves:

1. **claim** up to ``batch_size`` due rows of the outbox (``PgQueue.claim``: ``FOR UPDATE SKIP
   LOCKED`` and a lease, so two relays — two workers, a worker and ``core-jobs relay`` — never
   take the same row while the lease lives);
2. **publish** them on the target (``publish_many``, which for the broker adapter returns once the
   broker confirmed them) as they are: same job id, tenant, correlation id, payload, ``replay_of``
   and trace context (a row without a trace context gets the target's publish span, if tracing is
   on). A row is due when claimed, so the target delivers it at once;
3. **ack** them in the outbox (the rows are deleted).

It goes on with the next batch while a batch comes back full, then with the next queue.

Crash cases — nothing is lost, and nothing is done twice:

- the publish fails (the broker is down, refuses, or does not confirm): the claimed rows are
  **released** at once (their attempt not counted), logged ``harness.relay.error``, and
  :meth:`Relay.run_once` raises that error; the next run publishes them again. Rows the target
  says it took before it failed (the error's ``published``: a queue that filled up midway) are
  acked instead, so a broker pushing back never gets the same rows again and again;
- the relay dies after the publish and before the ack (or the ack finds the lease expired —
  ``harness.relay.lease_lost``): the rows' leases expire and they are **published again**. The
  broker then holds the message twice, and the worker's fence absorbs the second delivery
  (``Duplicate``): one effect. A replay stays outstanding — and its fences held — until the
  worker handles one of the deliveries;
- the relay dies before the publish: the leases expire, the rows are published by the next run.

A row that cannot be published (stored by SQL: a payload Python cannot decode, which the port's
``check_payload`` refuses, or a field the target's publish refuses, ``check_fields``) would block no other: the relay writes it as a dead letter of
consumer :data:`RELAY_CONSUMER` with the payload as stored and removes it from the outbox, in one
transaction (``harness.relay.refused``), which also ends a replay it carried as ``dead_lettered``.

Latency: a message waits in the outbox until the relay's next run — at most its interval (the
worker's ``relay_interval``, 1 s by default; ``core-jobs relay --interval``) plus one batch's
claim, publish and ack (bench/relay.py measures it). Where it runs: every worker whose queue is on
a broker relays its own queue between batches (harness/worker.py); ``core-jobs relay --queue Q``
runs it alone (the Helm chart's optional relay Deployment). docs/outbox.md.

Events (stable names, structured fields): ``harness.relay.start`` / ``harness.relay.stop`` (the
loop of :meth:`Relay.run`, with counts), ``harness.relay.published`` (debug, per batch),
``harness.relay.refused``, ``harness.relay.lease_lost``, ``harness.relay.error``,
``harness.relay.still_leased`` (:meth:`Relay.report_still_leased`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import structlog

from harness.errors import describe_error
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Delivery, Envelope, InvalidEnvelope, check_fields, check_payload

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_INTERVAL", "RELAY_CONSUMER", "Publisher", "Relay", "RelayResult"]

log = structlog.get_logger()

DEFAULT_BATCH_SIZE = 100
DEFAULT_INTERVAL = timedelta(seconds=1)
# The consumer named on the dead letter of an outbox row the relay cannot publish.
RELAY_CONSUMER = "harness.relay"


class Publisher(Protocol):
    """What the relay needs of its target: any :class:`~harness.queue.port.QueuePort` (all or none, confirmed)."""

    def publish_many(self, messages: Sequence[tuple[str, Envelope]], *, delay: timedelta = ...) -> None: ...


@dataclass
class RelayResult:
    """What one run (or, summed, a loop) did: rows published on the target, rows dead-lettered, batches."""

    published: int = 0
    refused: int = 0
    batches: int = 0
    leases_lost: int = 0  # published, but acked too late: they will be published again (the fence absorbs it)

    def add(self, other: RelayResult) -> None:
        self.published += other.published
        self.refused += other.refused
        self.batches += other.batches
        self.leases_lost += other.leases_lost

    def fields(self) -> dict[str, int]:
        return {
            "num_published": self.published,
            "num_refused": self.refused,
            "num_batches": self.batches,
            "num_leases_lost": self.leases_lost,
        }


class Relay:
    """Moves the outbox rows of ``queues`` from ``source`` (the reference adapter) to ``target``."""

    def __init__(
        self,
        source: PgQueue,
        target: Publisher,
        queues: Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        metrics: Any = None,
    ) -> None:
        """``metrics``: where each run's counts go (``relayed(queue, published, refused, leases_lost)`` and
        ``relay_failed(queue)``, as :class:`harness.metrics.HarnessMetrics` has them); None counts nothing."""
        if not queues:
            raise ValueError("a relay needs at least one queue")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if target is source:
            raise ValueError("the relay's target is its source: the reference queue is its own outbox")
        self.source = source
        self.target = target
        self.queues = list(dict.fromkeys(queues))
        self.batch_size = batch_size
        self.metrics = metrics

    def run_once(self) -> RelayResult:
        """Relay every due outbox row of the queues, batch by batch, until a batch comes back short.

        A failed publish releases its batch and raises (see the module docstring).
        """
        result = RelayResult()
        for queue in self.queues:
            of_queue = RelayResult()
            try:
                while True:
                    batch = self.source.claim(queue, self.batch_size)
                    if not batch:
                        break
                    self._relay(queue, batch, of_queue)
                    if len(batch) < self.batch_size:
                        break
            except Exception as exc:
                result.add(of_queue)
                self._count(queue, of_queue, failed=True)
                log.error("harness.relay.error", queue=queue, **result.fields(), error=describe_error(exc))
                raise
            result.add(of_queue)
            self._count(queue, of_queue)
        return result

    def _count(self, queue: str, result: RelayResult, *, failed: bool = False) -> None:
        """The run's counts of ``queue`` into the metrics, if any."""
        if self.metrics is None:
            return
        self.metrics.relayed(queue, result.published, result.refused, result.leases_lost)
        if failed:
            self.metrics.relay_failed(queue)

    def report_still_leased(self) -> int:
        """How many due rows of its queues are still under a live lease — another relay's or worker's, maybe a dead
        one's —, each queue's logged ``harness.relay.still_leased`` with when its last lease ends on the database's
        clock. A run does not wait for them: the lease ends within the claimer's lease, then the next run publishes
        them. What ``core-jobs relay --once`` reports, so an outbox it could not empty is never reported empty."""
        total = 0
        for queue in self.queues:
            count, until = self.source.leased(queue)
            if count:
                total += count
                log.warning(
                    "harness.relay.still_leased",
                    queue=queue,
                    num_leased=count,
                    leased_until=until.isoformat() if until is not None else None,
                )
        return total

    def run(self, stop: threading.Event, *, interval: timedelta = DEFAULT_INTERVAL) -> RelayResult:
        """:meth:`run_once` every ``interval`` until ``stop`` is set; the counts. An error ends it (raised)."""
        log.info(
            "harness.relay.start", queues=self.queues, batch_size=self.batch_size, interval_s=interval.total_seconds()
        )
        total = RelayResult()
        ok = False
        try:
            while not stop.is_set():
                started = time.monotonic()
                total.add(self.run_once())
                stop.wait(max(0.0, interval.total_seconds() - (time.monotonic() - started)))
            ok = True
        finally:
            log.info("harness.relay.stop", queues=self.queues, **total.fields(), ok=ok)
        return total

    def _relay(self, queue: str, batch: list[Delivery], result: RelayResult) -> None:
        sendable, unsendable = [], []
        for delivery in batch:
            try:  # what the target's publish would refuse, refused here alone (nothing else of the batch)
                check_fields(queue, delivery.envelope)
                check_payload(delivery.envelope.payload)
            except InvalidEnvelope as exc:
                unsendable.append((delivery, str(exc)))
            else:
                sendable.append(delivery)
        for delivery, why in unsendable:
            self._refuse(queue, delivery, why, result)
        if not sendable:
            return
        try:
            self.target.publish_many([(queue, d.envelope) for d in sendable])
        except Exception as exc:
            # The first `published` reached the target before it refused one: acked, they are not sent again.
            published = getattr(exc, "published", 0)
            published = published if isinstance(published, int) and 0 < published < len(sendable) else 0
            if published:
                self._published(queue, sendable[:published], result)
            self._give_back(queue, sendable[published:])
            raise
        self._published(queue, sendable, result)

    def _published(self, queue: str, sendable: list[Delivery], result: RelayResult) -> None:
        """Ack rows the target confirmed in the outbox; a lost lease means they will be published again."""
        acked = self.source.ack(sendable)
        result.published += len(sendable)
        result.batches += 1
        log.debug("harness.relay.published", queue=queue, num_messages=len(sendable))
        if acked < len(sendable):
            result.leases_lost += len(sendable) - acked
            log.warning("harness.relay.lease_lost", queue=queue, num_unacked=len(sendable) - acked)

    def _refuse(self, queue: str, delivery: Delivery, why: str, result: RelayResult) -> None:
        error = f"the relay cannot publish this outbox message: {why}"
        letter = delivery.letter(RELAY_CONSUMER, attempts=delivery.attempt, last_error=error)
        if self.source.dead_letter(delivery, letter):
            result.refused += 1
            log.warning("harness.relay.refused", queue=queue, job_id=str(delivery.envelope.job_id), error=why)
        else:
            result.leases_lost += 1
            log.warning("harness.relay.lease_lost", queue=queue, num_unacked=1)

    def _give_back(self, queue: str, deliveries: list[Delivery]) -> None:
        """Release a batch the target refused, so the next run takes it at once; else its lease's expiry does."""
        try:
            self.source.release(deliveries)
        except Exception as exc:
            log.warning(
                "harness.relay.give_back_failed", queue=queue, num_unreleased=len(deliveries), error=describe_error(exc)
            )
