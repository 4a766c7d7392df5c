"""``core-jobs run-once`` and ``serve``: the jobs of the catalog, through one Runner and the same after-run hooks.

Each makes its process's state here and passes it down: one ``stop`` event (set by SIGTERM/SIGINT through
:func:`maintenance.runtime.signals.on_signals`) and one :class:`~maintenance.service.telemetry.Telemetry`. Only
``serve`` loads APScheduler's scheduler. Exit 0 when every job succeeded, 1 when one failed (its error event says
why; the next run retries), 2 a configuration error (an unknown job among them), before any job runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import TYPE_CHECKING

from maintenance.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from maintenance.service.runner import AfterRun
    from maintenance.service.telemetry import Telemetry
    from maintenance.settings import Settings


def after_run_hooks(settings: Settings, telemetry: Telemetry) -> list[AfterRun]:
    """What runs after the jobs of a run, for run-once and serve alike: the Pushgateway push and the Better Stack
    heartbeat, each built once here from its own settings, and only when its URL is set."""
    from alerts.heartbeat import Heartbeat
    from maintenance.service.telemetry import Pushgateway

    hooks: list[AfterRun] = []
    if settings.metrics_pushgateway_url:
        hooks.append(
            Pushgateway(telemetry, settings.metrics_pushgateway_url, settings.metrics_push_timeout.total_seconds())
        )
    if settings.betterstack_heartbeat_url is not None:  # the dead-man's switch of each run
        hooks.append(
            Heartbeat(
                settings.betterstack_heartbeat_url.get_secret_value(), settings.betterstack_timeout.total_seconds()
            )
        )
    return hooks


def cmd_run_once(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.runtime.db import Database
    from maintenance.runtime.logs import get_logger
    from maintenance.runtime.signals import on_signals
    from maintenance.service.runner import Runner, build_jobs, job_env
    from maintenance.service.telemetry import Telemetry

    stop, telemetry = threading.Event(), Telemetry()
    db = Database(settings.conninfo())
    built = build_jobs(settings, job_env(settings, db, stop=stop), args.jobs)
    runner = Runner(db, telemetry, after_run_hooks(settings, telemetry))

    def stopping(signal_name: str) -> None:
        get_logger().info("maintenance.run.stopping", signal=signal_name)

    with on_signals(stop, on_signal=stopping):  # a SIGTERM lets the batch in hand finish and starts no further job
        outcomes = runner.run(built, stop=stop, source="core-jobs run-once")
    ok = all(o.ok for o in outcomes)
    if args.json:  # the stop/error events' figures, as one document on stdout (the events went to stderr)
        runs = [
            {"job": o.name, "ok": o.ok, "duration_s": o.duration_s, "error": o.error, "fields": o.fields}
            for o in outcomes
        ]
        sys.stdout.write(json.dumps({"ok": ok, "jobs": runs}, indent=2, default=str) + "\n")
    return EXIT_OK if ok else EXIT_FAILED


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.service.scheduler import serve  # APScheduler and the HTTP server: only for serve
    from maintenance.service.telemetry import Telemetry

    telemetry = Telemetry()
    return serve(settings, stop=threading.Event(), telemetry=telemetry, after_run=after_run_hooks(settings, telemetry))


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``run-once`` and ``serve`` on the ``core-jobs`` parser."""
    p = sub.add_parser("run-once", help="run the named jobs once (all when none is named)")
    p.add_argument("jobs", nargs="*", metavar="JOB")
    p.add_argument(
        "--json", action="store_true", help="print each job's outcome and fields as one JSON document; events to stderr"
    )
    p.set_defaults(handler=cmd_run_once)

    p = sub.add_parser("serve", help="run every job on its cron schedule, with /healthz and /metrics, until SIGTERM")
    p.set_defaults(handler=cmd_serve)
