"""The local loyalty ledger (demo/core_jobs_demo/ledger.py) and durable deliveries, for the durable-action tests.

Loaded as a pytest plugin by conftest.py: ``ledger`` is a running ledger of this test only;
``ledger_consumer`` is the example durable consumer (harness/examples/ledger_points.py) calling
it, with a client timeout of :data:`CLIENT_TIMEOUT_S`. :func:`deliver` hands one delivery of a
job straight to :func:`harness.handling.handle` (no queue); :func:`execution`, :func:`checkpoints`
and :func:`events` read what the database holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from core_jobs_demo.ledger import LoyaltyLedger
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.examples.ledger_points import make_consumer
from harness.handling import handle
from harness.queue.port import Delivery, Envelope, Outcome
from support.factories import TENANT

CLIENT_TIMEOUT_S = 0.5
LEASE = timedelta(seconds=30)
TTL = timedelta(days=7)
PAYLOAD = {"member_id": "m-7", "points": 25}


@pytest.fixture
def ledger() -> Iterator[LoyaltyLedger]:
    with LoyaltyLedger() as running:
        yield running


@pytest.fixture
def ledger_consumer(ledger: LoyaltyLedger) -> Consumer:
    return make_consumer(ledger.url, timeout=CLIENT_TIMEOUT_S)


def deliver(
    conn: psycopg.Connection,
    consumer: Consumer,
    job_id: uuid.UUID,
    *,
    payload: Any = None,
    attempt: int = 1,
    replay_of: int | None = None,
    policy: RetryPolicy = RetryPolicy(),
    random: Any = None,
) -> Outcome:
    """One delivery of job ``job_id`` (tenant TENANT) to ``consumer``, as a worker would hand it."""
    envelope = Envelope(
        job_id=job_id,
        payload=PAYLOAD if payload is None else payload,
        tenant_id=TENANT,
        correlation_id="corr-x",
        replay_of=replay_of,
    )
    delivery = Delivery(queue=consumer.queue, envelope=envelope, attempt=attempt)
    extra = {"random": random} if random is not None else {}
    return handle(conn, consumer, delivery, policy=policy, fence_ttl=TTL, lease=LEASE, **extra)


def execution(conn: psycopg.Connection, job_id: uuid.UUID) -> dict[str, Any] | None:
    """The execution row of ``job_id`` as a dict (None when there is none)."""
    cursor = conn.execute("SELECT * FROM core.executions WHERE job_id = %s", (job_id,))
    row = cursor.fetchone()
    return None if row is None else dict(zip([c.name for c in cursor.description], row, strict=True))


def checkpoints(conn: psycopg.Connection, job_id: uuid.UUID) -> dict[str, tuple[str, int]]:
    """{action: (status, attempts)} of the execution of ``job_id``."""
    rows = conn.execute(
        "SELECT c.action, c.status, c.attempts FROM core.execution_checkpoints AS c"
        " JOIN core.executions AS e ON e.id = c.execution_id WHERE e.job_id = %s ORDER BY c.position",
        (job_id,),
    ).fetchall()
    return {action: (status, attempts) for action, status, attempts in rows}


def events(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple[str, str | None]]:
    """[(kind, action)] of the history of the execution of ``job_id``, in order."""
    return conn.execute(
        "SELECT v.kind, v.action FROM core.execution_events AS v JOIN core.executions AS e ON e.id = v.execution_id"
        " WHERE e.job_id = %s ORDER BY v.id",
        (job_id,),
    ).fetchall()


def expire_execution(conn: psycopg.Connection, job_id: uuid.UUID) -> None:
    """Move the execution's lease into the past: what waiting out the lease would do."""
    conn.execute(
        "UPDATE core.executions SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s", (job_id,)
    )


def make_execution_due(conn: psycopg.Connection, job_id: uuid.UUID) -> None:
    """Move a RETRY_WAIT execution's run_at to now: what waiting out the retry delay would do."""
    conn.execute("UPDATE core.executions SET run_at = now() WHERE job_id = %s", (job_id,))
