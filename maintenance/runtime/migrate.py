"""Schema migrations (Alembic, scripts in ``migrations/``), applied by ``core-jobs migrate``.

``upgrade`` is idempotent: at head it does nothing. The version table is ``core.alembic_version``.
Concurrent migrators serialise on an advisory lock (see migrations/env.py).

A migration's DDL queues for its table's lock behind every open transaction on that table, and
every query of the jobs and the API then queues behind the migration: one forgotten ``BEGIN`` in
a psql session would stop the migration for ever and, behind it, the platform. So ``core-jobs
migrate`` bounds each wait (``lock_timeout``, ``CORE_JOBS_MIGRATE_LOCK_TIMEOUT``, set once the
advisory lock is held); a wait that runs out rolls the whole attempt back (transactional DDL:
nothing half-applied), lets the queries queued behind it through, and tries again, up to
``CORE_JOBS_MIGRATE_LOCK_ATTEMPTS`` times. Then it gives up with :class:`MigrationBlocked`,
naming the sessions that hold locks in the database (pid, user, application, state, how long
their transaction has been open — never their query text, which may carry literals).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger

MIGRATIONS_DIR = (
    Path(__file__).resolve().parents[2] / "migrations"
)  # beside maintenance/, in the tree and in site-packages


def _engine(conninfo: str) -> sqlalchemy.Engine:
    """An engine whose connections libpq opens from ``conninfo`` itself, as every job's are (``Database``).

    SQLAlchemy never parses the URL: its reading differs from libpq's (a multi-host URL, which
    every job accepts, would fail here alone).
    """
    return sqlalchemy.create_engine(
        "postgresql+psycopg://",
        creator=Database(conninfo).connect,
        poolclass=sqlalchemy.pool.NullPool,
    )


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


class MigrationBlocked(Exception):
    """Every attempt of a migration ran out of ``lock_timeout`` waiting for a lock; nothing was applied."""


# Who holds a lock in this database now: what the operator must end or wait for. No query text.
LOCK_HOLDERS = """
SELECT a.pid, a.usename, a.application_name, a.state,
       date_trunc('second', now() - a.xact_start) AS transaction_age
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
  AND a.pid IN (SELECT l.pid FROM pg_locks AS l
                JOIN pg_database AS d ON d.oid = l.database AND d.datname = current_database()
                WHERE l.granted AND l.relation IS NOT NULL)
ORDER BY a.xact_start
LIMIT 5
"""


def _lock_holders(conninfo: str) -> str:
    with Database(conninfo).connect(autocommit=True) as conn:
        rows = conn.execute(LOCK_HOLDERS).fetchall()
    return (
        "; ".join(
            f"pid {pid} (user {user}, application {app or '-'}, {state}, transaction open {age})"
            for pid, user, app, state, age in rows
        )
        or "none any more"
    )


def _blocked(conninfo: str, what: str, attempts: int, lock_timeout: timedelta) -> MigrationBlocked:
    return MigrationBlocked(
        f"{what} gave up after {attempts} attempt(s), each waiting {lock_timeout.total_seconds():g} s for a lock; "
        f"nothing was applied. Sessions holding locks in this database: {_lock_holders(conninfo)}. End or wait "
        "for them, then run `core-jobs migrate` again (CORE_JOBS_MIGRATE_LOCK_TIMEOUT, CORE_JOBS_MIGRATE_LOCK_ATTEMPTS)"
    )


def _run(
    conninfo: str,
    action: Callable[[Config, str], None],
    revision: str,
    lock_timeout: timedelta | None,
    attempts: int,
    pause: Callable[[float], None],
    api_role: bool = True,
) -> None:
    for attempt in range(1, attempts + 1):
        engine = _engine(conninfo)
        try:
            with engine.begin() as connection:
                config = _config()
                config.attributes["connection"] = connection
                config.attributes["lock_timeout_ms"] = None if lock_timeout is None else _milliseconds(lock_timeout)
                config.attributes["api_role"] = api_role  # migrations/api_role.py
                action(config, revision)
            return
        except sqlalchemy.exc.OperationalError as exc:
            if lock_timeout is None or not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
                raise
            if attempt == attempts:
                raise _blocked(conninfo, f"migration to {revision}", attempts, lock_timeout) from None
            get_logger().warning(
                "maintenance.migrate.lock_timeout",
                revision=revision,
                attempt=attempt,
                attempts=attempts,
                lock_timeout_s=lock_timeout.total_seconds(),
            )
            # Let the queries that queued behind our lock request through before asking again.
            pause(lock_timeout.total_seconds())
        finally:
            engine.dispose()


def _milliseconds(duration: timedelta) -> int:
    return max(1, round(duration.total_seconds() * 1000))


def upgrade(
    conninfo: str,
    revision: str = "head",
    *,
    lock_timeout: timedelta | None = None,
    attempts: int = 1,
    pause: Callable[[float], None] = time.sleep,
    api_role: bool = True,
) -> None:
    """Bring the schema up to ``revision`` (default: the newest).

    ``api_role`` False (``CORE_JOBS_MIGRATE_API_ROLE=false``): the migrations neither create the cluster-wide role
    ``core_jobs_api`` nor grant it anything (migrations/api_role.py).

    With ``lock_timeout``, each lock wait is bounded and a timed-out attempt is rolled back and
    tried again after a pause as long as the timeout, ``attempts`` times in all; then
    :class:`MigrationBlocked`. Without it, waits are as long as the session's own setting.
    """
    _run(conninfo, command.upgrade, revision, lock_timeout, attempts, pause, api_role)


def downgrade(
    conninfo: str,
    revision: str,
    *,
    lock_timeout: timedelta | None = None,
    attempts: int = 1,
    pause: Callable[[float], None] = time.sleep,
    api_role: bool = True,
) -> None:
    """Take the schema down to ``revision`` (``base`` removes everything core-jobs created); waits as ``upgrade``'s.

    ``api_role`` False: the role ``core_jobs_api`` is neither revoked from nor dropped."""
    _run(conninfo, command.downgrade, revision, lock_timeout, attempts, pause, api_role)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(conninfo: str, *, lock_timeout: timedelta | None = None) -> str | None:
    """The revision the database is at, or None when it was never migrated.

    With ``lock_timeout``, a version table locked for longer is :class:`MigrationBlocked`.
    """
    engine = _engine(conninfo)
    try:
        with engine.connect() as connection:
            if lock_timeout is not None:
                value = f"{_milliseconds(lock_timeout)}ms"
                connection.execute(
                    sqlalchemy.text("SELECT set_config('lock_timeout', :value, false)"), {"value": value}
                )
            context = MigrationContext.configure(connection, opts={"version_table_schema": "core"})
            return context.get_current_revision()
    except sqlalchemy.exc.OperationalError as exc:
        if lock_timeout is None or not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
            raise
        raise _blocked(conninfo, "reading the schema's revision", 1, lock_timeout) from None
    finally:
        engine.dispose()
