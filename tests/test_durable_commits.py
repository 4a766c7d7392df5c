"""Every commit a guarantee rests on is durable, whatever the server, role or database default (issue 17, item 1).

A DBA's ``ALTER DATABASE … SET synchronous_commit = off`` (or the role's, or the server's
configuration) makes every commit that does not say otherwise asynchronous: the commit returns
before its WAL is written, and a server crash forgets it. The STARTED checkpoint of a
NON_IDEMPOTENT_WRITE is the durable proof that nothing was sent: forgotten, the next worker sends
again. The crash test proves it on a private cluster (tests/private_cluster.py) that it really
crashes (``pg_ctl stop -m immediate``), the provider being the local ledger that counts effects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from factories import publish
from harness_support import run_worker
from ledger_support import PAYLOAD, checkpoints, execution
from private_cluster import PrivateCluster, private_cluster
from psycopg import sql
from test_execution_crash import crash_worker, recover_leases


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as running:
        yield running


@pytest.fixture
def asynchronous_database(cluster: PrivateCluster) -> str:
    """A migrated database of the private cluster whose default is ``synchronous_commit = off``; its URL."""
    name = f"async_{secrets.token_hex(4)}"
    url = cluster.create_migrated_database(name)
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name)))
    return url


def test_a_non_idempotent_write_sent_before_a_server_crash_is_never_sent_again_when_the_database_commits_asynchronously(
    cluster, asynchronous_database, ledger, ledger_consumer
):
    """Database default synchronous_commit off: notify sent, the server crashed at once, restarted — the next worker sends nothing: one effect, RECONCILIATION_REQUIRED."""
    url = asynchronous_database
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = publish(conn, PAYLOAD, queue="points.ledger")
        conn.execute("CHECKPOINT")  # the job itself is on disk, whatever its commit
    process = crash_worker(url, ledger.url, "notify", "paused")
    try:
        while (line := process.stdout.readline()) and line.strip() != "sent":
            pass  # the worker's log lines
        assert line.strip() == "sent", process.stderr.read()
        assert len(ledger.effects(endpoint="notify")) == 1
        cluster.crash()  # the request went out after notify's STARTED committed: now the server dies
    finally:
        process.kill()
        process.wait(timeout=30)
    cluster.start()
    with psycopg.connect(url, autocommit=True) as conn:
        survived = checkpoints(conn, job_id)
        recover_leases(conn, job_id)
        stats = run_worker(url, consumer=ledger_consumer)
        assert len(ledger.effects(endpoint="notify")) == 1, f"sent again: the crash left the checkpoints {survived}"
        assert survived["notify"] == ("STARTED", 1)
        assert (stats.held, stats.processed) == (1, 0)
        assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"
