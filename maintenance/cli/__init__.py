"""The ``core-jobs`` command line: its parser, composed of one module per command group, and its entry point.

It answers at once: the parser is built from light modules only, and each command imports what
it needs when it runs (``--help`` loads no library beyond argparse; ``check-config`` the settings
and nothing of the jobs' code, the API, Alembic or APScheduler's scheduler, nor psycopg or httpx
but to check a URL that is not plain, maintenance/fields/urls.py — tests/maintenance/cli/test_imports.py,
bench/cli.py; only ``migrate``/``downgrade`` load Alembic, only ``serve`` APScheduler's
scheduler). The groups: ``schema`` (migrate, downgrade), ``config`` (check-config), ``jobs``
(run-once, serve), ``api``, ``demo``, ``worker``, ``enqueue``, ``dead_letters``, ``relay``,
``executions``, and the alerting family's ``alerts.cli``; what they share is in ``common``.

Exit codes (:mod:`maintenance.errors`): 0 all good; 1 a job failed (its error event says why; the next run retries)
or the database or the queue's broker could not be reached or refused a command (one line on stderr); 2
a configuration or usage error, reported before any data is touched.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any

from alerts import cli as alerts_cli
from maintenance.cli import api, config, dead_letters, demo, enqueue, executions, jobs, relay, schema, worker
from maintenance.cli.common import report
from maintenance.errors import EXIT_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from maintenance.settings import Settings

# Each group registers its commands, in the order --help lists them.
GROUPS = (schema, config, jobs, api, demo, worker, enqueue, dead_letters, relay, executions, alerts_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="core-jobs",
        description="Maintenance and alerting jobs for core.processed_jobs and core.dead_letters.",
        epilog="Exit codes: 0 ok, 1 a job failed or a database error, 2 configuration or usage error. "
        "Settings come from CORE_JOBS_* environment variables (see check-config).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(sub)
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
        report(f"configuration error: {exc}", None, args)
        return EXIT_USAGE
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
        report(f"configuration error: {exc}", settings, args)
        return EXIT_USAGE
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
        report(f"schema error: {exc}", settings)
        return EXIT_USAGE
    alembic_util: Any = sys.modules.get("alembic.util")
    if alembic_util is not None and isinstance(exc, alembic_util.CommandError):  # e.g. a revision that does not exist
        report(f"usage error: {args.command}: {exc}", settings)
        return EXIT_USAGE
    sqlalchemy_exc: Any = sys.modules.get("sqlalchemy.exc")
    database_errors = (psycopg.Error,) + ((sqlalchemy_exc.DBAPIError,) if sqlalchemy_exc is not None else ())
    if isinstance(exc, database_errors):
        # The database could not be reached or refused the command: one line, not a traceback.
        error = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps psycopg's error
        report(f"database error: {describe_error(error)}", settings)  # its message, not the row its DETAIL quotes
        return EXIT_FAILED
    broker = worker.broker_failure(exc, settings)
    if broker is not None:  # the queue's broker could not be reached or refused: one line naming host:port
        report(f"broker error: {broker}", settings)
        return EXIT_FAILED
    return None


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


# Deprecated, for one minor version: names this module defined before each group had its own (and the exit codes'
# second spelling); each warns and names its one home.
_MOVED = {
    "EXIT_OK": "maintenance.errors:EXIT_OK",
    "EXIT_JOB_FAILED": "maintenance.errors:EXIT_FAILED",
    "EXIT_CONFIG": "maintenance.errors:EXIT_USAGE",
    "Handler": "maintenance.cli.common:Handler",
    "SHOWN_DELAYS": "maintenance.cli.config:SHOWN_DELAYS",
    "DEMO_MISSING": "maintenance.cli.demo:DEMO_MISSING",
    "after_run_hooks": "maintenance.cli.jobs:after_run_hooks",
    **{f"cmd_{name}": f"maintenance.cli.schema:cmd_{name}" for name in ("migrate", "downgrade")},
    "cmd_check_config": "maintenance.cli.config:cmd_check_config",
    **{f"cmd_{name}": f"maintenance.cli.jobs:cmd_{name}" for name in ("run_once", "serve")},
    "cmd_api": "maintenance.cli.api:cmd_api",
    "cmd_demo": "maintenance.cli.demo:cmd_demo",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'maintenance.cli' has no attribute {name!r}")
    module, new = _MOVED[name].split(":")
    warnings.warn(
        f"maintenance.cli.{name} is deprecated and goes in the next minor version: use {module}.{new}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module(module), new)
