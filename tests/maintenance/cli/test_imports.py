"""What the CLI's commands that touch no database import, which is what makes them answer at once (issue 20).

A whole ``core-jobs`` process is mostly imports: ``--help`` must answer in ≤ 0.3 s and
``check-config`` in ≤ 0.5 s (``bench/cli.py`` measures them). Timing a test on a shared machine
proves nothing, so these tests keep the cause instead: each runs the command in a fresh
interpreter and asserts that the heavy libraries it has no use for were not imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from maintenance.cli import build_parser

# Never needed to print help or to check the settings, each a tenth of a second or more to import.
HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "sqlalchemy",
    "alembic",
    "apscheduler.schedulers",
    "psycopg",
    "psycopg_pool",
    "prometheus_client",
    "opentelemetry.sdk",
    "rich",  # structlog imports it when installed, for tracebacks the log never renders
    "click",
    "pygments",
    # Our own modules that import those: the jobs' code, the API, `serve`, Better Stack's client.
    "maintenance.jobs.purge.job",
    "alerts.feed",
    "maintenance.jobs.metrics.job",
    "maintenance.api",
    "maintenance.service",
    "alerts.betterstack",
    "alerts.heartbeat",
    "maintenance.operations.dead_letters",
    "maintenance.runtime.db",
)
# What a --help needs is argparse and the parser's modules: not even the settings' libraries.
HEAVY_FOR_HELP = (*HEAVY, "pydantic", "pydantic_settings", "structlog", "opentelemetry", "maintenance.settings")

# Runs main() once per argv (a JSON list of argv lists) in this fresh interpreter, output discarded;
# prints the exit codes and every module then imported.
RUN_AND_LIST_MODULES = """
import contextlib, io, json, sys
from maintenance.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
print(json.dumps([codes, sorted(sys.modules)]))
"""

# check-config reads a database URL it must never connect to: nothing listens on port 9.
UNREACHABLE_DATABASE_URL = "postgresql://app:not-used@127.0.0.1:9/core"


def modules_after(argvs: list[list[str]]) -> tuple[list[int], list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_") or "TEST" in k}
    env["CORE_JOBS_DATABASE_URL"] = UNREACHABLE_DATABASE_URL
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, json.dumps(argvs)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    codes, modules = json.loads(done.stdout.splitlines()[-1])
    return codes, modules


def imported(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden packages (or any of their submodules) among ``modules``."""
    return sorted({f for f in forbidden for m in modules if m == f or m.startswith(f + ".")})


def help_argvs(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """``--help`` of the parser and of every subcommand, nested ones included."""
    parser = parser or build_parser()
    argvs = [[*prefix, "--help"]]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                argvs += help_argvs(sub, (*prefix, name))
    return argvs


def test_help_of_every_command_imports_no_library_a_command_runs_with():
    """`core-jobs --help` and every subcommand's --help exit 0 having imported none of the heavy libraries, nor pydantic, structlog or the settings: help is argparse and the parser's own modules."""
    argvs = help_argvs()
    assert len(argvs) > 20  # the walk found the subcommands, nested ones included
    codes, modules = modules_after(argvs)
    assert codes == [0] * len(argvs)
    assert imported(modules, HEAVY_FOR_HELP) == []


@pytest.mark.parametrize("argv", [["check-config"], ["check-config", "--json"]], ids=["text", "json"])
def test_check_config_imports_the_settings_but_no_job_code_database_driver_or_server(argv):
    """check-config exits 0 having imported the settings (pydantic-settings) but none of the heavy libraries — not psycopg, so it cannot have connected to the database — and none of the jobs' code."""
    codes, modules = modules_after([argv])
    assert codes == [0]
    assert "pydantic_settings" in modules and "maintenance.settings" in modules  # it did load the settings
    assert imported(modules, HEAVY) == []
