"""The ``core-jobs`` command line.

It answers at once: the parser is built from light modules only, and each command imports what
it needs when it runs (``--help`` loads no library beyond argparse; ``check-config`` the settings
and nothing of the jobs' code, the API, Alembic or APScheduler's scheduler, nor psycopg or httpx
but to check a URL that is not plain, maintenance/fields/urls.py — tests/cli/test_cli_imports.py,
bench/cli.py; only ``migrate``/``downgrade`` load Alembic, only ``serve`` APScheduler's
scheduler). Each
command that runs jobs makes its process's state here and passes it down: one ``stop`` event
(set by SIGTERM/SIGINT through :func:`maintenance.runtime.signals.on_signals`) and one
:class:`~maintenance.service.telemetry.Telemetry`.

Exit codes: 0 all good; 1 a job failed (its error event says why; the next run retries) or the
database or the queue's broker could not be reached or refused a command (one line on stderr); 2
a configuration or usage error, reported before any data is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from alerts import cli as alerts_cli
from maintenance.cli import executions as executions_cli
from maintenance.cli import harness as harness_cli
from maintenance.cli import relay as relay_cli
from maintenance.errors import EXIT_FAILED as EXIT_JOB_FAILED
from maintenance.errors import EXIT_OK
from maintenance.errors import EXIT_USAGE as EXIT_CONFIG

if TYPE_CHECKING:
    from maintenance.service.runner import AfterRun
    from maintenance.service.telemetry import Telemetry
    from maintenance.settings import Settings


SHOWN_DELAYS = 10  # check-config lists this many retry delays of a policy, then a count

Handler = Callable[[argparse.Namespace, "Settings"], int]


def _move_schema(args: argparse.Namespace, settings: Settings, *, down: bool) -> int:
    """``migrate`` or ``downgrade`` to ``args.revision``, each lock wait bounded; one event with both revisions."""
    from maintenance.runtime import migrate
    from maintenance.runtime.logs import get_logger

    conninfo = settings.conninfo()
    timeout, attempts = settings.migrate_lock_timeout, settings.migrate_lock_attempts
    try:
        before = migrate.current_revision(conninfo, lock_timeout=timeout)
        move = migrate.downgrade if down else migrate.upgrade
        move(conninfo, args.revision, lock_timeout=timeout, attempts=attempts, api_role=settings.migrate_api_role)
    except migrate.MigrationBlocked as exc:
        _report(str(exc), settings)
        return EXIT_JOB_FAILED
    after = migrate.current_revision(conninfo)
    if down:
        get_logger().info("maintenance.migrate.downgraded", from_revision=before, to_revision=after)
    else:
        get_logger().info("maintenance.migrate.done", from_revision=before, to_revision=after, changed=before != after)
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    return _move_schema(args, settings, down=False)


def cmd_downgrade(args: argparse.Namespace, settings: Settings) -> int:
    return _move_schema(args, settings, down=True)


def cmd_check_config(args: argparse.Namespace, settings: Settings) -> int:
    from harness.consumer.retry import compute_delay, max_retry_window
    from maintenance.jobs.catalog import NAMES as JOB_NAMES  # the names only: no job's code is imported
    from maintenance.settings import format_duration

    if args.json:
        return _check_config_json(args, settings)
    out = sys.stdout
    out.write("Effective settings (secrets redacted):\n")
    for name, value in settings.effective().items():
        out.write(f"  {name}={value}\n")
    out.write("\nRetry policies (J-B3) and their worst-case retry windows:\n")
    for queue, policy in settings.retry_policies().items():
        label = "default" if queue is None else f"queue {queue}"
        if queue is not None:
            out.write(f"  {label}: justification: {settings.retry_overrides[queue].justification}\n")
        shown = min(policy.max_attempts - 1, SHOWN_DELAYS)  # a huge max_attempts must not print them all
        nominal = [format_duration(compute_delay(policy, k, random=lambda: 0.5)) for k in range(1, shown + 1)]
        if policy.max_attempts - 1 > shown:
            nominal.append(f"… ({policy.max_attempts - 1 - shown} more)")
        out.write(
            f"  {label}: {policy.max_attempts} attempts, nominal delays {', '.join(nominal) or 'none'};"
            f" window {format_duration(max_retry_window(policy))}\n"
        )
    out.write(f"  broker redelivery horizon: {settings.redelivery_horizon().explain()}\n")
    guard = settings.ttl_guard()
    out.write(f"\nTTL guard (J-B7): {guard.explain()}\n")
    out.write(f"\nQueue: {_queue_shown(settings)}\n")
    references, label = harness_cli.consumer_references(args.consumers, settings)
    consumers_ok = _check_consumers(references, label, settings, out)
    durability_ok = True
    if args.tier:
        durability = _durability_document(references, settings)
        durability_ok = durability["ok"]
        out.write(f"\nDurability tier (read from the primary): {durability['tier']}\n  {durability['meaning']}\n")
        for consumer in durability["consumers"]:
            verdict = "ok" if consumer["ok"] else f"REFUSED: {consumer['shortfall']}"
            if consumer["accepted"]:
                verdict = f"accepted (CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION): {consumer['shortfall']}"
            out.write(f"  {consumer['consumer']}: needs {consumer['needs']}: {verdict}\n")
    out.write(f"\nJobs: {', '.join(JOB_NAMES) or '(none registered)'}\n")
    return EXIT_OK if guard.ok and consumers_ok and durability_ok else EXIT_CONFIG


def _check_config_json(args: argparse.Namespace, settings: Settings) -> int:
    """check-config --json: the effective settings (secrets redacted), the guards and the jobs, one document."""
    from maintenance.consumers import consumer_ttl_guard, load_consumer
    from maintenance.jobs.catalog import NAMES as JOB_NAMES
    from maintenance.settings import ENV_PREFIX

    guard = settings.ttl_guard()
    consumers: list[dict[str, Any]] = []
    references, label = harness_cli.consumer_references(args.consumers, settings)
    for reference in references:
        consumer = load_consumer(reference, label)
        consumer_guard = consumer_ttl_guard(settings, consumer)
        consumers.append(
            {
                "consumer": consumer.name,
                "reference": reference,
                "guard": {"ok": consumer_guard.ok, "explanation": consumer_guard.explain()},
            }
        )
    durability = _durability_document(references, settings) if args.tier else None
    ok = guard.ok and all(c["guard"]["ok"] for c in consumers) and (durability is None or durability["ok"])
    effective = settings.effective()
    document = {
        "ok": ok,
        "settings": effective,
        "guard": {"ok": guard.ok, "explanation": guard.explain()},
        "queue": {"url": effective[f"{ENV_PREFIX}QUEUE_URL"], "adapter": settings.queue_adapter()},
        "redelivery_horizon": _horizon_document(settings),
        "consumers": consumers,
        "durability": durability,
        "jobs": list(JOB_NAMES),
    }
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    return EXIT_OK if ok else EXIT_CONFIG


def _durability_document(references: list[str], settings: Settings) -> dict[str, Any]:
    """check-config --tier: the database's durability tier, read from the primary
    (harness/durability.py), what it means, and per consumer what it needs and whether the worker would start."""
    import psycopg

    from harness.durability import needs_of, read_tier
    from harness.errors import describe_error
    from harness.pg import connect
    from harness.queue.adapters import url_scheme
    from maintenance.consumers import load_consumer

    try:
        with connect(settings.conninfo(), autocommit=True, primary_only=True, connect_timeout=10) as conn:
            tier = read_tier(conn)
    except psycopg.Error as exc:  # ServerInRecovery among them: the worker would not start either
        return {"ok": False, "tier": f"unknown ({describe_error(exc)})", "meaning": "", "fields": None, "consumers": []}
    broker = url_scheme(settings.queue_url_value()) is not None
    barrier = settings.worker_await_standby is not None
    accepting = settings.worker_accept_asynchronous_replication
    consumers = []
    for reference in references:
        needs = needs_of(load_consumer(reference), broker=broker)
        shortfall = tier.shortfall(needs, barrier=barrier)
        consumers.append(
            {
                "consumer": reference,
                "needs": needs.describe(),
                "ok": shortfall is None or accepting,
                "accepted": shortfall is not None and accepting,
                "shortfall": shortfall,
            }
        )
    return {
        "ok": all(c["ok"] for c in consumers),
        "tier": tier.describe(),
        "meaning": tier.meaning(),
        "fields": tier.fields(),
        "barrier": barrier,
        "consumers": consumers,
    }


def _horizon_document(settings: Settings) -> dict[str, Any]:
    """The TTL guard's broker horizon for check-config --json: the one used, the setting, the adapter's and its source."""
    from maintenance.settings import format_duration

    horizon = settings.redelivery_horizon()
    adapter = horizon.adapter
    return {
        "value": format_duration(horizon.value),
        "setting": format_duration(horizon.setting),
        "adapter": None
        if adapter is None
        else {"name": adapter.adapter, "horizon": format_duration(adapter.horizon), "source": adapter.source},
        "explanation": horizon.explain(),
    }


def _queue_shown(settings: Settings) -> str:
    """The adapter CORE_JOBS_QUEUE_URL selects (harness/queue/adapters.py), and why."""
    from harness.queue.adapters import url_scheme
    from maintenance.settings import ENV_PREFIX

    scheme = url_scheme(settings.queue_url_value())
    why = (
        f"{ENV_PREFIX}QUEUE_URL unset: the reference queue, core.queue_messages in the {ENV_PREFIX}DATABASE_URL database"
        if scheme is None
        else f"selected by the scheme {scheme}"
    )
    return f"{settings.queue_adapter()} ({why})"


def _check_consumers(references: list[str], label: str, settings: Settings, out: Any) -> bool:
    """check-config --consumer: each consumer's own window (a durable one's execution window,
    harness/durable/window.py) and its TTL guard, worded as the settings' guard; False if any is short."""
    if not references:
        return True
    from harness.durable.window import max_execution_window, max_takes  # the harness's consumer model: psycopg
    from maintenance.consumers import consumer_ttl_guard, load_consumer
    from maintenance.settings import format_duration

    ok = True
    out.write("\nConsumers (J-B7; a durable consumer's window counts its actions' retries and take-overs):\n")
    for reference in references:
        consumer = load_consumer(reference, label)
        queue_policy = settings.retry_policy(consumer.queue)
        window = max_execution_window(consumer, queue_policy, settings.worker_lease)
        if consumer.durable:
            actions = ", ".join(f"{a.name} {a.effect.value} {a.policy.max_attempts} attempts" for a in consumer.actions)
            takes = max_takes(consumer, queue_policy)
            shape = (
                f"durable, actions {actions}; final write {consumer.policy(queue_policy).max_attempts} attempts;"
                f" at most {takes} takes x lease {format_duration(settings.worker_lease)};"
                f" execution window {format_duration(window)}"
            )
        else:
            shape = f"no actions; retry window {format_duration(window)}"
        guard = consumer_ttl_guard(settings, consumer)
        ok = ok and guard.ok
        out.write(f"  {consumer.name} ({reference}): {shape}\n    TTL guard: {guard.explain()}\n")
    return ok


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
    return EXIT_OK if ok else EXIT_JOB_FAILED


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.service.scheduler import serve  # APScheduler and the HTTP server: only for serve
    from maintenance.service.telemetry import Telemetry

    telemetry = Telemetry()
    return serve(settings, stop=threading.Event(), telemetry=telemetry, after_run=after_run_hooks(settings, telemetry))


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.api.server import serve as serve_api  # FastAPI and uvicorn: only for api

    return serve_api(settings, host=args.host, port=args.port)


