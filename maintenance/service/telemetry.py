"""Prometheus telemetry of job runs: recorded by the runner, pushed, served and shown by /healthz.

Every run of every job is recorded generically (the runner calls :meth:`Telemetry.record`):

========================================================  =======  =====================================
metric                                                    type     meaning
========================================================  =======  =====================================
``core_jobs_job_runs_total{job_name,outcome}``            counter  runs by outcome (``success``/``failure``)
``core_jobs_job_duration_seconds{job_name}``              gauge    wall-clock duration of the last run
``core_jobs_job_last_success_timestamp_seconds{job_name}`` gauge   Unix time the last successful run ended
========================================================  =======  =====================================

What a job's result means to Prometheus is declared by the job, in its SPEC's ``result_metrics``
(:class:`maintenance.jobs.base.ResultMetric`): one gauge per quantity in base units, e.g.
``core_jobs_purge_rows_deleted{job_name}`` or ``core_jobs_purge_longest_batch_seconds{job_name}``
(the stop event's ``longest_batch_ms`` / 1000). They are set by every run that returned a result,
ok or not; a run that raised leaves them as the last result set them (a zero would claim, e.g.,
that no expired row is left). They carry ``job_name`` like the run series, so the series are
the same served by ``serve`` and pushed (where ``job_name`` is the grouping key).
docs/reference/metrics.md lists them all, generated from the declarations.

A job whose result has ``metric_families()`` (the metrics job) adds its own families; the
latest ones are served and pushed with the job's run metrics.

No ``<counter>_created`` series are served or pushed: they would double every counter on the
Pushgateway for a start time that, in run-once mode, is just the pod's. They are left out by
this module's collectors, not by prometheus_client's process-wide switch.

There is no process-wide telemetry: each ``core-jobs`` process makes one :class:`Telemetry` in
its command (``run-once``, ``serve``) and passes it to the runner and the scheduler.

The label is ``job_name``, not ``job``: Prometheus and the Pushgateway own ``job`` (the scrape
job, and the Pushgateway's grouping key, which overwrites a pushed ``job`` label).

Pushing: with ``CORE_JOBS_METRICS_PUSHGATEWAY_URL`` set, :meth:`Telemetry.push` sends one job's
series to ``<url>/metrics/job/core-jobs/job_name/<job>`` (the batch-job convention: one group
per job): PUT after a success (the group is replaced), POST after a failure (only the pushed
families are replaced, so the last success timestamp of an earlier run survives). A failed
push logs ``maintenance.metrics.push_failed`` and returns False; it never fails the run. Events
show the gateway as ``scheme://host/…`` only: its path may carry a token. In run-once mode each
process starts from zero, so a pushed ``core_jobs_job_runs_total`` only says how this process's
run ended: alert on
``core_jobs_job_last_success_timestamp_seconds`` (or the Pushgateway's ``push_time_seconds``)
instead; under ``serve`` the counter is a real counter on /metrics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import default_handler, push_to_gateway, pushadd_to_gateway
from prometheus_client.metrics_core import Metric

from harness.errors import describe_error
from maintenance.fields.urls import shown_url
from maintenance.jobs.base import ResultMetric
from maintenance.runtime.logs import get_logger

PUSH_JOB = "core-jobs"
JOB_LABEL = "job_name"


@dataclass(frozen=True)
class LastRun:
    """What /healthz shows for one job."""

    ok: bool
    finished_at: datetime
    duration_s: float
    error: str | None


def _without_created(families: Iterable[Metric]) -> Iterator[Metric]:
    """The families without their ``_created`` samples (see the module docstring)."""
    for family in families:
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        if samples or not family.samples:
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = samples
            yield kept


class _RunSeries:
    """The run series of a registry, without ``_created`` samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from _without_created(self.registry.collect())


class _JobFamilies:
    """A collector yielding the job-specific families (e.g. success volume) of the latest runs."""

    def __init__(self, telemetry: Telemetry, only: str | None = None) -> None:
        self.telemetry = telemetry
        self.only = only

    def collect(self) -> Iterator[Metric]:
        with self.telemetry._lock:
            families = dict(self.telemetry._families)
        for name, metrics in families.items():
            if self.only is None or name == self.only:
                yield from _without_created(metrics)


class _OneJob:
    """One job's slice of the registry: its run series and its own families (what a push sends)."""

    def __init__(self, telemetry: Telemetry, name: str) -> None:
        self.telemetry = telemetry
        self.name = name

    def collect(self) -> Iterator[Metric]:
        for family in _without_created(self.telemetry._run_registry.collect()):
            samples = [s for s in family.samples if s.labels.get(JOB_LABEL) == self.name]
            if samples:
                sliced = Metric(family.name, family.documentation, family.type, family.unit)
                sliced.samples = samples
                yield sliced
        yield from _JobFamilies(self.telemetry, only=self.name).collect()


