"""A commit whose wait for the synchronous standby is cancelled is uncertain, never a success.

With ``synchronous_standby_names`` set, PostgreSQL answers a COMMIT whose wait for the standbys is cancelled
(``pg_cancel_backend``, a statement timeout, a client disconnect) with success and ``WARNING: canceling wait for
synchronous replication … committed locally, but might not have been replicated``: a failover may still lose it.
The rig (tests/support/failover.py), synchronous: its standby is stopped, so every commit waits; the waiting backend
is cancelled; then the standby comes back. A work commit that came back so is not acked on the broker (released:
its copy is redelivered and the fence finds it done); a NON_IDEMPOTENT_WRITE whose STARTED checkpoint came back so is
not sent (RECONCILIATION_REQUIRED).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support import failover_consumers
from support.factories import publish
from support.failover import FailoverRig, queue_empty, tally
from support.failover_consumers import QUEUE, SENDER_QUEUE, effect, sender
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig, WorkerStats

pytestmark = pytest.mark.failover

JOBS = 5  # one batch


@pytest.fixture
def rig(failover_rigs):
    """Synchronous: a commit returns once the standby has it, or once its wait is cancelled."""
    return failover_rigs.fresh(synchronous=True)


def worker(rig: FailoverRig, consumer, queue_url: str | None = None) -> Worker:
    return Worker(
        rig.url(),
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=timedelta(days=7), batch_size=JOBS),
        metrics=HarnessMetrics(CollectorRegistry()),
        queue_url=queue_url,
    )


def run_with_a_cancelled_wait(rig: FailoverRig, running: Worker) -> WorkerStats:
    """The standby stopped; the worker run once over what is ready; its first commit that waits for the standby
    cancelled; the standby started again; the worker's run to its end."""
    rig.stop_standby()
    result: list[WorkerStats] = []
    thread = threading.Thread(target=lambda: result.append(running.run(once=True)), daemon=True)
    thread.start()
    try:
        cancelled = wait_until(rig.cancel_replication_waits, 120, "a commit waiting for the synchronous standby")
        assert len(cancelled) == 1, cancelled
    finally:
        rig.start_standby()
    thread.join(180)
    assert not thread.is_alive() and result, running.stats.fields()
    return result[0]


def test_a_work_commit_whose_replication_wait_was_cancelled_is_not_acked_on_the_broker(rig, rabbit_target):
    """The batch's shared commit comes back with the warning: its jobs are released, not acked; redelivered, the fence
    finds each done — one effect per job, none lost, the queue drained."""
    port = rabbit_target.port(worker="producer")
    job_ids = [uuid.uuid4() for _ in range(JOBS)]
    port.publish_many([(QUEUE, Envelope(job_id=job_id, payload={"n": n})) for n, job_id in enumerate(job_ids)])
    port.close()
    running = worker(rig, effect, rabbit_target.worker_url())
    runs = [run_with_a_cancelled_wait(rig, running)]
    while rabbit_target.ready(QUEUE):  # drained to the end before counting: a copy still queued is counted too
        runs.append(worker(rig, effect, rabbit_target.worker_url()).run(once=True))
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    assert (outcome.lost, outcome.doubled, outcome.both) == ([], [], []), outcome.figures()
    assert outcome.effects == JOBS
    assert running.stats.released >= JOBS, running.stats.fields()  # the uncertain batch went back whole
    assert sum(run.duplicates for run in runs) >= JOBS, [run.fields() for run in runs]  # its copies found done


def test_a_started_checkpoint_whose_replication_wait_was_cancelled_is_not_followed_by_the_send(rig):
    """The NON_IDEMPOTENT_WRITE's STARTED commit comes back with the warning: nothing is sent, the action is held
    RECONCILIATION_REQUIRED for an operator."""
    failover_consumers.SENT.clear()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        job_id = publish(conn, {"n": 1}, queue=SENDER_QUEUE)
    run_with_a_cancelled_wait(rig, worker(rig, sender))
    wait_until(lambda: queue_empty(rig, SENDER_QUEUE), 60, "the sender's queue drained")
    assert failover_consumers.SENT == []
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        (status,) = conn.execute("SELECT status FROM core.executions WHERE job_id = %s", (job_id,)).fetchone()
        checkpoint = conn.execute(
            "SELECT c.status FROM core.execution_checkpoints c JOIN core.executions e ON e.id = c.execution_id"
            " WHERE e.job_id = %s AND c.action = 'send'",
            (job_id,),
        ).fetchone()
    assert status == "RECONCILIATION_REQUIRED"
    assert checkpoint == ("UNCERTAIN",)
