"""What the command groups share: the argument types, the ``--limit`` option, the one-line failure report, the
consumer references of ``worker`` and ``check-config``.

Each group (one module per group: ``schema``, ``config``, ``jobs``, ``api``, ``demo``, ``worker``, ``enqueue``,
``dead_letters``, ``relay``, ``executions``, and ``alerts.cli``) takes these from here and its exit codes from
:mod:`maintenance.errors`, never from a sibling (pyproject.toml's import contracts). Light: argparse only, so
``--help`` stays free of every library a command runs with (tests/maintenance/cli/test_imports.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maintenance.settings import Settings

__all__ = ["Handler", "add_limit_option", "bounded_int", "consumer_references", "one_line", "report"]

# What ``set_defaults(handler=...)`` names: a command, run with its arguments and the loaded settings; its exit code.
Handler = Callable[[argparse.Namespace, "Settings"], int]


def report(message: str, settings: Settings | None, args: argparse.Namespace | None = None) -> None:
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


def one_line(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``, else a usage error (exit 2) saying which."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    return parse


def add_limit_option(parser: argparse.ArgumentParser) -> None:
    """``--limit N`` of a list command: 1 to 1 000 000 rows, default 100."""
    parser.add_argument(
        "--limit",
        type=bounded_int(1, 1_000_000),
        default=100,
        metavar="N",
        help="at most N rows, 1-1000000 (default 100)",
    )


def consumer_references(given: list[str] | None, settings: Settings) -> tuple[list[str], str]:
    """The consumer references a command runs or checks, and where they were given: every ``--consumer``, else
    ``CORE_JOBS_WORKER_CONSUMERS`` (worker and check-config alike)."""
    from maintenance.settings import ENV_PREFIX

    if given:
        return given, "--consumer"
    return settings.worker_consumers, f"{ENV_PREFIX}WORKER_CONSUMERS"