# The demo is a distribution of its own (demo/pyproject.toml), installed by `uv sync` in a clone (the dev
# group) and by neither `uv sync --no-dev` nor `pip install core-jobs`: a production image has no demo.
DEMO_MISSING = (
    "the demo is not installed (a production install leaves it out): "
    "in a clone of the repository, `uv sync` installs it (core-jobs-demo), then `uv run core-jobs demo`"
)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    try:
        from core_jobs_demo import run_demo
    except ImportError as exc:
        if exc.name != "core_jobs_demo":
            raise  # the demo is there but something it imports is not: a real error, with its traceback
        _report(f"usage error: demo: {DEMO_MISSING}", settings)
        return EXIT_CONFIG
    from maintenance.runtime.logs import configure_logging

    if not args.verbose:
        # The demo prints its own human summary; the job events would drown it.
        configure_logging(fmt=settings.log_format, level="ERROR", secrets=settings.secret_values())
    return run_demo(settings, keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="core-jobs",
        description="Maintenance and alerting jobs for core.processed_jobs and core.dead_letters.",
        epilog="Exit codes: 0 ok, 1 a job failed or a database error, 2 configuration or usage error. "
        "Settings come from CORE_JOBS_* environment variables (see check-config).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply the schema migrations (idempotent)")
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    p.set_defaults(handler=cmd_migrate)

    p = sub.add_parser("downgrade", help="revert the schema to REVISION ('base' removes it all)")
    p.add_argument("revision")
    p.set_defaults(handler=cmd_downgrade)

    p = sub.add_parser("check-config", help="print the effective settings and the TTL/retry-window guard")
    p.add_argument(
        "--consumer",
        dest="consumers",
        action="append",
        metavar="MODULE:OBJECT",
        help="also check this consumer's own window against the TTL (repeatable), e.g. harness.examples.points:consumer",
    )
    p.add_argument(
        "--tier",
        action="store_true",
        help="also read the database's durability tier from the primary, and check each --consumer's needs against it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document (settings, guards, jobs) instead")
    p.set_defaults(handler=cmd_check_config)

    p = sub.add_parser("run-once", help="run the named jobs once (all when none is named)")
    p.add_argument("jobs", nargs="*", metavar="JOB")
    p.add_argument(
        "--json", action="store_true", help="print each job's outcome and fields as one JSON document; events to stderr"
    )
    p.set_defaults(handler=cmd_run_once)

    p = sub.add_parser("serve", help="run every job on its cron schedule, with /healthz and /metrics, until SIGTERM")
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser(
        "api", help="serve the operations HTTP API (dead letters, executions) until SIGTERM (docs/api.md)"
    )
    p.add_argument("--host", help="listen address (default CORE_JOBS_API_HOST)")
    p.add_argument("--port", type=int, help="listen port, 0 for any free one (default CORE_JOBS_API_PORT)")
    p.set_defaults(handler=cmd_api)

    p = sub.add_parser("demo", help="run the jobs against an embedded PostgreSQL with realistic data")
    p.add_argument("--keep", action="store_true", help="keep the embedded database's folder afterwards")
    p.add_argument("--verbose", action="store_true", help="also print every job's log events")
    p.set_defaults(handler=cmd_demo)

    # The consumer harness: worker, enqueue, dead-letters.
    harness_cli.add_commands(sub)
    # The outbox's relay to a broker.
    relay_cli.add_commands(sub)
    # Durable-action executions, read-only.
    executions_cli.add_commands(sub)
    # The alert identity of a database that may be a copy.
    alerts_cli.add_commands(sub)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, a usage error 2
        return int(exc.code or 0)
    from maintenance.runtime.logs import configure_logging
    from maintenance.runtime.tracing import configure_tracing
    from maintenance.settings import ConfigError, load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        _report(f"configuration error: {exc}", None, args)
        return EXIT_CONFIG
    # --json: stdout is the one JSON document; the log events go to stderr.
    logs_to = sys.stderr if getattr(args, "json", False) else None
    configure_logging(
        fmt=settings.log_format, level=settings.log_level, secrets=settings.secret_values(), stream=logs_to
    )
    try:
        configure_tracing()  # only when OTEL_* asks for it (maintenance/runtime/tracing.py)
        return args.handler(args, settings)
    except (
        ConfigError
    ) as exc:  # one line, secrets masked: it may quote a user's module (maintenance/consumers.py::load_consumer)
        _report(f"configuration error: {exc}", settings, args)
        return EXIT_CONFIG
    except Exception as exc:
        code = _known_failure(exc, args, settings)
        if code is None:
            raise
        return code


