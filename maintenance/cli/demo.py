"""``core-jobs demo``: the jobs run against an embedded PostgreSQL with realistic data (demo/, core-jobs-demo).

The one module of the bundle that imports the demo, and only when the command runs (pyproject.toml's contracts).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from maintenance.cli.common import report
from maintenance.errors import EXIT_USAGE

if TYPE_CHECKING:
    from maintenance.settings import Settings

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
        report(f"usage error: demo: {DEMO_MISSING}", settings)
        return EXIT_USAGE
    from maintenance.runtime.logs import configure_logging

    if not args.verbose:
        # The demo prints its own human summary; the job events would drown it.
        configure_logging(fmt=settings.log_format, level="ERROR", secrets=settings.secret_values())
    return run_demo(settings, keep=args.keep)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``demo`` on the ``core-jobs`` parser."""
    p = sub.add_parser("demo", help="run the jobs against an embedded PostgreSQL with realistic data")
    p.add_argument("--keep", action="store_true", help="keep the embedded database's folder afterwards")
    p.add_argument("--verbose", action="store_true", help="also print every job's log events")
    p.set_defaults(handler=cmd_demo)
