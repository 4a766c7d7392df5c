"""Metrics of the harness: successes are metrics, not rows (J-B9).

What the harness counts goes to a :class:`Metrics` the caller passes to
:func:`harness.handling.handle` and :class:`harness.worker.Worker` (``metrics=``). The default,
:data:`NO_METRICS`, counts nothing, so the harness needs no metrics library. The Prometheus one,
:class:`HarnessMetrics`, needs the ``metrics`` extra (``core-jobs-harness[metrics]``, i.e.
prometheus-client), imported only when one is made:

==========================================  ==========  ===================================================
metric                                      labels      meaning
==========================================  ==========  ===================================================
``harness_jobs_processed_total``            consumer    jobs whose work and fence committed
``harness_jobs_duplicates_total``           consumer    deliveries skipped because the fence existed (J-B2)
``harness_jobs_retries_total``              consumer    transient failures scheduled for another attempt
``harness_jobs_dead_lettered_total``        consumer,   jobs written to core.dead_letters; reason is
                                            reason      ``poison``, ``permanent`` or ``exhausted``
``harness_handler_duration_seconds``        consumer    histogram: one delivery handled (validation, handler,
                                                        fence and commit), by the worker
``harness_jobs_in_flight``                  consumer    deliveries being handled right now
``harness_leases_lost_total``               consumer    settlements refused because the lease had run out
                                                        (``harness.job.lease_lost``)
``harness_queue_depth``                     queue       ready messages (due, no live lease), by the worker
``harness_queue_oldest_ready_age_seconds``  queue       how long the oldest ready message has been due
                                                        (0 when none is), on the database's clock
``harness_worker_connections_lost_total``   consumer    worker database connections lost (a failover, a
                                                        restart): each thread reconnects by itself
``harness_relay_published_total``           queue       outbox rows the relay published on the broker
``harness_relay_refused_total``             queue       outbox rows the broker could not take (dead-lettered)
``harness_relay_leases_lost_total``         queue       rows published but acked too late (published again)
``harness_relay_failures_total``            queue       relay runs that failed (``harness.relay.error``)
``harness_relay_connections_lost_total``    (none)      relay database connections lost: it reconnects by
                                                        itself (``harness.relay.connection_lost``)
==========================================  ==========  ===================================================

Every series of a consumer and queue the worker runs is there from the start, at 0
(:meth:`WorkerMetrics.watch`, called when a :class:`~harness.worker.Worker` is made): a rate
or an alert has a series before the first event, and "no data" means the worker is not scraped.

The queue figures are one statement (``harness.queue.pgqueue.QUEUE_FIGURES``) the worker runs
between batches at most every ``WorkerConfig.figures_interval`` (15 s) whatever its concurrency —
never per delivery. With several workers on one queue each reports the same figures: take
``max by (queue)``, not a sum.

The retry and dead-letter counters count the harness's decisions (:func:`harness.handling.handle`).
A worker whose lease ran out cannot settle its decision — nothing is written, ``harness.job.lease_lost``
is logged — and the next delivery decides again, so these two may count a job more than once;
``core.dead_letters`` is the record of what was written.

:func:`harness.handling.handle` needs only :class:`Metrics`, the four decisions; the worker needs
:class:`WorkerMetrics`, which adds the rest.

A service makes one :class:`HarnessMetrics` in its ``main()`` (on prometheus_client's default
registry unless given another — a registry takes the counters once) and passes it down;
``core-jobs worker`` makes its own on a registry of its own, which ``--metrics-port`` serves. Tests build their own :class:`HarnessMetrics` on a private registry. Another backend
(StatsD, OpenTelemetry) is any object with the methods of :class:`WorkerMetrics`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DEAD_LETTER_REASONS", "NO_METRICS", "HarnessMetrics", "Metrics", "NoMetrics", "WorkerMetrics"]

DEAD_LETTER_REASONS = ("poison", "permanent", "exhausted")
# Seconds: a handler is a database transaction plus, maybe, one provider call.
HANDLER_BUCKETS: Sequence[float] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics(Protocol):
    """What the harness counts, one call per decision on a delivery."""

    def processed(self, consumer: str) -> None: ...

    def duplicate(self, consumer: str) -> None: ...

    def retry(self, consumer: str) -> None: ...

    def dead_lettered(self, consumer: str, reason: str) -> None: ...


class WorkerMetrics(Metrics, Protocol):
    """What the worker reports besides the decisions: latency, in-flight, lease losses, its queue."""

    def watch(self, consumer: str, queue: str) -> None:
        """Make every series of ``consumer`` and ``queue`` exist, at 0."""
        ...

    def handling(self, consumer: str) -> None:
        """A delivery's handling started (in-flight + 1)."""
        ...

    def handled(self, consumer: str, seconds: float) -> None:
        """A delivery's handling ended after ``seconds`` (in-flight - 1)."""
        ...

    def leases_lost(self, consumer: str, n: int = 1) -> None: ...

    def queue_figures(self, queue: str, depth: int, oldest_ready_age_s: float) -> None: ...


