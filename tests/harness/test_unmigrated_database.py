"""The harness against a database that was never migrated: SchemaNotMigrated saying what is missing and what to run.

Each test gets a real, empty database (``empty_database_url``, tests/conftest.py): no ``core`` schema at all.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support.factories import QUEUE
from support.harness_support import TTL

import harness
from harness.consumer.retry import RetryPolicy
from harness.examples.points import make_consumer
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.cli import main
from maintenance.errors import EXIT_USAGE

MISSING = "core.dead_letters, core.processed_jobs, core.queue_messages"


def test_a_worker_on_an_unmigrated_database_raises_schema_not_migrated_naming_the_tables_and_the_command(
    empty_database_url,
):
    """Its first statement on the connection checks the schema: every missing table named, and `core-jobs migrate`."""
    worker = Worker(
        empty_database_url,
        make_consumer(),
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL),
        metrics=HarnessMetrics(CollectorRegistry()),
    )
    with pytest.raises(harness.SchemaNotMigrated) as raised:
        worker.run(once=True)
    assert raised.value.missing == tuple(MISSING.split(", "))
    assert MISSING in str(raised.value) and "core-jobs migrate" in str(raised.value)
    assert "alembic upgrade head" in str(raised.value)


def test_a_claim_or_a_publish_on_an_unmigrated_database_is_schema_not_migrated_not_undefined_table(empty_database_url):
    """The reference queue's claim (a relay's too) and publish translate UndefinedTable into the same clear error."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        queue = PgQueue(conn)
        with pytest.raises(harness.SchemaNotMigrated, match=r"core\.queue_messages.*core-jobs migrate"):
            queue.claim(QUEUE, 10)
        with pytest.raises(harness.SchemaNotMigrated, match=r"core\.queue_messages"):
            queue.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={}))


def test_require_schema_passes_on_a_migrated_database(database_url):
    """The check itself: nothing to say once `core-jobs migrate` ran (the migrated template)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        harness.require_schema(conn)


def test_the_worker_command_on_an_unmigrated_database_prints_one_line_and_exits_2(
    clean_env, empty_database_url, capsys
):
    """`core-jobs worker` says, on one stderr line and with exit 2, which tables are missing and what to run."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    assert main(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_USAGE
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("core-jobs: schema error: ") and "core-jobs migrate" in err[0]


def test_the_relay_command_on_an_unmigrated_database_prints_one_line_and_exits_2(clean_env, empty_database_url, capsys):
    """`core-jobs relay` checks the schema before it opens the broker: one line, exit 2."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    argv = ["relay", "--queue", QUEUE, "--once", "--queue-url", "amqp://guest:guest@127.0.0.1:1/%2F"]
    assert main(argv) == EXIT_USAGE
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "core.queue_messages" in err[0] and "core-jobs migrate" in err[0]
