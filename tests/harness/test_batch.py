"""A claimed batch's jobs in shared work transactions (harness.handling.handle_together): one
effect per job under SIGKILL mid-batch, a failing, poison, duplicate or transaction-ending job settled alone, and
the consumer's opt-out."""

from __future__ import annotations

import signal
import uuid

import psycopg
import pytest
from support.factories import TENANT, publish
from support.harness_consumers import LOCK_KEY, blocking_one, ending, fragile, two_enders
from support.harness_support import (
    TTL,
    expire_leases,
    fences,
    points,
    run_worker,
    scalar,
    wait_for_advisory_waiter,
)

from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.fence import Runtime
from harness.handling import BatchProgress, handle_together
from harness.pg import connect
from harness.queue.port import Acked, Delivery, Envelope
from tests.harness.test_worker_process import WorkerProcess, held_lock  # noqa: F401 (a fixture)


def transactions_of_fences(conn) -> int:
    """How many transactions wrote the fences there are: each fence expires at its transaction's now() + the TTL."""
    return scalar(conn, "SELECT count(DISTINCT expires_at) FROM core.processed_jobs")


def dead_letters(conn) -> dict[str, str]:
    return dict(
        conn.execute("SELECT payload->>'member_id', split_part(last_error, ':', 1) FROM core.dead_letters").fetchall()
    )


def test_a_worker_killed_mid_batch_commits_none_of_it_and_the_next_worker_applies_each_job_once(
    database_url, conn, held_lock
):
    """SIGKILL while the third job of a batch runs, two handled before it: no credit, no fence; then one of each per job."""
    members = ["m-1", "m-2", "m-block", "m-4"]
    jobs = [publish(conn, {"member_id": member, "points": 10}) for member in members]
    worker = WorkerProcess(
        database_url, "--once", "--batch-size", "4", consumer="support.harness_consumers:blocking_one"
    )
    worker.wait_for_line(f"in-handler {jobs[2]}")
    wait_for_advisory_waiter(conn, LOCK_KEY)  # m-1 and m-2 credited in the shared transaction, m-block stuck in it
    worker.process.send_signal(signal.SIGKILL)
    assert worker.process.wait(30) == -signal.SIGKILL
    assert [points(conn, m) for m in members] == [0, 0, 0, 0] and sum(fences(conn, j) for j in jobs) == 0
    held_lock.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))  # the orphaned backend can now end

    expire_leases(conn)
    stats = run_worker(database_url, blocking_one)
    assert stats.processed == 4
    assert [points(conn, m) for m in members] == [10, 10, 10, 10] and [fences(conn, j) for j in jobs] == [1, 1, 1, 1]
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_failing_or_poison_job_in_a_batch_rolls_back_only_itself_and_is_settled_alone(database_url, conn):
    """A permanent failure, a transient one and a poison payload mid-batch: the rest commit in one transaction; the
    permanent and the poison are dead-lettered, the transient is scheduled for a retry, each with nothing written."""
    publish(conn, {"member_id": "m-1", "points": 1})
    publish(conn, {"member_id": "m-permanent", "points": 1})
    publish(conn, {"member_id": "m-2", "points": 1})
    publish(conn, {"member_id": "m-surrogate", "points": 1})
    publish(conn, {"member_id": "m-poison", "points": -5})
    publish(conn, {"member_id": "m-3", "points": 1})
    stats = run_worker(database_url, fragile)
    assert (stats.processed, stats.dead_lettered, stats.retried) == (3, 2, 1)
    assert [points(conn, m) for m in ("m-1", "m-2", "m-3", "m-permanent", "m-surrogate", "m-poison")] == [
        1,
        1,
        1,
        0,
        0,
        0,
    ]
    assert scalar(conn, "SELECT count(*) FROM core.processed_jobs") == 3
    assert transactions_of_fences(conn) == 1  # m-1, m-2 and m-3 committed together
    assert dead_letters(conn) == {"m-permanent": "PermanentError", "m-poison": "PoisonMessage"}
    assert conn.execute("SELECT payload->>'member_id', attempts FROM core.queue_messages").fetchall() == [
        ("m-surrogate", 1)
    ]


