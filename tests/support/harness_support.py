"""Helpers shared by the harness tests: running a worker, reading effects, waiting on PostgreSQL (rows come from factories.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry

from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.worker import Worker, WorkerConfig, WorkerStats
from support.factories import TENANT
from support.waiting import wait_until

TTL = timedelta(days=7)


def backdate_replay(
    conn: psycopg.Connection, job_id: uuid.UUID, when: datetime, *, stamp: str = "status_changed_at"
) -> None:
    """Move the database's stamp of a replay (``status_changed_at``), or of its delivery's handling
    (``replay_handled_at``), back in time — its triggers, which guard it, set aside."""
    assert stamp in ("status_changed_at", "replay_handled_at")
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            f"UPDATE core.dead_letters SET {stamp} = %s WHERE job_id = %s AND status = 'replayed'", (when, job_id)
        )


def replay_state(conn: psycopg.Connection, letter_id: int) -> tuple[str | None, bool]:
    """(replay_outcome, whether replay_handled_at is stamped) of a dead letter: (None, False) while outstanding."""
    return conn.execute(
        "SELECT replay_outcome, replay_handled_at IS NOT NULL FROM core.dead_letters WHERE id = %s", (letter_id,)
    ).fetchone()


def run_worker(
    database_url: str,
    consumer=points_consumer,
    policy: RetryPolicy = RetryPolicy(),
    *,
    database_role: str | None = None,
) -> WorkerStats:
    """``consumer`` (default: the points consumer) run once over every ready message, on its own metrics;
    with ``database_role``, its connections switched to that role."""
    metrics = HarnessMetrics(CollectorRegistry())
    config = WorkerConfig(fence_ttl=TTL)
    worker = Worker(database_url, consumer, policy=policy, config=config, metrics=metrics, database_role=database_role)
    return worker.run(once=True)


def points(conn: psycopg.Connection, member: str) -> int:
    row = conn.execute(
        "SELECT points FROM example.loyalty_points WHERE tenant_id = %s AND member_id = %s", (TENANT, member)
    ).fetchone()
    return row[0] if row else 0


def fences(conn: psycopg.Connection, job_id: uuid.UUID) -> int:
    return conn.execute("SELECT count(*) FROM core.processed_jobs WHERE job_id = %s", (job_id,)).fetchone()[0]


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    return conn.execute(query, params).fetchone()[0]


def expire_leases(conn: psycopg.Connection, *, worker: str | None = None) -> None:
    """Move every lease (or only ``worker``'s: its ``leased_by``) into the past: what waiting out the lease would do."""
    conn.execute(
        "UPDATE core.queue_messages SET lease_expires_at = now() - interval '1 second'"
        " WHERE lease_expires_at IS NOT NULL AND (%(worker)s::text IS NULL OR leased_by = %(worker)s)",
        {"worker": worker},
    )


def make_due(conn: psycopg.Connection, *, queue: str | None = None) -> None:
    """Move every scheduled run_at (or only ``queue``'s) to now: what waiting out the retry delay would do."""
    conn.execute(
        "UPDATE core.queue_messages SET run_at = now() WHERE run_at > now() AND (%(queue)s::text IS NULL OR queue = %(queue)s)",
        {"queue": queue},
    )


def row_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Rows of every table in schemas core and example (the version table aside)."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname IN ('core', 'example')"
            " AND tablename <> 'alembic_version' ORDER BY 1"
        )
    ]
    return {t: scalar(conn, f"SELECT count(*) FROM {t}") for t in tables}


def wait_until_waiting_on_lock(conn: psycopg.Connection, pid: int, timeout: float = 20.0) -> None:
    """Block until backend ``pid`` waits on a lock (an event on the server, not a timed sleep)."""
    wait_until(
        lambda: scalar(conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)),
        timeout,
        f"backend {pid} waiting on a lock",
    )


def wait_for_advisory_waiter(conn: psycopg.Connection, key: int, timeout: float = 20.0) -> int:
    """Block until some backend waits for advisory lock ``key`` of ``conn``'s database; return its pid.

    An advisory lock is per database, and pg_locks shows every database's: another session's test
    (a parallel worker's) may wait on the same key in its own database.
    """
    return wait_until(
        lambda: conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (key,),
        ).fetchone(),
        timeout,
        f"a waiter for advisory lock {key}",
    )[0]
