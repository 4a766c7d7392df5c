"""`core-jobs migrate` is idempotent and the schema goes down and up again cleanly (issue 2, point 5)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import quote

import psycopg
import pytest
import sqlalchemy.exc
from alembic.script import ScriptDirectory
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from maintenance.cli import main
from maintenance.errors import EXIT_FAILED
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


@contextlib.contextmanager
def version_table_locked(url: str) -> Iterator[psycopg.Connection]:
    """An open transaction holding an ACCESS EXCLUSIVE lock on core.alembic_version (a forgotten BEGIN in psql)."""
    with psycopg.connect(url) as blocker:
        blocker.execute("LOCK TABLE core.alembic_version IN ACCESS EXCLUSIVE MODE")
        yield blocker


def test_a_migration_blocked_on_a_lock_gives_up_after_its_attempts_naming_the_holder(empty_database_url):
    """Each bounded lock wait is rolled back and retried; after the last, MigrationBlocked names the holding session."""
    migrate.upgrade(empty_database_url, "0012_execution_resolution")
    pauses: list[float] = []
    with version_table_locked(empty_database_url) as blocker:
        holder = blocker.info.backend_pid
        with pytest.raises(migrate.MigrationBlocked) as info:
            migrate.upgrade(
                empty_database_url, lock_timeout=timedelta(milliseconds=50), attempts=3, pause=pauses.append
            )
    assert pauses == [0.05, 0.05]
    assert f"pid {holder} " in str(info.value) and "3 attempt(s)" in str(info.value)
    assert migrate.current_revision(empty_database_url) == "0012_execution_resolution"


def test_a_migration_goes_through_once_the_lock_is_released_between_attempts(empty_database_url):
    """A lock held during the first attempt and released in the pause: the second attempt migrates to head."""
    migrate.upgrade(empty_database_url, "0012_execution_resolution")
    with version_table_locked(empty_database_url) as blocker:
        migrate.upgrade(
            empty_database_url, lock_timeout=timedelta(milliseconds=50), attempts=2, pause=lambda _: blocker.rollback()
        )
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()


def test_migrate_command_blocked_on_a_lock_exits_1_with_one_line(clean_env, empty_database_url, capsys):
    """`core-jobs migrate` with every attempt timed out exits 1 with one line on stderr naming the settings to change."""
    migrate.upgrade(empty_database_url, "0012_execution_resolution")
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    clean_env.setenv("CORE_JOBS_MIGRATE_LOCK_TIMEOUT", "0.05")
    clean_env.setenv("CORE_JOBS_MIGRATE_LOCK_ATTEMPTS", "1")
    with version_table_locked(empty_database_url):
        assert main(["migrate"]) == EXIT_FAILED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CORE_JOBS_MIGRATE_LOCK_TIMEOUT" in err and "nothing was applied" in err


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


# The core schema as the catalog describes it: columns, constraints, indexes, functions, triggers, comments.
SCHEMA_SNAPSHOT = """
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute AS a
  JOIN pg_class AS c ON c.oid = a.attrelid
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
  LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE n.nspname = 'core' AND c.relkind IN ('r', 'v', 'S') AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'core'::regnamespace
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'core'
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc AS p WHERE p.pronamespace = 'core'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) || CASE t.tgenabled WHEN 'D' THEN ' DISABLED' ELSE '' END
  FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'core'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'comment ' || d.objoid::regclass || '.' || d.objsubid || ' ' || d.description
  FROM pg_description AS d JOIN pg_class AS c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
 WHERE c.relnamespace = 'core'::regnamespace
ORDER BY 1
"""


def schema_snapshot(url: str) -> list[str]:
    """The core schema's definitions, sorted. One documented difference is set aside: 0007's downgrade
    restores dead_letter_actions' action check NOT VALID, so the append-only ledger keeps its 'released' rows."""
    with psycopg.connect(url) as conn:
        return [row[0].replace(" NOT VALID", "") for row in conn.execute(SCHEMA_SNAPSHOT)]


def test_each_downgrade_restores_the_schema_its_upgrade_found(empty_database_url):
    """For every revision N: up to N, then up to the head and back down to N, gives N's schema exactly."""
    revisions = [s.revision for s in reversed(list(ScriptDirectory(str(migrate.MIGRATIONS_DIR)).walk_revisions()))]
    assert revisions[-1] == migrate.head_revision()
    for revision in revisions[:-1]:
        migrate.upgrade(empty_database_url, revision)
        before = schema_snapshot(empty_database_url)
        migrate.upgrade(empty_database_url)
        migrate.downgrade(empty_database_url, revision)
        after = schema_snapshot(empty_database_url)
        assert after == before, f"downgrade to {revision}: {sorted(set(before) ^ set(after))}"
