"""Test fixtures: a real PostgreSQL, and a fresh migrated database per test.

Where the server comes from, in order: ``CORE_JOBS_TEST_DATABASE_URL`` when set; else
Testcontainers when a Docker engine answers; else an embedded pgserver (the demo's, a dev
dependency). Once per session the schema is migrated into a template database; each test gets its own copy
(``CREATE DATABASE … TEMPLATE``, a few milliseconds), dropped afterwards. Names carry the
process id, so parallel sessions on one server never collide — nor do the workers of
``pytest -n auto`` (pytest-xdist: each worker is a process, with its own template). What is
cluster-wide is shared with them: a test that looks at ``pg_stat_activity`` or ``pg_locks`` keeps
to its own database (``datname = current_database()``), names a role or database it creates at
random, and reconfigures a server (``ALTER SYSTEM``, role defaults) only in a private cluster
(tests/support/private_cluster.py).

Markers: ``database`` is put on every test whose fixtures reach ``pg_server_url`` (so it cannot
lie); ``pure`` is declared by a module of pure logic (``pytestmark = pytest.mark.pure``) and
collection fails if such a test asks for a database or a server. Pure and database tests live
in the same files where a module mixes them: the marker, not the folder, separates them.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from _pytest.nodeid import coerce_node_id  # private, for schemathesis's node ids (below)
from psycopg import sql

from harness.examples import points
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from maintenance.settings import ENV_PREFIX

TEST_URL_VARIABLE = "CORE_JOBS_TEST_DATABASE_URL"

# Fixtures of their own modules: the fake Better Stack (fake_bs, bs_server), log capture (logs), the chart
# (chart), the operations API's keys, JWKS server, tokens and running API (api_support), and the local
# loyalty ledger of the durable-action tests (ledger_support), the RabbitMQ broker and a fresh queue on it
# (rabbit_support), the 3-node RabbitMQ cluster of the session (rabbit_cluster), the session's PostgreSQL failover rigs (failover_rigs), a third party's queue adapter registered as an entry point (queue_adapters), and the
# relay's targets (relay_support).
pytest_plugins = [
    "support.fake_betterstack",
    "support.logcapture",
    "support.helm_support",
    "support.api_support",
    "support.ledger_support",
    "support.tracing_support",
    "support.rabbit_support",
    "support.rabbit_cluster",
    "support.failover",
    "support.queue_adapters",
    "support.relay_support",
    "support.purge_fixtures",
]


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def _server_url() -> Iterator[str]:
    configured = os.environ.get(TEST_URL_VARIABLE)
    if configured:
        yield configured.replace("postgresql+psycopg://", "postgresql://")
        return
    if _docker_answers():
        from testcontainers.community.postgres import (
            PostgresContainer,  # testcontainers.postgres is deprecated
        )

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    from core_jobs_demo import embedded_postgres  # the demo's pgserver (dev group): heavy, only as a last resort

    with embedded_postgres(prefix="core-jobs-tests-") as url:
        yield url


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` instead."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(query)
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A URL of the PostgreSQL server the tests run against (its default database)."""
    with _server_url() as url:
        yield url


@pytest.fixture(scope="session")
def template_database(pg_server_url: str) -> Iterator[str]:
    """Name of a database migrated to head, used as the template of every test database."""
    name = f"core_jobs_tpl_{os.getpid()}_{secrets.token_hex(3)}"
    url = create_database(pg_server_url, name)
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:  # the example consumer's table: the tests', not the schema's
        points.create_table(conn)
    yield name
    drop_database(pg_server_url, name)


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A new database with nothing in it (for migration tests)."""
    name = f"core_jobs_t_{os.getpid()}_{secrets.token_hex(4)}"
    url = create_database(pg_server_url, name)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture
def database_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """A fresh database at the newest schema, private to this test."""
    name = f"core_jobs_t_{os.getpid()}_{secrets.token_hex(4)}"
    url = create_database(pg_server_url, name, template=template_database)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture
def db(database_url: str) -> Database:
    return Database(database_url)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to this test's database, for arranging and asserting rows."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="session")
def demo_output(pg_server_url: str) -> str:
    """What one `core-jobs demo` prints, on a scratch database of the test server; run once per session."""
    from maintenance.cli import main

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith(ENV_PREFIX) and key != TEST_URL_VARIABLE:
                env.delenv(key)
        env.setenv("CORE_JOBS_DATABASE_URL", pg_server_url)
        with contextlib.redirect_stdout(out):
            code = main(["demo"])
    assert code == 0, out.getvalue()
    return out.getvalue()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CORE_JOBS_* setting from the outside leaks into the test."""
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX) and key != TEST_URL_VARIABLE:
            monkeypatch.delenv(key)
    return monkeypatch


# Fixtures a pure test may not use: PostgreSQL and the local HTTP peers.
NOT_PURE_FIXTURES = ("pg_server_url", "bs_server", "fake_bs", "httpserver", "ledger")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``database`` whatever reaches PostgreSQL; refuse a ``pure`` test that uses a database or server fixture;
    give each schemathesis operation a node id of its own."""
    impure = []
    for item in items:
        label = getattr(item, "operation_label", None)  # schemathesis's test of one API operation
        if label is not None and not item.nodeid.endswith("]"):
            # Under pytest 9.2 schemathesis (4.32) gives every operation's test its function's node id: pytest-xdist,
            # which schedules and reports by node id, would run one operation of ten and count it once.
            item._id = coerce_node_id(f"{item.nodeid}[{label}]")
        used = set(getattr(item, "fixturenames", ()))
        if "pg_server_url" in used:
            item.add_marker(pytest.mark.database)
        if item.get_closest_marker("pure") and used.intersection(NOT_PURE_FIXTURES):
            impure.append(f"{item.nodeid} uses {sorted(used.intersection(NOT_PURE_FIXTURES))}")
    if impure:
        raise pytest.UsageError("tests marked pure that are not:\n  " + "\n  ".join(impure))