def test_the_same_job_twice_in_a_batch_is_applied_once_and_acked_twice(database_url, conn):
    """Two messages of one job in one batch: one credit, one fence, the second a duplicate; both messages acked."""
    job_id = publish(conn, {"member_id": "m-1", "points": 5})
    publish(conn, {"member_id": "m-1", "points": 5}, job_id=job_id)
    publish(conn, {"member_id": "m-2", "points": 5})
    stats = run_worker(database_url, points_consumer)
    assert (stats.processed, stats.duplicates) == (2, 1)
    assert points(conn, "m-1") == 5 and points(conn, "m-2") == 5 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_handler_that_commits_the_shared_transaction_is_dead_lettered_and_its_batch_mates_apply_once(
    database_url, conn
):
    """m-commit's handler runs COMMIT mid-batch: it is dead-lettered (as alone); the jobs before it committed with
    it and are acked, those after it run in a new transaction — every other job credited once."""
    for member in ("m-1", "m-2", "m-commit", "m-3"):
        publish(conn, {"member_id": member, "points": 1})
    stats = run_worker(database_url, ending)
    assert (stats.processed, stats.dead_lettered) == (3, 1)
    assert [points(conn, m) for m in ("m-1", "m-2", "m-3")] == [1, 1, 1]
    assert dead_letters(conn) == {"m-commit": "PermanentError"}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_handler_that_rolls_back_the_shared_transaction_is_dead_lettered_and_its_batch_mates_run_again(
    database_url, conn
):
    """m-rollback's handler runs ROLLBACK mid-batch, undoing the jobs before it: they run again and are credited once."""
    for member in ("m-1", "m-2", "m-rollback", "m-3"):
        publish(conn, {"member_id": member, "points": 1})
    stats = run_worker(database_url, ending)
    assert (stats.processed, stats.dead_lettered) == (3, 1)
    assert [points(conn, m) for m in ("m-1", "m-2", "m-3", "m-rollback")] == [1, 1, 1, 0]
    assert scalar(conn, "SELECT count(*) FROM core.processed_jobs") == 3
    assert dead_letters(conn) == {"m-rollback": "PermanentError"}


def test_two_handlers_of_a_batch_each_trying_to_end_it_commit_nothing_without_its_fence(database_url, conn):
    """m-swallow's COMMIT is refused, it swallows that and begins a transaction of its own; m-commit then commits:
    both are dead-lettered, and every job between and around them is credited once, each with its fence."""
    members = ("m-1", "m-swallow", "m-2", "m-commit", "m-3")
    jobs = [publish(conn, {"member_id": member, "points": 1}) for member in members]
    stats = run_worker(database_url, two_enders)
    assert (stats.processed, stats.dead_lettered) == (3, 2)
    assert [points(conn, m) for m in members] == [1, 0, 1, 0, 1]
    assert [fences(conn, j) for j in jobs] == [1, 0, 1, 0, 1]
    assert dead_letters(conn) == {"m-swallow": "PermanentError", "m-commit": "PermanentError"}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_the_database_refuses_a_commit_of_an_open_work_batch_that_is_not_the_workers(conn):
    """The batch's row in core.open_work_batches (0027): a COMMIT that finds it rolls everything back."""
    conn.execute("CREATE TABLE batch_probe (n int)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO core.open_work_batches DEFAULT VALUES")
    conn.execute("INSERT INTO batch_probe VALUES (1)")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        conn.execute("COMMIT")
    assert scalar(conn, "SELECT count(*) FROM batch_probe") == 0
    assert scalar(conn, "SELECT count(*) FROM core.open_work_batches") == 0


