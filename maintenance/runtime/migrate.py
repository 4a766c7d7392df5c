"""Schema migrations (Alembic, scripts in ``migrations/``), applied by ``core-jobs migrate``.

``upgrade`` is idempotent: at head it does nothing. The version table is ``core.alembic_version``.
Concurrent migrators serialise on an advisory lock (see migrations/env.py).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from maintenance.runtime.db import Database

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


def _run(conninfo: str, action, revision: str) -> None:
    engine = _engine(conninfo)
    try:
        with engine.begin() as connection:
            config = _config()
            config.attributes["connection"] = connection
            action(config, revision)
    finally:
        engine.dispose()


def upgrade(conninfo: str, revision: str = "head") -> None:
    """Bring the schema up to ``revision`` (default: the newest)."""
    _run(conninfo, command.upgrade, revision)


def downgrade(conninfo: str, revision: str) -> None:
    """Take the schema down to ``revision`` (``base`` removes everything core-jobs created)."""
    _run(conninfo, command.downgrade, revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(conninfo: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = _engine(conninfo)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table_schema": "core"})
            return context.get_current_revision()
    finally:
        engine.dispose()
