"""CORE_JOBS_MIGRATE_API_ROLE=false: the migrations leave the cluster-wide role core_jobs_api alone.

Roles are cluster-wide and the other tests' databases share ``core_jobs_api`` (it exists on the test
server while they run), so these tests never drop or create it. They observe instead what this run
did: every statement the migrations sent (a SQLAlchemy cursor listener, removed afterwards) — no
``CREATE ROLE core_jobs_api``, no ``GRANT … TO core_jobs_api``, no ``REVOKE``/``DROP ROLE`` — and
what this database grants the role afterwards (its ACLs in the catalog): nothing. What the guard
does when the role is absent is shown by 0025's function under a role name no cluster has.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from importlib import import_module

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import event
from support.factories import QUEUE

from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from maintenance.cli import main
from maintenance.errors import EXIT_OK
from maintenance.runtime import migrate

API_ROLE = "core_jobs_api"
TOUCHES_THE_ROLE = re.compile(
    rf"CREATE ROLE {API_ROLE}\b|DROP ROLE {API_ROLE}\b|\bTO {API_ROLE}\b|\bFROM {API_ROLE}\b", re.IGNORECASE
)

# Everything this database grants the role: on relations, sequences, functions, schemas.
GRANTED_TO_THE_ROLE = """
SELECT count(*) FROM (
    SELECT (aclexplode(relacl)).grantee FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'core' AND relacl IS NOT NULL
    UNION ALL
    SELECT (aclexplode(proacl)).grantee FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'core' AND proacl IS NOT NULL
    UNION ALL
    SELECT (aclexplode(nspacl)).grantee FROM pg_namespace WHERE nspname = 'core' AND nspacl IS NOT NULL
    UNION ALL
    SELECT (aclexplode(attacl)).grantee FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'core' AND attacl IS NOT NULL
) AS g WHERE g.grantee = to_regrole(%s)
"""


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every SQL statement sent through SQLAlchemy (the migrations') while the test runs."""
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        sent.append(statement)

    event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", record)
    yield sent
    event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", record)


def granted_to_api_role(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(GRANTED_TO_THE_ROLE, (API_ROLE,)).fetchone()[0]


def test_migrate_with_the_api_role_off_neither_creates_nor_grants_it(clean_env, empty_database_url, statements):
    """`CORE_JOBS_MIGRATE_API_ROLE=false core-jobs migrate`: to head, no statement about core_jobs_api, no grant to it."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    clean_env.setenv("CORE_JOBS_MIGRATE_API_ROLE", "false")
    assert main(["migrate"]) == EXIT_OK
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert [s for s in statements if TOUCHES_THE_ROLE.search(s)] == []
    assert granted_to_api_role(empty_database_url) == 0
    with psycopg.connect(empty_database_url) as conn:  # the worker and relay roles are still granted theirs
        assert conn.execute(
            "SELECT has_table_privilege('core_jobs_worker', 'core.processed_jobs', 'INSERT')"
        ).fetchone()[0]


def test_migrate_by_default_creates_and_grants_the_api_role(clean_env, empty_database_url, statements):
    """The default is unchanged: the run asks for the role (created if missing) and grants it its privileges."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == EXIT_OK
    assert any(f"CREATE ROLE {API_ROLE} NOLOGIN" in s for s in statements)
    assert granted_to_api_role(empty_database_url) > 0


def test_with_the_api_role_off_publishing_works_and_downgrade_and_upgrade_still_run(empty_database_url, statements):
    """A database migrated without the role publishes (the guard binds nobody), goes down to base and up to head
    again with the setting off, and never touches the role on the way."""
    migrate.upgrade(empty_database_url, api_role=False)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        PgQueue(conn).publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"member_id": "m-1", "points": 1}))
        assert conn.execute("SELECT core.acts_as_api_role()").fetchone()[0] is False
    migrate.downgrade(empty_database_url, "base", api_role=False)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('core.dead_letters')").fetchone()[0] is None
    migrate.upgrade(empty_database_url, api_role=False)
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert [s for s in statements if TOUCHES_THE_ROLE.search(s)] == []
    assert granted_to_api_role(empty_database_url) == 0


def test_the_api_role_check_answers_false_for_a_role_the_cluster_does_not_have(conn):
    """0025's core.acts_as_api_role(), under a role name no cluster has: false, where pg_has_role would raise."""
    absent = f"core_jobs_api_absent_{uuid.uuid4().hex[:12]}"
    function = import_module("migrations.versions.0025_api_role_optional").ACTS_AS_API_ROLE
    conn.execute(function.replace(API_ROLE, absent).replace("core.acts_as_api_role()", "pg_temp.acts_as_absent_role()"))
    assert conn.execute("SELECT pg_temp.acts_as_absent_role()").fetchone()[0] is False
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT pg_has_role(current_user, %s, 'USAGE')", (absent,))


def test_the_api_role_check_still_binds_a_session_acting_as_the_role(conn):
    """With the role present (0025 at head), a session that SET ROLE core_jobs_api acts as it; the owner does not."""
    assert conn.execute("SELECT core.acts_as_api_role()").fetchone()[0] is False
    conn.execute(f"SET ROLE {API_ROLE}")
    try:
        assert conn.execute("SELECT core.acts_as_api_role()").fetchone()[0] is True
    finally:
        conn.execute("RESET ROLE")
