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
- the relay dies before the publish: the leases expire, the rows are published by the next run;
- its database connection is lost (a failover, a restart, a terminated backend, a network cut):
  :meth:`Relay.run` given ``reconnect`` waits it out (harness/reconnect.py) and settles on the
  new connection what the lost one left — rows the target confirmed are acked there, not
  published again; rows it was giving back are released — while rows whose claim the loss cut
  off are published once their lease ends.

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
``harness.relay.still_leased`` (:meth:`Relay.report_still_leased`), ``harness.relay.connection_lost``,
``harness.relay.reconnect_failed``, ``harness.relay.reconnected`` (:meth:`Relay.run` with ``reconnect``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import psycopg
import structlog

from harness import waiting
from harness.errors import describe_error
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Delivery, Envelope, InvalidEnvelope, check_fields, check_payload
from harness.reconnect import DatabaseUnavailable, Outage, is_lost

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_INTERVAL",
    "DEFAULT_RECONNECT_FOR",
    "RELAY_CONSUMER",
    "Publisher",
    "Reconnect",
    "Relay",
    "RelayResult",
]

log = structlog.get_logger()

DEFAULT_BATCH_SIZE = 100
DEFAULT_INTERVAL = timedelta(seconds=1)
# How long Relay.run keeps reconnecting after its database connection was lost before it gives up (as the worker).
DEFAULT_RECONNECT_FOR = timedelta(minutes=2)
# The consumer named on the dead letter of an outbox row the relay cannot publish.
RELAY_CONSUMER = "harness.relay"


class Publisher(Protocol):
    """What the relay needs of its target: any :class:`~harness.queue.port.QueuePort` (all or none, confirmed)."""

    def publish_many(self, messages: Sequence[tuple[str, Envelope]], *, delay: timedelta = ...) -> None: ...


# Opens the relay's source and target anew after its database connection was lost: a psycopg.OperationalError
# while the database cannot be reached yet (tried again after a backoff), anything else is the relay's failure.
Reconnect = Callable[[], tuple[PgQueue, Publisher]]


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
        # What a lost connection kept the relay from settling in the outbox, settled on the next one: rows the target
        # confirmed but not acked yet (else published again once their lease ends), and rows to release.
        self._unacked: list[tuple[str, list[Delivery]]] = []
        self._unreleased: list[tuple[str, list[Delivery]]] = []

    def run_once(self) -> RelayResult:
        """Relay every due outbox row of the queues, batch by batch, until a batch comes back short.

        A failed publish releases its batch and raises (see the module docstring). A lost database connection
        raises too, without ``harness.relay.error`` (the caller reconnects, or fails as it decides): the batch in
        hand is settled on the next connection (:meth:`run` with ``reconnect``), else its leases expire.
        """
        result = RelayResult()
        self._settle_pending(result)
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
                lost = is_lost(self.source.conn)
                self._count(queue, of_queue, failed=not lost)
                if not lost:
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

    def run(
        self,
        stop: threading.Event,
        *,
        interval: timedelta = DEFAULT_INTERVAL,
        reconnect: Reconnect | None = None,
        reconnect_for: timedelta = DEFAULT_RECONNECT_FOR,
    ) -> RelayResult:
        """:meth:`run_once` every ``interval`` until ``stop`` is set; the counts. An error ends it (raised).

        With ``reconnect``, a lost database connection (a failover, a restart, a terminated backend, a network cut)
        does not: it is logged ``harness.relay.connection_lost`` and counted (``harness_relay_connections_lost_total``),
        the relay opens its source and target anew with ``reconnect`` after a growing, capped backoff
        (harness/reconnect.py; ``harness.relay.reconnect_failed`` per failed try, ``harness.relay.reconnected``),
        settles there what the lost connection left (rows the target confirmed are acked, not published again; rows
        to give back are released) and goes on. After ``reconnect_for`` without a connection it raises
        :class:`~harness.reconnect.DatabaseUnavailable` (``harness.relay.error``).
        """
        log.info(
            "harness.relay.start", queues=self.queues, batch_size=self.batch_size, interval_s=interval.total_seconds()
        )
        total = RelayResult()
        ok = False
        outage = Outage(reconnect_for)
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    total.add(self.run_once())
                except Exception as exc:
                    if reconnect is None or not is_lost(self.source.conn):
                        raise
                    self._connection_lost(exc)
                    self._reconnect(reconnect, outage, stop)
                    continue
                waiting.wait(stop, max(0.0, interval.total_seconds() - (time.monotonic() - started)))
            ok = True
        finally:
            log.info("harness.relay.stop", queues=self.queues, **total.fields(), ok=ok)
        return total

    def _connection_lost(self, exc: BaseException) -> None:
        connection_lost = getattr(self.metrics, "relay_connection_lost", None)  # optional in a metrics object
        if connection_lost is not None:
            connection_lost()
        log.warning("harness.relay.connection_lost", queues=self.queues, error=describe_error(exc))

    def _reconnect(self, reconnect: Reconnect, outage: Outage, stop: threading.Event) -> None:
        """A new source and target from ``reconnect``, trying again after each backoff until one opens or ``stop``."""
        outage.begin()
        while not stop.is_set():
            try:
                self.source, self.target = reconnect()
            except psycopg.OperationalError as exc:
                try:
                    attempt, delay = outage.failed(exc)
                except DatabaseUnavailable as gave_up:
                    log.error("harness.relay.error", queues=self.queues, error=str(gave_up))
                    raise
                log.warning(
                    "harness.relay.reconnect_failed",
                    queues=self.queues,
                    attempt=attempt,
                    delay_s=delay,
                    error=describe_error(exc),
                )
                waiting.wait(stop, delay)
                continue
            except Exception as exc:  # not the database (the broker's port would not open): the relay's failure
                log.error("harness.relay.error", queues=self.queues, error=describe_error(exc))
                raise
            lasted = outage.end()
            if lasted is not None:
                log.info("harness.relay.reconnected", queues=self.queues, after_s=lasted[0], attempts=lasted[1])
            return

    def _settle_pending(self, result: RelayResult) -> None:
        """What a lost connection left unsettled, settled on this one: confirmed rows acked, the others released."""
        unacked, self._unacked = self._unacked, []
        unreleased, self._unreleased = self._unreleased, []
        for queue, deliveries in unacked:
            self._published(queue, deliveries, result)
        for queue, deliveries in unreleased:
            self._give_back(queue, deliveries)

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
        try:
            acked = self.source.ack(sendable)
        except Exception:
            if is_lost(self.source.conn):  # acked on the next connection, while their lease lives
                self._unacked.append((queue, sendable))
            raise
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
            if is_lost(self.source.conn):  # released on the next connection
                self._unreleased.append((queue, deliveries))
            log.warning(
                "harness.relay.give_back_failed", queue=queue, num_unreleased=len(deliveries), error=describe_error(exc)
            )
