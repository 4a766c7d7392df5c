"""Counters of the harness: successes are metrics, not rows (J-B9).

What the harness counts goes to a :class:`Metrics` the caller passes to
:func:`harness.handling.handle` and :class:`harness.worker.Worker` (``metrics=``). The default,
:data:`NO_METRICS`, counts nothing, so the harness needs no metrics library. The Prometheus one,
:class:`HarnessMetrics`, needs the ``metrics`` extra (``core-jobs-harness[metrics]``, i.e.
prometheus-client), imported only when one is made:

=====================================  ==========  ===================================================
metric                                 labels      counts
=====================================  ==========  ===================================================
``harness_jobs_processed_total``       consumer    jobs whose work and fence committed
``harness_jobs_duplicates_total``      consumer    deliveries skipped because the fence existed (J-B2)
``harness_jobs_retries_total``         consumer    transient failures scheduled for another attempt
``harness_jobs_dead_lettered_total``   consumer,   jobs written to core.dead_letters; reason is
                                       reason      ``poison``, ``permanent`` or ``exhausted``
=====================================  ==========  ===================================================

The retry and dead-letter counters count the harness's decisions (:func:`harness.handling.handle`).
A worker whose lease ran out cannot settle its decision — nothing is written, ``harness.job.lease_lost``
is logged — and the next delivery decides again, so these two may count a job more than once;
``core.dead_letters`` is the record of what was written.

A service makes one :class:`HarnessMetrics` in its ``main()`` (on prometheus_client's default
registry unless given another — a registry takes the counters once) and passes it down;
``core-jobs worker`` makes its own on a registry of its own, which ``--metrics-port`` serves. Tests build their own :class:`HarnessMetrics` on a private registry. Another backend
(StatsD, OpenTelemetry) is any object with the four methods of :class:`Metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["NO_METRICS", "HarnessMetrics", "Metrics", "NoMetrics"]


class Metrics(Protocol):
    """What the harness counts, one call per decision on a delivery."""

    def processed(self, consumer: str) -> None: ...

    def duplicate(self, consumer: str) -> None: ...

    def retry(self, consumer: str) -> None: ...

    def dead_lettered(self, consumer: str, reason: str) -> None: ...


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


NO_METRICS = NoMetrics()


class HarnessMetrics:
    """The ``harness_jobs_*_total`` Prometheus counters in ``registry`` (default: prometheus_client's)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        try:
            from prometheus_client import REGISTRY, Counter
        except ImportError as exc:
            raise ImportError(
                "harness.metrics.HarnessMetrics needs prometheus-client: install"
                " core-jobs-harness[metrics], or pass no metrics (counts nothing)"
            ) from exc
        self.registry = REGISTRY if registry is None else registry
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

    def processed(self, consumer: str) -> None:
        self._processed.labels(consumer).inc()

    def duplicate(self, consumer: str) -> None:
        self._duplicates.labels(consumer).inc()

    def retry(self, consumer: str) -> None:
        self._retries.labels(consumer).inc()

    def dead_lettered(self, consumer: str, reason: str) -> None:
        self._dead_lettered.labels(consumer, reason).inc()

    def value(self, name: str, **labels: str) -> float:
        """The current value of one counter (``name`` without ``_total``), 0 when never incremented."""
        return self.registry.get_sample_value(f"harness_jobs_{name}_total", labels) or 0.0