class Telemetry:
    """The run metrics of this process and the latest job-specific families, in one registry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, list[Metric]] = {}
        self.last_runs: dict[str, LastRun] = {}
        self._run_registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter(
            "core_jobs_job_runs",
            "Job runs by outcome (success or failure).",
            [JOB_LABEL, "outcome"],
            registry=self._run_registry,
        )
        self.duration = Gauge(
            "core_jobs_job_duration_seconds",
            "Wall-clock duration of the job's last run.",
            [JOB_LABEL],
            registry=self._run_registry,
        )
        self.last_success = Gauge(
            "core_jobs_job_last_success_timestamp_seconds",
            "Unix time at which the job's last successful run ended.",
            [JOB_LABEL],
            registry=self._run_registry,
        )
        self._results: dict[str, Gauge] = {}
        # What /metrics serves: the run series plus every job's own families.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_RunSeries(self._run_registry))
        self.registry.register(_JobFamilies(self))

    def result_gauge(self, metric: ResultMetric) -> Gauge:
        """The gauge of one declared result metric, made on first use."""
        with self._lock:
            gauge = self._results.get(metric.name)
            if gauge is None:
                gauge = Gauge(metric.name, metric.documentation, [JOB_LABEL], registry=self._run_registry)
                self._results[metric.name] = gauge
            return gauge

    def record(self, outcome: Any, result_metrics: Iterable[ResultMetric] = ()) -> None:
        """Record one run (a runner ``JobOutcome``: name, ok, fields, duration_s, error, result).

        ``result_metrics`` (the job's SPEC declares them) are set from the fields of a run that
        returned a result; a run that raised sets none of them.
        """
        name, ok, fields, duration_s = outcome.name, outcome.ok, outcome.fields, outcome.duration_s
        error, result = outcome.error, outcome.result
        finished = time.time()
        self.runs.labels(name, "success" if ok else "failure").inc()
        self.duration.labels(name).set(duration_s)
        if ok:
            self.last_success.labels(name).set(finished)
        if result is not None:
            for metric in result_metrics:
                value = metric.value(fields)
                if value is not None:
                    self.result_gauge(metric).labels(name).set(value)
        families = getattr(result, "metric_families", None)
        with self._lock:
            if callable(families):
                self._families[name] = list(families())
            self.last_runs[name] = LastRun(ok, datetime.fromtimestamp(finished, UTC), duration_s, error)

    def job_registry(self, name: str) -> CollectorRegistry:
        """A registry holding only job ``name``'s series: what its push sends."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_OneJob(self, name))
        return registry

    def push(self, gateway_url: str | None, name: str, *, timeout_s: float = 10.0) -> bool:
        """Push job ``name``'s series to the Pushgateway; False (and a log event) when it fails.

        After a success: PUT, replacing the job's group (series that vanished, e.g. a queue's
        age gauge, go with it). After a failure: POST, replacing only the families pushed, so
        the last success timestamp an earlier run pushed stays (a PUT would delete it, and an
        alert on ``time() - core_jobs_job_last_success_timestamp_seconds`` would fall silent).
        """
        if not gateway_url:
            return False
        log = get_logger(job=name)
        last = self.last_runs.get(name)
        push = push_to_gateway if last is None or last.ok else pushadd_to_gateway
        try:
            push(
                gateway_url,
                job=PUSH_JOB,
                registry=self.job_registry(name),
                grouping_key={JOB_LABEL: name},
                timeout=timeout_s,
                handler=default_handler,
            )
        except Exception as exc:  # a monitoring outage must not fail the job
            error = describe_error(exc).replace(gateway_url, shown_url(gateway_url))
            log.warning("maintenance.metrics.push_failed", gateway=shown_url(gateway_url), error=error)
            return False
        log.info("maintenance.metrics.pushed", gateway=shown_url(gateway_url), grouping_key=f"{JOB_LABEL}={name}")
        return True


@dataclass(frozen=True)
class Pushgateway:
    """The after-run hook that pushes each job's series from ``telemetry`` (``CORE_JOBS_METRICS_PUSHGATEWAY_URL``,
    ``CORE_JOBS_METRICS_PUSH_TIMEOUT``); built once by the composition root, only when a URL is set."""

    telemetry: Telemetry
    url: str
    timeout_s: float

    def __call__(self, outcomes: Sequence[Any], source: str) -> None:
        for outcome in outcomes:
            self.telemetry.push(self.url, outcome.name, timeout_s=self.timeout_s)