def test_unfencing_a_stopping_batch_s_unrun_jobs_deletes_only_fences_its_own_transaction_wrote(conn):
    """core.unfence_unrun: a committed fence stays whatever the caller asks; one this transaction wrote goes."""
    committed, unrun = uuid.uuid4(), uuid.uuid4()
    fence = "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at) VALUES (%s, 'c', %s, now() + %s)"
    conn.execute(fence, (committed, TENANT, TTL))
    with conn.transaction():
        conn.execute(fence, (unrun, TENANT, TTL))
        gone = scalar(conn, "SELECT core.unfence_unrun('c', %s::uuid[])", ([committed, unrun],))
    assert gone == 1 and fences(conn, committed) == 1 and fences(conn, unrun) == 0


def test_a_consumer_that_does_not_share_transactions_commits_each_job_alone(database_url, conn):
    """shares_transactions=False: a batch of three commits three transactions, as before batching."""
    from dataclasses import replace

    for member in ("m-1", "m-2", "m-3"):
        publish(conn, {"member_id": member, "points": 1})
    stats = run_worker(database_url, replace(points_consumer, shares_transactions=False))
    assert stats.processed == 3
    assert transactions_of_fences(conn) == 3


def test_a_batch_of_plain_jobs_commits_in_one_transaction(database_url, conn):
    """The default: a batch of three plain jobs writes its three fences in one transaction."""
    for member in ("m-1", "m-2", "m-3"):
        publish(conn, {"member_id": member, "points": 1})
    assert run_worker(database_url, points_consumer).processed == 3
    assert transactions_of_fences(conn) == 1


def test_a_redelivered_job_in_a_batch_is_reported_acked_only_once_its_work_is_committed(database_url, conn):
    """m-2, redelivered, follows m-1 in a batch whose connection m-disconnect then loses: every delivery the batch
    reports acked has its fence committed (m-2's work must not ride in m-1's transaction, lost with it)."""

    def delivery(member: str, *, redelivered: bool = False) -> Delivery:
        envelope = Envelope(job_id=uuid.uuid4(), payload={"member_id": member, "points": 1}, tenant_id=TENANT)
        return Delivery(queue=fragile.queue, envelope=envelope, attempt=2, redelivered=redelivered)

    batch = [delivery("m-1"), delivery("m-2", redelivered=True), delivery("m-disconnect")]
    progress = BatchProgress()
    with connect(database_url, autocommit=True) as worker_conn, pytest.raises(psycopg.OperationalError):
        handle_together(worker_conn, fragile, batch, Runtime(policy=RetryPolicy(), fence_ttl=TTL), progress)
    acked = [d for d, outcome in progress.settled if isinstance(outcome, Acked)]
    assert [fences(conn, d.envelope.job_id) for d in acked] == [1] * len(acked)
    assert [points(conn, d.envelope.payload["member_id"]) for d in acked] == [1] * len(acked)


@pytest.mark.parametrize("jobs", [0, 2])
def test_opening_a_shared_transaction_sets_its_mark_whether_or_not_a_fence_is_written(database_url, jobs):
    """The one statement that opens a batch writes its row and its fences and sets the mark the worker reads after
    each handler (reported by the server, no round trip) — with no fence to write too (a chunk of poison only)."""
    from datetime import timedelta

    from harness.handling import MARK, OPEN_BATCH_WITH_FENCES

    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = [uuid.uuid4() for _ in range(jobs)]
        params = {"consumer": "c", "ttl": timedelta(days=7), "job_ids": ids, "tenant_ids": [TENANT] * jobs}
        with conn.pipeline():
            conn.execute("BEGIN")
            fenced = conn.execute(OPEN_BATCH_WITH_FENCES, params)
        assert sorted(row[0] for row in fenced.fetchall()) == sorted(ids)
        assert conn.info.parameter_status(MARK[0]) == MARK[1]
        assert conn.execute("SELECT count(*) FROM core.open_work_batches").fetchone() == (1,)
        conn.execute("ROLLBACK")
        assert conn.info.parameter_status(MARK[0]) == "off"
