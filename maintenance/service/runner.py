"""Runs the jobs once: the shared start/stop/error events and the exit status.

Every run emits ``<job>.start``, then ``<job>.stop`` with the job's fixed result fields and
``ok``, or ``<job>.error`` with the same fields at zero plus ``error``; all carry ``job``, stop
and error also ``duration_s``. The clock is PostgreSQL's, read once per job run and passed to ``run_once``.

One pipeline for ``core-jobs run-once`` and ``core-jobs serve``: a :class:`Runner` runs a job,
records it in the process's :class:`~maintenance.service.telemetry.Telemetry`, then calls its
after-run hooks (the Pushgateway push, the Better Stack heartbeat), each built once by the
composition root from its own two settings (:func:`maintenance.cli.jobs.after_run_hooks`). The
caller owns the state: the ``stop`` event (set by a SIGTERM through
:func:`maintenance.runtime.signals.on_signals`) goes into the jobs' :class:`JobEnv`, made once
by :func:`job_env` (batch loops check it), and to :meth:`Runner.run` (no further job starts
once it is set).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import tracing
from harness.errors import describe_error
from maintenance.jobs.base import Job, JobEnv, JobSpec
from maintenance.jobs.catalog import by_name as jobs
from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger, redact
from maintenance.runtime.tracing import tracer
from maintenance.service.telemetry import Telemetry
from maintenance.settings import ConfigError, Settings


@dataclass
class JobOutcome:
    """One run of one job: what its ``.stop`` (or ``.error``) event said."""

    name: str
    ok: bool
    fields: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    result: Any = None
    duration_s: float = 0.0


def job_env(settings: Settings, db: Database, *, stop: threading.Event | None = None) -> JobEnv:
    """What every job runs with, read from the settings once: ``stop`` is what the jobs' batch loops check
    (default: an event nobody sets)."""
    return JobEnv(
        db=db,
        ttl_guard=settings.ttl_guard(),
        stop=stop if stop is not None else threading.Event(),
        retry_after_max=settings.retry_after_max,
    )


def build_jobs(settings: Settings, env: JobEnv, names: Iterable[str] = ()) -> list[tuple[JobSpec[Any], Job]]:
    """Build the named jobs (all when none is named), each from its settings and ``env``; ConfigError on any problem."""
    registered = jobs()
    wanted = list(names) or list(registered)
    unknown = [n for n in wanted if n not in registered]
    if unknown:
        valid = ", ".join(registered) or "(none registered)"
        raise ConfigError(f"unknown job {', '.join(unknown)}; valid jobs: {valid}")
    return [(registered[n], registered[n].build(settings, env)) for n in wanted]


def run_job(spec: JobSpec[Any], job: Job, db: Database, telemetry: Telemetry) -> JobOutcome:
    """Run one job once; never raises (a failure becomes ok=False and an error event).

    The outcome is also recorded as Prometheus metrics in ``telemetry``.
    """
    outcome = _run(spec, job, db)
    telemetry.record(outcome, spec.result_metrics)
    return outcome


def _run(spec: JobSpec[Any], job: Job, db: Database) -> JobOutcome:
    # One span per run, a new trace each (maintenance/runtime/tracing.py); its events carry its ids.
    with tracer().start_as_current_span(f"job {spec.name}", attributes={"core_jobs.job": spec.name}) as span:
        outcome = _run_traced(spec, job, db)
        span.set_attribute("core_jobs.ok", outcome.ok)
        if not outcome.ok:
            tracing.set_error(span, outcome.error or "the job reported a failure")
        return outcome


def _run_traced(spec: JobSpec[Any], job: Job, db: Database) -> JobOutcome:
    log = get_logger(job=spec.name)
    started = time.monotonic()
    log.info(f"{spec.events}.start")
    try:
        now = db.server_now()
        result = job.run_once(now)
    except Exception as exc:  # a job failure must not stop the next job
        fields = spec.zero_fields()
        error = redact(describe_error(exc))  # never raises, even for an exception that cannot be printed
        duration_s = round(time.monotonic() - started, 3)
        log.error(f"{spec.events}.error", **fields, duration_s=duration_s, error=error)
        return JobOutcome(spec.name, False, fields, error, duration_s=duration_s)
    fields = result.fields()
    duration_s = round(time.monotonic() - started, 3)
    log.info(f"{spec.events}.stop", **fields, ok=result.ok, duration_s=duration_s)
    return JobOutcome(spec.name, result.ok, fields, result=result, duration_s=duration_s)


def run_jobs(
    built: list[tuple[JobSpec[Any], Job]], db: Database, telemetry: Telemetry, *, stop: threading.Event
) -> list[JobOutcome]:
    """Run the jobs in order; once ``stop`` is set (SIGTERM), start no further job."""
    outcomes: list[JobOutcome] = []
    for index, (spec, job) in enumerate(built):
        if stop.is_set():
            get_logger().warning("maintenance.run.stopped_early", not_started=[s.name for s, _ in built[index:]])
            break
        outcomes.append(run_job(spec, job, db, telemetry))
    return outcomes


# What runs after the jobs of one run: (their outcomes, the command that ran them). A hook never raises into
# the runner: it logs its own failure (a push or a heartbeat that fails must not fail the run).
AfterRun = Callable[[Sequence[JobOutcome], str], None]


class Runner:
    """Run → record → after-run hooks, the one pipeline of ``run-once`` (:meth:`run`) and ``serve`` (:meth:`run_one`)."""

    def __init__(self, db: Database, telemetry: Telemetry, after_run: Sequence[AfterRun] = ()) -> None:
        self.db = db
        self.telemetry = telemetry
        self.after_run = tuple(after_run)

    def run(self, built: list[tuple[JobSpec[Any], Job]], *, stop: threading.Event, source: str) -> list[JobOutcome]:
        """Every job of ``built`` in order (none started once ``stop`` is set), then the hooks once, for them all."""
        outcomes = run_jobs(built, self.db, self.telemetry, stop=stop)
        self._after(outcomes, source)
        return outcomes

    def run_one(self, spec: JobSpec[Any], job: Job, *, source: str) -> JobOutcome:
        """One job, then the hooks for it."""
        outcome = run_job(spec, job, self.db, self.telemetry)
        self._after([outcome], source)
        return outcome

    def _after(self, outcomes: Sequence[JobOutcome], source: str) -> None:
        for hook in self.after_run:
            hook(outcomes, source)
