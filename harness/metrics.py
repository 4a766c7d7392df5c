"""Prometheus counters of the harness: successes are metrics, not rows (J-B9).

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

:data:`METRICS` lives in prometheus_client's default registry (what a ``/metrics`` endpoint
serves); tests build their own :class:`HarnessMetrics` on a private registry.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter

__all__ = ["HarnessMetrics", "METRICS"]


class HarnessMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.processed = Counter(
            "harness_jobs_processed", "Jobs whose work and fence committed.", ["consumer"], registry=registry
        )
        self.duplicates = Counter(
            "harness_jobs_duplicates", "Deliveries skipped: the fence already existed.", ["consumer"], registry=registry
        )
        self.retries = Counter(
            "harness_jobs_retries", "Transient failures scheduled for another attempt.", ["consumer"], registry=registry
        )
        self.dead_lettered = Counter(
            "harness_jobs_dead_lettered", "Jobs written to core.dead_letters.", ["consumer", "reason"], registry=registry
        )

    def value(self, name: str, **labels: str) -> float:
        """The current value of one counter (``name`` without ``_total``), 0 when never incremented."""
        return self.registry.get_sample_value(f"harness_jobs_{name}_total", labels) or 0.0


METRICS = HarnessMetrics()