class NoMetrics:
    """Counts nothing: the default when the caller passes no metrics."""

    def processed(self, consumer: str) -> None:
        pass

    def duplicate(self, consumer: str) -> None:
        pass

    def retry(self, consumer: str) -> None:
        pass

    def dead_lettered(self, consumer: str, reason: str) -> None:
        pass

    def watch(self, consumer: str, queue: str) -> None:
        pass

    def handling(self, consumer: str) -> None:
        pass

    def handled(self, consumer: str, seconds: float) -> None:
        pass

    def leases_lost(self, consumer: str, n: int = 1) -> None:
        pass

    def queue_figures(self, queue: str, depth: int, oldest_ready_age_s: float) -> None:
        pass

    def connection_lost(self, consumer: str) -> None:
        pass

    def relayed(self, queue: str, published: int, refused: int, leases_lost: int) -> None:
        pass

    def relay_failed(self, queue: str) -> None:
        pass

    def relay_connection_lost(self) -> None:
        pass


NO_METRICS = NoMetrics()


class HarnessMetrics:
    """The harness's Prometheus series (the module docstring's table) in ``registry`` (default: prometheus_client's)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        try:
            from prometheus_client import REGISTRY, Counter, Gauge, Histogram
        except ImportError as exc:
            raise ImportError(
                "harness.metrics.HarnessMetrics needs prometheus-client: install"
                " core-jobs-harness[metrics], or pass no metrics (counts nothing)"
            ) from exc
        self.registry = REGISTRY if registry is None else registry
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # (id(metric), label values): its child
        self._processed = Counter(
            "harness_jobs_processed", "Jobs whose work and fence committed.", ["consumer"], registry=self.registry
        )
        self._duplicates = Counter(
            "harness_jobs_duplicates",
            "Deliveries skipped: the fence already existed.",
            ["consumer"],
            registry=self.registry,
        )
        self._retries = Counter(
            "harness_jobs_retries",
            "Transient failures scheduled for another attempt.",
            ["consumer"],
            registry=self.registry,
        )
        self._dead_lettered = Counter(
            "harness_jobs_dead_lettered",
            "Jobs written to core.dead_letters.",
            ["consumer", "reason"],
            registry=self.registry,
        )

        self._duration = Histogram(
            "harness_handler_duration_seconds",
            "One delivery handled: validation, handler, fence and commit.",
            ["consumer"],
            buckets=HANDLER_BUCKETS,
            registry=self.registry,
        )
        self._in_flight = Gauge(
            "harness_jobs_in_flight", "Deliveries being handled right now.", ["consumer"], registry=self.registry
        )
        self._in_flight_counts = _PerThreadCounts()  # what the gauge reads when scraped (watch, _count_in_flight)
        self._leases_lost = Counter(
            "harness_leases_lost",
            "Settlements refused because the worker's lease had run out.",
            ["consumer"],
            registry=self.registry,
        )
        self._connections_lost = Counter(
            "harness_worker_connections_lost",
            "Worker database connections lost (each thread reconnects by itself).",
            ["consumer"],
            registry=self.registry,
        )
        self._relay = {
            name: Counter(f"harness_relay_{name}", text, ["queue"], registry=self.registry)
            for name, text in (
                ("published", "Outbox rows the relay published on the broker."),
                ("refused", "Outbox rows the broker could not take: dead-lettered."),
                ("leases_lost", "Outbox rows published but acked too late: published again."),
                ("failures", "Relay runs that failed (harness.relay.error)."),
            )
        }
        self._relay_connections_lost = Counter(
            "harness_relay_connections_lost",
            "Relay database connections lost (it reconnects by itself: harness.relay.connection_lost).",
            registry=self.registry,
        )
        self._depth = Gauge(
            "harness_queue_depth", "Ready messages: due and under no live lease.", ["queue"], registry=self.registry
        )
        self._oldest_age = Gauge(
            "harness_queue_oldest_ready_age_seconds",
            "How long the oldest ready message has been due (0 when none is).",
            ["queue"],
            registry=self.registry,
        )

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once: a job's counting asks for the same few children every time, and
        prometheus_client's ``labels`` takes a lock and builds its key on each call (~3 % of a drain's Python a job)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def watch(self, consumer: str, queue: str) -> None:
        for per_consumer in (
            self._processed,
            self._duplicates,
            self._retries,
            self._duration,
            self._leases_lost,
            self._connections_lost,
        ):
            per_consumer.labels(consumer)
        self._count_in_flight(consumer)
        for reason in DEAD_LETTER_REASONS:
            self._dead_lettered.labels(consumer, reason)
        self._depth.labels(queue)
        self._oldest_age.labels(queue)

    def _count_in_flight(self, consumer: str) -> None:
        """``consumer``'s in-flight gauge reads its per-thread counts when scraped (installed once)."""
        key = (id(self._in_flight), (consumer,))
        if key not in self._children:
            child = self._in_flight.labels(consumer)
            child.set_function(lambda: self._in_flight_counts.total(consumer))
            self._children[key] = child

    def handling(self, consumer: str) -> None:
        self._count_in_flight(consumer)
        self._in_flight_counts.add(consumer, 1)

    def handled(self, consumer: str, seconds: float) -> None:
        self._in_flight_counts.add(consumer, -1)
        self._child(self._duration, consumer).observe(seconds)

    def leases_lost(self, consumer: str, n: int = 1) -> None:
        self._child(self._leases_lost, consumer).inc(n)

    def relayed(self, queue: str, published: int, refused: int, leases_lost: int) -> None:
        """One relay run's counts of ``queue`` (harness/queue/relay.py)."""
        for name, n in (("published", published), ("refused", refused), ("leases_lost", leases_lost)):
            self._child(self._relay[name], queue).inc(n)

    def relay_failed(self, queue: str) -> None:
        self._child(self._relay["failures"], queue).inc()

    def relay_connection_lost(self) -> None:
        """The relay's database connection was lost (harness/queue/relay.py: it reconnects)."""
        self._relay_connections_lost.inc()

    def connection_lost(self, consumer: str) -> None:
        """Optional in a :class:`WorkerMetrics` (the worker calls it when there): a connection was lost."""
        self._child(self._connections_lost, consumer).inc()

    def queue_figures(self, queue: str, depth: int, oldest_ready_age_s: float) -> None:
        self._child(self._depth, queue).set(depth)
        self._child(self._oldest_age, queue).set(oldest_ready_age_s)

    def processed(self, consumer: str) -> None:
        self._child(self._processed, consumer).inc()

    def duplicate(self, consumer: str) -> None:
        self._child(self._duplicates, consumer).inc()

    def retry(self, consumer: str) -> None:
        self._child(self._retries, consumer).inc()

    def dead_lettered(self, consumer: str, reason: str) -> None:
        self._child(self._dead_lettered, consumer, reason).inc()

    def value(self, name: str, **labels: str) -> float:
        """The current value of one counter (``name`` without ``_total``), 0 when never incremented."""
        return self.registry.get_sample_value(f"harness_jobs_{name}_total", labels) or 0.0


class _PerThreadCounts:
    """Counts by key, each thread adding to a slot of its own — no lock per change, where a Gauge's ``inc`` and ``dec``
    take one each (two a delivery: ~4 % of a drain's Python); :meth:`total` sums the slots when the gauge is read."""

    def __init__(self) -> None:
        self._slots: list[dict[str, int]] = []
        self._local = threading.local()

    def add(self, key: str, n: int) -> None:
        slot: dict[str, int] | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = {}
            self._slots.append(slot)  # atomic; read by total() from another thread
        slot[key] = slot.get(key, 0) + n

    def total(self, key: str) -> int:
        return sum(slot.get(key, 0) for slot in list(self._slots))
