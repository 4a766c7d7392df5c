"""On RabbitMQ behind an asynchronous standby: a broker ack made before the commit reached a standby loses the job in
a failover; behind the replication barrier (``WorkerConfig.await_standby``, harness/replication.py) none is lost.

The rig (tests/support/failover.py), asynchronous. The commits are held on the primary (``FailoverRig.hold_commits``:
its walsender is stopped, so the standby never receives them); then the primary dies and the standby is promoted —
the window asynchronous replication always has, made wide. Past the barrier's timeout the batch is released, never
acked: its copies outlive the failover too.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support.failover import tally
from support.failover_consumers import QUEUE, effect
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig

pytestmark = pytest.mark.failover

JOBS = 20
TTL = timedelta(days=7)


@pytest.fixture
def rig(failover_rigs):
    return failover_rigs.fresh(synchronous=False)


def lose_the_primary(rig) -> None:
    """The primary dies with the commits it held; the standby, which never got them, is promoted; a new standby."""
    rig.failover()
    rig.rebuild_standby()


def publish_jobs(rabbit_target) -> list[uuid.UUID]:
    port = rabbit_target.port(worker="producer")
    job_ids = [uuid.uuid4() for _ in range(JOBS)]
    port.publish_many([(QUEUE, Envelope(job_id=job_id, payload={"n": n})) for n, job_id in enumerate(job_ids)])
    port.close()
    return job_ids


def worker(rig, rabbit_target, *, await_standby: timedelta | None) -> Worker:
    return Worker(
        rig.url(),
        effect,
        policy=RetryPolicy(),
        config=WorkerConfig(
            fence_ttl=TTL,
            batch_size=5,
            await_standby=await_standby,
            accept_asynchronous_replication=await_standby is None,  # the loss measured, not refused
        ),
        metrics=HarnessMetrics(CollectorRegistry()),
        queue_url=rabbit_target.worker_url(),
    )


def test_without_the_barrier_a_failover_loses_the_jobs_the_broker_acked_before_a_standby_had_them(rig, rabbit_target):
    """Today's default, measured: every job committed on the primary and acked on the broker; after the failover no
    effect, no fence, no message, no dead letter — all lost."""
    job_ids = publish_jobs(rabbit_target)
    rig.hold_commits()
    stats = worker(rig, rabbit_target, await_standby=None).run(once=True)
    assert stats.processed == JOBS
    lose_the_primary(rig)
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    assert rabbit_target.ready(QUEUE) == 0
    assert len(outcome.lost) == JOBS, outcome.figures()


def test_behind_the_barrier_a_failover_loses_no_job_and_applies_none_twice(rig, rabbit_target):
    """await_standby: the acks wait for a standby that never gets the commits; the primary dies; the worker reconnects
    to the promoted standby and the broker redelivers: every job has exactly one effect there."""
    job_ids = publish_jobs(rabbit_target)
    rig.hold_commits()
    running = worker(rig, rabbit_target, await_standby=timedelta(minutes=1))
    result: list = []
    thread = threading.Thread(target=lambda: result.append(running.run(once=True)), daemon=True)
    thread.start()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:  # the first batch committed, its ack waiting
        wait_until(lambda: conn.execute("SELECT count(*) FROM public.failover_effects").fetchone()[0] >= 1, 60)
    lose_the_primary(rig)
    thread.join(180)
    assert not thread.is_alive() and result, running.stats.fields()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    assert (outcome.lost, outcome.doubled, outcome.both) == ([], [], []), outcome.figures()
    assert outcome.effects == JOBS
    assert running.stats.connections_lost >= 1


def test_past_the_barriers_timeout_the_batch_is_released_not_acked_and_a_failover_loses_none_of_it(
    rig, rabbit_target, logs
):
    """await_standby short, the standby never getting the commits: each batch's wait times out (NotReplicated) and
    its successes go back to the broker (harness.worker.not_replicated), never acked; the primary then dies with every
    commit it held, and the copies the broker kept give each job exactly one effect on the promoted standby."""
    job_ids = publish_jobs(rabbit_target)
    rig.hold_commits()
    running = worker(rig, rabbit_target, await_standby=timedelta(milliseconds=200))
    result: list = []
    thread = threading.Thread(target=lambda: result.append(running.run(once=True)), daemon=True)
    thread.start()
    wait_until(lambda: running.stats.released >= JOBS, 60, f"{JOBS} successes released past the barrier's timeout")
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:  # done on the primary, and yet not acked
        assert tally(conn, job_ids).effects == JOBS
    lose_the_primary(rig)
    thread.join(180)
    assert not thread.is_alive() and result, running.stats.fields()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    assert (outcome.lost, outcome.doubled, outcome.both) == ([], [], []), outcome.figures()
    assert outcome.effects == JOBS
    timed_out = logs.named("harness.worker.not_replicated")
    assert timed_out and all("within" in event["error"] for event in timed_out), timed_out
