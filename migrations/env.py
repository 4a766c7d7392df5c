"""Alembic environment for core-jobs.

Run through `core-jobs migrate` (maintenance/runtime/migrate.py), which hands over an open SQLAlchemy
connection in ``config.attributes["connection"]``. The version table lives in schema ``core``
next to the tables it versions. A transaction-scoped advisory lock serialises concurrent
migrators (two pods running the pre-upgrade hook at once).
"""

from alembic import context
from sqlalchemy import text

MIGRATION_LOCK = "core_jobs.migrate"

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the bare alembic CLI
    raise RuntimeError("run migrations with `core-jobs migrate`, which supplies the connection")

connection.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": MIGRATION_LOCK})
# Bounded lock waits from here on (maintenance/runtime/migrate.py retries a timed-out attempt). Set after
# the advisory lock: waiting for another migrator is waiting for its own bounded attempts.
lock_timeout_ms = context.config.attributes.get("lock_timeout_ms")
if lock_timeout_ms is not None:
    connection.execute(text("SELECT set_config('lock_timeout', :value, true)"), {"value": f"{int(lock_timeout_ms)}ms"})
connection.execute(text("CREATE SCHEMA IF NOT EXISTS core"))
# CORE_JOBS_MIGRATE_API_ROLE (maintenance/runtime/migrate.py): false, and the migrations skip the role core_jobs_api
# (migrations/api_role.py). Absent (a caller that does not say): true, as before.
context.config.attributes.setdefault("api_role", True)
context.configure(connection=connection, version_table_schema="core", transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