def _known_failure(exc: Exception, args: argparse.Namespace, settings: Settings) -> int | None:
    """The exit code of a failure reported as one line on stderr; None for any other (a traceback).

    Alembic and SQLAlchemy are looked up only if the command loaded them: an error of theirs
    cannot come from a command that did not.
    """
    import psycopg

    from harness.errors import describe_error
    from harness.pg import SchemaNotMigrated

    if isinstance(exc, SchemaNotMigrated):  # an unmigrated database: what is missing, and what to run
        _report(f"schema error: {exc}", settings)
        return EXIT_CONFIG
    alembic_util: Any = sys.modules.get("alembic.util")
    if alembic_util is not None and isinstance(exc, alembic_util.CommandError):  # e.g. a revision that does not exist
        _report(f"usage error: {args.command}: {exc}", settings)
        return EXIT_CONFIG
    sqlalchemy_exc: Any = sys.modules.get("sqlalchemy.exc")
    database_errors = (psycopg.Error,) + ((sqlalchemy_exc.DBAPIError,) if sqlalchemy_exc is not None else ())
    if isinstance(exc, database_errors):
        # The database could not be reached or refused the command: one line, not a traceback.
        error = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps psycopg's error
        _report(f"database error: {describe_error(error)}", settings)  # its message, not the row its DETAIL quotes
        return EXIT_JOB_FAILED
    broker = harness_cli.broker_failure(exc, settings)
    if broker is not None:  # the queue's broker could not be reached or refused: one line naming host:port
        _report(f"broker error: {broker}", settings)
        return EXIT_JOB_FAILED
    return None


