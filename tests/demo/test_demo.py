"""`core-jobs demo` runs every job on realistic data and cleans up after itself (issue 2, point 8)."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import psycopg

import core_jobs_demo
from maintenance.cli import main
from maintenance.errors import EXIT_OK


def test_demo_on_a_configured_server_uses_a_scratch_database(clean_env, pg_server_url, capsys):
    """With a database configured, the demo seeds a scratch database, prints its summary, and drops that database."""
    used: list[str] = []
    real_scratch_database = core_jobs_demo.scratch_database

    @contextlib.contextmanager
    def noted_scratch_database(server_url: str):  # the real one, its name noted: other sessions run demos too
        with real_scratch_database(server_url) as url:
            used.append(urlsplit(url).path.lstrip("/"))
            yield url

    clean_env.setattr(core_jobs_demo, "scratch_database", noted_scratch_database)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", pg_server_url)
    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "Seeded:" in out and "Rows per table (before -> after):" in out
    assert "core.dead_letters: 31 ->" in out
    [name] = used
    assert name.startswith("core_jobs_demo_")
    with psycopg.connect(pg_server_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)


def test_demo_without_a_database_starts_an_embedded_one(clean_env, capsys):
    """With no database configured, the demo starts an embedded PostgreSQL and exits 0."""
    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "Starting an embedded PostgreSQL" in out
    assert "Demo finished" in out


def test_demo_seed_places_rows_in_every_state_it_describes(db, conn):
    """The seed leaves 6 replayed and 2 discarded dead letters beside the pending ones, as its story says."""
    from core_jobs_demo.data import seed

    seed(db)
    counts = dict(conn.execute("SELECT status, count(*) FROM core.dead_letters GROUP BY status").fetchall())
    assert counts == {"pending_review": 23, "replayed": 6, "discarded": 2}
