"""`core-jobs serve`: every registered job on its own cron schedule, with /healthz and /metrics.

APScheduler 3 (``BackgroundScheduler``, in-memory job store, UTC). Each registered job runs on
the crontab of its setting ``CORE_JOBS_SCHEDULE_<JOB>``; a registered job without such a
setting stops `serve` at start with a configuration error (exit 2) naming the setting to add,
and so does an invalid expression. Per job: ``max_instances=1`` (a run still going when the
next one is due makes that one skip, logged as ``maintenance.scheduler.skipped``),
``coalesce=True`` (runs missed while the process was busy or paused become one run) and a
misfire grace of ``CORE_JOBS_SCHEDULER_MISFIRE_GRACE`` (a run that could not start within it
is skipped, logged as ``maintenance.scheduler.missed``). Jobs run in their own threads, so a
long purge never delays the metrics.

Each run goes through the same runner as `run-once` (start/stop/error events, PostgreSQL's
clock, the run metrics), is pushed to the Pushgateway when one is configured, and pings the
Better Stack heartbeat when ``CORE_JOBS_BETTERSTACK_HEARTBEAT_URL`` is set (its ``/fail`` form
after a failed run; set the heartbeat's period to the longest gap between two runs). Two replicas
would not do the same work twice — the jobs take database locks — but one replica is the
intended deployment.

SIGTERM or SIGINT (through :func:`maintenance.runtime.signals.on_signals`, which sets the
``stop`` event the CLI made and also gave the jobs): scheduling stops at once, a purge in hand
stops after its current batch (``stopped_on_signal=1``; the next run carries on), the other runs
in hand finish (``scheduler.shutdown(wait=True)``), the HTTP server closes, and the process exits
0. Give the pod a termination grace period longer than the longest run. The run metrics go to the
:class:`~maintenance.service.telemetry.Telemetry` the CLI made for the process.

Events: ``maintenance.serve.started`` (host, port, schedules), ``maintenance.serve.stopping``
(signal), ``maintenance.serve.stopped``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_RUNNING, BaseScheduler
from apscheduler.triggers.cron import CronTrigger

from harness import waiting
from maintenance.jobs.base import Job, JobSpec
from maintenance.runtime.db import Database
from maintenance.runtime.logs import SecretRedactor, get_logger
from maintenance.runtime.signals import on_signals
from maintenance.service.http import make_server, serve_in_background
from maintenance.service.runner import AfterRun, Runner, build_jobs, job_env
from maintenance.service.telemetry import Telemetry
from maintenance.settings import Settings


class JobScheduler:
    """The registered jobs on an APScheduler scheduler (a BackgroundScheduler unless given one)."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        built: list[tuple[JobSpec[Any], Job]],
        *,
        telemetry: Telemetry,
        scheduler: BaseScheduler | None = None,
        after_run: Sequence[AfterRun] = (),
    ) -> None:
        self.settings = settings
        self.db = db
        self.telemetry = telemetry
        self.runner = Runner(db, telemetry, after_run)
        # /healthz is not a log line: the log redactor never sees it, so its errors are masked here.
        self._redactor = SecretRedactor(settings.secret_values())
        # Every schedule is checked before anything starts (ConfigError names the setting).
        self.schedules = {spec.name: settings.schedule_of(spec.name) for spec, _job in built}
        self.scheduler = scheduler or BackgroundScheduler(
            timezone=UTC, executors={"default": ThreadPoolExecutor(max(1, len(built)))}
        )
        for spec, job in built:
            self.scheduler.add_job(
                self._run,
                CronTrigger.from_crontab(self.schedules[spec.name], timezone=UTC),
                args=(spec, job),
                id=spec.name,
                name=spec.name,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(settings.scheduler_misfire_grace.total_seconds())),
            )
        self.scheduler.add_listener(self._not_run, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)

    def _run(self, spec: JobSpec[Any], job: Job) -> None:
        self.runner.run_one(spec, job, source="core-jobs serve")

    def _not_run(self, event: JobEvent) -> None:
        # Each event name written out, so that docs/reference/events.md (tools.reference) lists it.
        log = get_logger(job=event.job_id)
        if event.code == EVENT_JOB_MISSED:  # a JobExecutionEvent: one run time
            when = event.scheduled_run_time
            log.warning("maintenance.scheduler.missed", scheduled_at=when.isoformat(), reason="misfire grace exceeded")
        else:  # a JobSubmissionEvent: the run times it refused (one, as runs are coalesced)
            when = event.scheduled_run_times[-1]
            log.warning(
                "maintenance.scheduler.skipped", scheduled_at=when.isoformat(), reason="previous run still going"
            )

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        """Stop scheduling and wait for the runs in hand."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def health(self) -> tuple[bool, dict[str, Any]]:
        ok = self.scheduler.state == STATE_RUNNING
        jobs: dict[str, Any] = {}
        for name, cron in self.schedules.items():
            scheduled = self.scheduler.get_job(name)
            last = self.telemetry.last_runs.get(name)
            jobs[name] = {
                "schedule": cron,
                "next_run_time": scheduled.next_run_time.isoformat() if scheduled and scheduled.next_run_time else None,
                "last_run": None
                if last is None
                else {
                    "ok": last.ok,
                    "finished_at": last.finished_at.isoformat(),
                    "duration_s": last.duration_s,
                    "error": None if last.error is None else self._redactor.redact(last.error),
                },
            }
        return ok, {"status": "ok" if ok else "stopped", "jobs": jobs}


def serve(
    settings: Settings, *, stop: threading.Event, telemetry: Telemetry, after_run: Sequence[AfterRun] = ()
) -> int:
    """Run the scheduler and the HTTP server until SIGTERM/SIGINT (or ``stop``); 0 on a clean stop.

    ``stop`` is the command's stop event: the signals set it, and the jobs' batch loops check it. ``after_run``:
    the hooks after each run (the composition root's :func:`maintenance.cli.jobs.after_run_hooks`).
    """
    log = get_logger()
    db = Database(settings.conninfo())
    jobs = JobScheduler(
        settings, db, build_jobs(settings, job_env(settings, db, stop=stop)), telemetry=telemetry, after_run=after_run
    )
    server = make_server(settings.http_host, settings.http_port, health=jobs.health, registry=jobs.telemetry.registry)
    serving = False

    def stopping(signal_name: str) -> None:  # from on_signals' own thread, as the signal comes
        log.info("maintenance.serve.stopping", signal=signal_name)

    # The handlers stay until the runs in hand have finished: a second SIGTERM must not kill them.
    with on_signals(stop, on_signal=stopping):
        try:
            jobs.start()
            serve_in_background(server)
            serving = True
            host, port = server.server_address[:2]
            log.info("maintenance.serve.started", host=host, port=port, schedules=jobs.schedules)
            waiting.wait(stop)  # in slices: a signal another thread caught is handled (harness/waiting.py)
        finally:
            stop.set()  # batch loops (the purge) end after the batch in hand
            jobs.stop()  # the runs in hand finish first
            if serving:
                server.shutdown()
            server.server_close()
    log.info("maintenance.serve.stopped")
    return 0