def _report(message: str, settings: Settings | None, args: argparse.Namespace | None = None) -> None:
    """A failure on stderr as one line, every secret masked (stderr does not pass through the log redactor).

    ``check-config --json`` also answers it on stdout, as its one document: ``{"ok": false, "error": ...}``.
    Without settings (they could not be loaded) the credential shapes are still masked.
    """
    from maintenance.runtime.logs import SecretRedactor

    secrets = settings.secret_values() if settings is not None else ()
    text = SecretRedactor(secrets).redact(" ".join(message.split()))
    if args is not None and args.command == "check-config" and args.json:
        sys.stdout.write(json.dumps({"ok": False, "error": text}, indent=2) + "\n")
    print(f"core-jobs: {text}", file=sys.stderr)


# A shell's exit status for a process ended by SIGPIPE: what `yes | head -1` reports for `yes`.
EXIT_BROKEN_PIPE = 128 + 13


def run() -> None:
    """The console script: ``main``, and a reader that went away (``… | head``) ends it quietly.

    Python ignores SIGPIPE (the long-running commands must survive a peer closing a socket), so a
    write to a closed pipe raises BrokenPipeError instead of ending the process as it ends a Unix
    tool. Every command ends here the way such a tool does: no traceback, status 128 + SIGPIPE.
    stdout is pointed at /dev/null first, so the interpreter's last flush cannot fail again.
    """
    try:
        code = main()
        sys.stdout.flush()  # inside the try: a reader that left after the last write is noticed here
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    sys.exit(code)
