"""A NON_IDEMPOTENT_WRITE over an asynchronous standby: sent before its ``STARTED`` checkpoint reached a standby, a
failover forgets it went and it is sent again; behind the replication barrier's send-side wait
(harness/durable/run.py) it leaves only once a standby has the checkpoint — after the failover each job is sent once
or held ``RECONCILIATION_REQUIRED``, never sent twice.

The rig (tests/support/failover.py), asynchronous, the ``sender`` consumer (tests/support/failover_consumers.py: one
NON_IDEMPOTENT_WRITE whose requests ``SENT`` counts per key) on the reference queue. The commits are held on the
primary (``FailoverRig.hold_commits``: its walsender stopped, the standby receives nothing more), then the primary
dies and the standby, which never got them, is promoted — the window asynchronous replication always has, made wide.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support import failover_consumers
from support.factories import publish
from support.failover import FailoverRig, queue_empty, tally_sends
from support.failover_consumers import SENDER_QUEUE, sender
from support.harness_support import make_due
from support.ledger_support import expire_execution
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.worker import Worker, WorkerConfig

pytestmark = pytest.mark.failover

JOBS = 5  # one batch


@pytest.fixture
def rig(failover_rigs):
    return failover_rigs.fresh(synchronous=False)


def worker(rig: FailoverRig, *, await_standby: timedelta | None) -> Worker:
    return Worker(
        rig.url(),
        sender,
        policy=RetryPolicy(),
        config=WorkerConfig(
            fence_ttl=timedelta(days=7),
            batch_size=JOBS,
            await_standby=await_standby,
            accept_asynchronous_replication=await_standby is None,  # the resend measured, not refused
        ),
        metrics=HarnessMetrics(CollectorRegistry()),
    )


def publish_on_every_node(rig: FailoverRig, jobs: int = JOBS) -> list[uuid.UUID]:
    """``jobs`` jobs of the sender's queue, on the standby too: what a failover may lose is the drain's only."""
    failover_consumers.SENT.clear()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        job_ids = [publish(conn, {"n": n}, queue=SENDER_QUEUE) for n in range(jobs)]
    rig.wait_caught_up()
    return job_ids


def sends() -> Counter[uuid.UUID]:
    """The sender's requests so far, per job."""
    return Counter(uuid.UUID(key.split(":", 1)[0]) for key in failover_consumers.SENT)


def lose_the_primary(rig: FailoverRig) -> None:
    """The primary dies with the commits it held; the standby, which never got them, is promoted; a new standby."""
    rig.failover()
    rig.rebuild_standby()


def drain(rig: FailoverRig, *, await_standby: timedelta | None) -> None:
    """Workers run over the sender's queue until nothing of it is left."""
    while not queue_empty(rig, SENDER_QUEUE):
        worker(rig, await_standby=await_standby).run(once=True)


# A backend of the primary (not the caller's) whose latest statement is the barrier's read of the standbys' positions:
# a worker waiting there for a standby to flush its commit.
AT_THE_BARRIER = """
SELECT count(*) FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND query LIKE '%%FILTER (WHERE flush_lsn >=%%'
"""


def waiting_at_the_barrier(rig: FailoverRig) -> bool:
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        return conn.execute(AT_THE_BARRIER).fetchone()[0] > 0


def test_without_the_barrier_a_failover_forgets_the_sends_and_sends_each_key_again(rig):
    """The operator's accept-asynchronous setting, no barrier: each job's STARTED checkpoint, its send and its final
    commit stay on the primary; after the failover the promoted standby has none of them, and every key is sent a
    second time."""
    job_ids = publish_on_every_node(rig)
    rig.hold_commits()
    assert worker(rig, await_standby=None).run(once=True).processed == JOBS
    assert sends() == Counter({job: 1 for job in job_ids})
    lose_the_primary(rig)
    drain(rig, await_standby=None)
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally_sends(conn, job_ids, sends(), SENDER_QUEUE)
    assert sorted(outcome.sent_twice) == sorted(job_ids), outcome.figures()
    assert outcome.sends == 2 * JOBS


def test_behind_the_barrier_a_send_waits_for_its_started_checkpoint_on_a_standby_and_is_never_sent_twice(rig):
    """await_standby: the first job's STARTED checkpoint commits on the primary and its send waits for a standby that
    never gets it — nothing sent; the primary dies; the worker reconnects to the promoted standby, where no checkpoint
    says a request may have gone, and sends each job once."""
    job_ids = publish_on_every_node(rig)
    rig.hold_commits()
    running = worker(rig, await_standby=timedelta(minutes=1))
    result: list = []
    thread = threading.Thread(target=lambda: result.append(running.run(once=True)), daemon=True)
    thread.start()
    # Waiting at the barrier — or, were the send-side wait gone, done (the reference queue acks in the database:
    # nothing else would wait).
    wait_until(lambda: waiting_at_the_barrier(rig) or not thread.is_alive(), 60, "the worker waiting for a standby")
    sent_before_the_failover = sends()
    lose_the_primary(rig)
    thread.join(180)
    assert not thread.is_alive() and result, running.stats.fields()
    drain(rig, await_standby=timedelta(minutes=1))  # nothing left, unless the worker ended before the failover
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally_sends(conn, job_ids, sends(), SENDER_QUEUE)
    assert sent_before_the_failover == Counter(), "a request left before its STARTED checkpoint was on a standby"
    assert (outcome.sent_twice, outcome.lost, outcome.doubled) == ([], [], []), outcome.figures()
    assert outcome.effects + len(outcome.reconciliation) == JOBS, outcome.figures()
    assert outcome.sends == outcome.effects  # each effect sent once; a held job's send in doubt, never repeated
    assert running.stats.connections_lost >= 1


def test_past_the_barriers_timeout_a_send_is_not_made_and_its_next_take_holds_it_for_reconciliation(rig, logs):
    """await_standby short, the standby never getting the STARTED checkpoint: the wait times out (NotReplicated), the
    request is not sent, the delivery is retried (harness.worker.delivery_failed); its next take finds the checkpoint
    STARTED and, a request possibly in doubt as far as the database can tell, holds it RECONCILIATION_REQUIRED — still
    nothing sent."""
    (job_id,) = publish_on_every_node(rig, jobs=1)
    rig.hold_commits()
    stats = worker(rig, await_standby=timedelta(milliseconds=200)).run(once=True)
    assert (stats.processed, stats.failed, sends()) == (0, 1, Counter()), stats.fields()
    (failed,) = logs.named("harness.worker.delivery_failed")
    assert "NotReplicated" in failed["error"], failed
    rig.release_commits()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:  # the retry's delay and the lease waited out
        make_due(conn, queue=SENDER_QUEUE)
        expire_execution(conn, job_id)
    stats = worker(rig, await_standby=timedelta(minutes=1)).run(once=True)
    assert (stats.held, sends()) == (1, Counter()), stats.fields()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        (status,) = conn.execute("SELECT status FROM core.executions WHERE job_id = %s", (job_id,)).fetchone()
    assert status == "RECONCILIATION_REQUIRED"
