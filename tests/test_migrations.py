"""`core-jobs migrate` is idempotent and the schema goes down and up again cleanly (issue 2, point 5)."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest
import sqlalchemy.exc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from maintenance.runtime import migrate


def core_tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'core'")}


def test_upgrade_twice_is_a_no_op(empty_database_url):
    """A second upgrade on a migrated database succeeds and changes nothing."""
    migrate.upgrade(empty_database_url)
    first = core_tables(empty_database_url)
    migrate.upgrade(empty_database_url)
    assert core_tables(empty_database_url) == first
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert {"processed_jobs", "dead_letters", "alembic_version"} <= first


def test_downgrade_to_base_then_upgrade_again(empty_database_url):
    """Down to base removes every table but the version table; up again restores the schema."""
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")
    assert core_tables(empty_database_url) == {"alembic_version"}
    assert migrate.current_revision(empty_database_url) is None
    migrate.upgrade(empty_database_url)
    assert {"processed_jobs", "dead_letters"} <= core_tables(empty_database_url)


def multi_host_url(url: str) -> str:
    """The same database behind a libpq multi-host URL (its one host listed twice), as HA setups write them."""
    p = conninfo_to_dict(url)
    host, port = p.get("host", "localhost"), p.get("port", "5432")
    auth = quote(p.get("user", ""), safe="") + (":" + quote(p["password"], safe="") if p.get("password") else "")
    return f"postgresql://{auth}@:{port},:{port}/{p['dbname']}?host={host},{host}"


def test_migrate_reads_the_url_as_libpq_does(empty_database_url):
    """A multi-host URL, which libpq (and so every job) accepts, migrates too."""
    url = multi_host_url(empty_database_url)
    migrate.upgrade(url)
    assert migrate.current_revision(url) == migrate.head_revision()


def test_migrators_take_turns_on_the_advisory_lock(empty_database_url):
    """While another session holds the migration lock, migrate waits for it (here: times out) and creates nothing."""
    impatient = make_conninfo(empty_database_url, options="-c lock_timeout=200")
    with psycopg.connect(empty_database_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('core_jobs.migrate'))")
        with pytest.raises(sqlalchemy.exc.OperationalError) as info:
            migrate.upgrade(impatient)
        assert isinstance(info.value.orig, psycopg.errors.LockNotAvailable)
        assert migrate.current_revision(empty_database_url) is None
    migrate.upgrade(impatient)  # the lock is free again
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()


def test_fresh_database_reports_no_revision(empty_database_url):
    """A never-migrated database has no current revision."""
    assert migrate.current_revision(empty_database_url) is None


def test_fence_columns_match_the_seed(database_url):
    """core.processed_jobs has exactly the seed's columns, all NOT NULL."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'core' AND table_name = 'processed_jobs' ORDER BY ordinal_position"
        ).fetchall()
    assert rows == [
        ("job_id", "uuid", "NO"),
        ("consumer", "text", "NO"),
        ("tenant_id", "uuid", "NO"),
        ("processed_at", "timestamp with time zone", "NO"),
        ("expires_at", "timestamp with time zone", "NO"),
    ]
