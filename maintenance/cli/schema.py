"""``core-jobs migrate`` and ``downgrade``: the schema moved to a revision by Alembic (maintenance/runtime/migrate.py).

Each lock wait is bounded (``CORE_JOBS_MIGRATE_LOCK_TIMEOUT``, ``_ATTEMPTS``); a migration still blocked after them is
one line on stderr and exit 1. One event with both revisions: ``maintenance.migrate.done`` or ``.downgraded``. Only
these two commands load Alembic.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from maintenance.cli.common import report
from maintenance.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from maintenance.settings import Settings


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
        report(str(exc), settings)
        return EXIT_FAILED
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


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``migrate`` and ``downgrade`` on the ``core-jobs`` parser."""
    p = sub.add_parser("migrate", help="apply the schema migrations (idempotent)")
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    p.set_defaults(handler=cmd_migrate)

    p = sub.add_parser("downgrade", help="revert the schema to REVISION ('base' removes it all)")
    p.add_argument("revision")
    p.set_defaults(handler=cmd_downgrade)
