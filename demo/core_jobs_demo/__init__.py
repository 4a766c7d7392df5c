"""``core-jobs demo``: every job, once, against a throwaway database full of realistic rows.

With no ``CORE_JOBS_DATABASE_URL`` it starts an embedded PostgreSQL (pgserver, Unix socket
only, data under the system temp dir) and removes it afterwards. With one configured it never
touches that database: it creates a scratch database ``core_jobs_demo_<random>`` on the same
server and drops it at the end.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

from psycopg import sql
from pydantic import SecretStr

from core_jobs_demo.api import walk_through as api_walk_through
from core_jobs_demo.data import seed
from core_jobs_demo.durable import walk_through as durable_walk_through
from core_jobs_demo.explain import EXPLAIN
from core_jobs_demo.harness import walk_through
from harness.examples import points
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from maintenance.service.runner import build_jobs, job_env, run_jobs
from maintenance.service.telemetry import Telemetry
from maintenance.settings import Settings


@contextlib.contextmanager
def embedded_postgres(keep: bool = False, prefix: str = "core-jobs-demo-") -> Iterator[str]:
    """An embedded PostgreSQL for the duration of the block (data in a temp dir ``<prefix>…``); yields its libpq URL.

    Also the tests' last-resort server (tests/conftest.py), which is why it lives here, with pgserver,
    and not in core-jobs: a production install has neither.
    """
    warnings.filterwarnings("ignore", module="platformdirs")
    import pgserver  # heavy import: only the demo and the tests' last resort need it

    pgdata = tempfile.mkdtemp(prefix=prefix)
    server = pgserver.get_server(pgdata, cleanup_mode=None if keep else "delete")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()


def with_database(url: str, name: str) -> str:
    """``url`` pointed at database ``name`` on the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "core_jobs_demo") -> Iterator[str]:
    """A new, empty database ``<prefix>_<random>`` on ``server_url``'s server, dropped afterwards."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    server = Database(server_url)
    with server.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(server_url, name)
    finally:
        with server.connect(autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def table_counts(db: Database) -> dict[str, int]:
    """Rows per table of schema core (the version table aside)."""
    with db.connect(autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'core' AND tablename <> 'alembic_version' ORDER BY 1"
            )
        ]
        counts = {}
        for t in tables:
            row = conn.execute(sql.SQL("SELECT count(*) FROM core.{}").format(sql.Identifier(t))).fetchone()
            assert row is not None  # count(*): always one row
            counts[t] = row[0]
        return counts


def run_demo(settings: Settings, *, keep: bool = False, out=None) -> int:
    out = out or sys.stdout
    with contextlib.ExitStack() as stack:
        if settings.database_url is None:
            out.write("Starting an embedded PostgreSQL (pgserver) under the system temp dir...\n")
            url = stack.enter_context(embedded_postgres(keep))
        else:
            url = stack.enter_context(scratch_database(settings.conninfo()))
            out.write("Using a scratch database on the configured server (dropped afterwards).\n")
        demo_settings = settings.model_copy(update={"database_url": SecretStr(url)})
        db = Database(url)
        migrate.upgrade(url)
        out.write(f"Migrated to {migrate.current_revision(url)}.\n")
        with db.connect(autocommit=True) as conn:  # the example consumer's own table: the demo's, not the schema's
            points.create_table(conn)
        story = seed(db)
        before = table_counts(db)
        out.write("\nSeeded:\n" + "".join(f"  - {line}\n" for line in story))
        stop = threading.Event()  # the demo runs every job to its end: nothing sets it
        built = build_jobs(demo_settings, job_env(demo_settings, db, stop=stop))
        outcomes = run_jobs(built, db, Telemetry(), stop=stop)
        after = table_counts(db)

        out.write("\nJobs run once:\n")
        if not outcomes:
            out.write("  (no jobs registered yet)\n")
        for (spec, _job), outcome in zip(built, outcomes, strict=True):
            shown = ", ".join(f"{k}={v}" for k, v in outcome.fields.items())
            status = "ok" if outcome.ok else f"FAILED: {outcome.error}"
            out.write(f"  {outcome.name}: {status}; {shown}\n")
            explain = EXPLAIN.get(spec.name)
            if explain is not None and outcome.result is not None:
                out.write("".join(f"      {line}\n" for line in explain(db, outcome.result)))
        out.write("\nRows per table (before -> after):\n")
        for table in sorted(before):
            out.write(f"  core.{table}: {before[table]} -> {after.get(table, 0)}\n")
        out.write("\nThe consumer harness, with the example points consumer (harness/examples/points.py):\n")
        walk_through(demo_settings, db, out)
        out.write(
            "\nDurable actions (docs/durable-actions.md): the ledger points consumer"
            " (harness/examples/ledger_points.py) against a local loyalty ledger:\n"
        )
        durable_walk_through(demo_settings, db, out)
        out.write("\nThe operations API (core-jobs api, docs/api.md), over HTTP:\n")
        api_walk_through(demo_settings, out)
        out.write("\nDemo finished; the database is being removed.\n" if not keep else "\nDemo finished.\n")
        return 0 if all(o.ok for o in outcomes) else 1
