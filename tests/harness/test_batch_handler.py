"""Batch handlers: a plain consumer's ``batch_handler`` credits a shared transaction's new jobs in one call and one
statement; a failing call is rolled back and each job runs again with ``handler``, the failing one settled alone;
duplicates and poison stay out of the call; the declaration refuses what cannot share a call (harness/handling.py,
docs/harness.md "Batch handlers")."""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from support.factories import TENANT, publish
from support.harness_support import TTL, expire_leases, fences, make_due, points, scalar

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer, ConsumerError, JobContext
from harness.consumer.retry import RetryPolicy
from harness.examples.points import CreditPoints, OutageLedger, make_consumer
from harness.metrics import HarnessMetrics
from harness.worker import Worker, WorkerConfig

QUEUE = "points.credit"


class Recording:
    """A points consumer with a batch handler that records each call's job count (and ``handler``'s calls)."""

    def __init__(self, ledger: OutageLedger | None = None) -> None:
        self.inner = make_consumer(ledger, batched=True)
        self.batch_calls: list[list[str]] = []
        self.single_calls: list[str] = []
        assert self.inner.batch_handler is not None
        inner_batch, inner_single = self.inner.batch_handler, self.inner.handler

        def batch(conn: psycopg.Connection, payloads: list[CreditPoints], contexts: list[JobContext]) -> None:
            self.batch_calls.append([p.member_id for p in payloads])
            inner_batch(conn, payloads, contexts)

        def single(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
            self.single_calls.append(payload.member_id)
            inner_single(conn, payload, ctx)

        self.consumer = Consumer(
            name=self.inner.name, queue=QUEUE, payload_schema=CreditPoints, handler=single, batch_handler=batch
        )


def run(database_url: str, consumer: Consumer[Any], *, batch_size: int = 10, metrics: HarnessMetrics | None = None):
    config = WorkerConfig(fence_ttl=TTL, batch_size=batch_size)
    metrics = metrics or HarnessMetrics(CollectorRegistry())
    return Worker(database_url, consumer, policy=RetryPolicy(max_attempts=3), config=config, metrics=metrics).run(
        once=True
    )


def test_a_shared_transactions_new_jobs_go_to_the_batch_handler_in_one_call_and_commit_once(database_url, conn):
    """Five jobs, batch 10: one call with the five in order, one fence each, every member credited once, the queue
    empty; ``handler`` never called."""
    members = [f"m-{i}" for i in range(5)]
    jobs = [publish(conn, {"member_id": m, "points": 3}) for m in members]
    recording = Recording()
    stats = run(database_url, recording.consumer)
    assert (stats.processed, stats.duplicates, stats.failed) == (5, 0, 0)
    assert recording.batch_calls == [members] and recording.single_calls == []
    assert [points(conn, m) for m in members] == [3] * 5
    assert [fences(conn, j) for j in jobs] == [1] * 5
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_job_whose_fence_exists_is_left_out_of_the_call_and_counted_a_duplicate(database_url, conn):
    """The job already processed (its fence there) is not handed to the batch handler again: no second credit."""
    done = publish(conn, {"member_id": "m-done", "points": 7})
    conn.execute(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at) VALUES (%s, %s, %s, now() + %s)",
        (done, "points.credit", TENANT, TTL),
    )
    publish(conn, {"member_id": "m-new", "points": 2})
    recording = Recording()
    stats = run(database_url, recording.consumer)
    assert (stats.processed, stats.duplicates) == (1, 1)
    assert recording.batch_calls == [["m-new"]]
    assert (points(conn, "m-done"), points(conn, "m-new")) == (0, 2)


def test_a_failing_call_runs_each_job_again_with_handler_and_settles_the_failing_one_alone(database_url, conn):
    """The ledger times out for m-bad: the call fails and is rolled back (nothing credited by it), each job runs again
    with ``handler`` in a shared transaction, m-bad is retried on its own, the other four are credited exactly once."""
    members = ["m-0", "m-1", "m-bad", "m-3", "m-4"]
    jobs = {m: publish(conn, {"member_id": m, "points": 1}) for m in members}
    recording = Recording(OutageLedger(timeouts={"m-bad": 1}))
    with capture_logs() as logs:
        stats = run(database_url, recording.consumer)
    assert (stats.processed, stats.retried) == (4, 1)
    assert recording.batch_calls == [members]
    assert sorted(set(recording.single_calls)) == sorted(members)
    assert [points(conn, m) for m in members] == [1, 1, 0, 1, 1]
    assert [fences(conn, jobs[m]) for m in members] == [1, 1, 0, 1, 1]
    (failed,) = [e for e in logs if e["event"] == "harness.job.batch_handler_failed"]
    assert (failed["consumer"], failed["num_jobs"]) == ("points.credit", 5)
    assert failed["error"].startswith("TransientError: loyalty ledger did not answer")
    # The retry (attempt 2, redelivered only by its backoff) credits it once, by the batch handler again.
    conn.execute("UPDATE core.queue_messages SET run_at = now() - interval '1 second'")
    assert run(database_url, recording.consumer).processed == 1
    assert points(conn, "m-bad") == 1 and fences(conn, jobs["m-bad"]) == 1


def test_poison_stays_out_of_the_call_and_is_dead_lettered(database_url, conn):
    """An invalid payload is that delivery's dead letter; the valid ones still go through the batch handler."""
    publish(conn, {"member_id": "m-ok", "points": 4})
    publish(conn, {"member_id": "", "points": 4})  # fails CreditPoints: poison
    recording = Recording()
    stats = run(database_url, recording.consumer)
    assert (stats.processed, stats.dead_lettered) == (1, 1)
    assert recording.batch_calls == [["m-ok"]]
    assert points(conn, "m-ok") == 4


def test_the_batch_handler_gets_at_most_a_shared_transactions_jobs_per_call(database_url, conn, monkeypatch):
    """A batch larger than one shared transaction's share (JOBS_PER_TRANSACTION) is handed over in as many calls."""
    from harness import handling

    monkeypatch.setattr(handling, "JOBS_PER_TRANSACTION", 3)
    members = [f"m-{i}" for i in range(7)]
    for m in members:
        publish(conn, {"member_id": m, "points": 1})
    recording = Recording()
    assert run(database_url, recording.consumer).processed == 7
    assert recording.batch_calls == [members[0:3], members[3:6], members[6:7]]


def _noop(conn, payload, ctx) -> None:
    return None


def _noop_many(conn, payloads, contexts) -> None:
    return None


def _two(conn, payloads) -> None:
    return None


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"batch_handler": "credit"}, "batch_handler must be callable"),
        ({"batch_handler": _two}, "cannot be called as batch_handler(conn, payloads, contexts)"),
        ({"batch_handler": _noop_many, "shares_transactions": False}, "shares_transactions=False"),
        (
            {
                "batch_handler": _noop_many,
                "actions": (Action(name="notify", effect=Effect.IDEMPOTENT_WRITE, call=lambda payload, ctx: None),),
            },
            "one with actions",
        ),
    ],
    ids=["not-callable", "wrong-arguments", "own-transactions", "durable"],
)
def test_a_batch_handler_that_cannot_share_a_call_is_refused_at_declaration(extra, says):
    with pytest.raises(ConsumerError) as refused:
        Consumer(name="c", queue="q", payload_schema=CreditPoints, handler=_noop, **extra)
    assert says in str(refused.value)


def test_the_example_consumer_batched_credits_like_the_plain_one(database_url, conn):
    """harness.examples.points.make_consumer(batched=True): one statement for the batch, summed per member."""
    for member, amount in (("m-a", 2), ("m-b", 3), ("m-a", 5)):
        publish(conn, {"member_id": member, "points": amount}, job_id=uuid.uuid4())
    assert run(database_url, make_consumer(batched=True)).processed == 3
    assert (points(conn, "m-a"), points(conn, "m-b")) == (7, 3)


def test_a_call_that_ends_the_transaction_dead_letters_its_new_jobs_as_a_handler_would(database_url, conn):
    """The batch handler's COMMIT is refused (the batch is the worker's to commit); it swallows that and writes again,
    now outside any transaction: those writes escaped the fences. Running the jobs again would apply them twice: each
    new job is dead-lettered (TRANSACTION_ENDED), as a per-job handler that ends the transaction is, and never run
    again."""
    plain = make_consumer(batched=True)
    assert plain.batch_handler is not None
    credit_many = plain.batch_handler

    def swallow_then_write(conn: psycopg.Connection, payloads: list[CreditPoints], contexts: list[JobContext]) -> None:
        credit_many(conn, payloads, contexts)
        with suppress(psycopg.Error):
            conn.execute("COMMIT")
        credit_many(conn, payloads, contexts)  # outside the batch's transaction: past the fences

    consumer = Consumer(
        name=plain.name,
        queue=QUEUE,
        payload_schema=CreditPoints,
        handler=plain.handler,
        batch_handler=swallow_then_write,
    )
    members = ["m-0", "m-1", "m-2"]
    for m in members:
        publish(conn, {"member_id": m, "points": 1})
    stats = run(database_url, consumer)
    assert (stats.processed, stats.dead_lettered) == (0, 3)
    assert [points(conn, m) for m in members] == [1, 1, 1]  # the escaped write once, never a second time
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE last_error LIKE 'PermanentError: %'") == 3


def test_a_job_that_breaks_the_connection_in_a_call_takes_only_itself(database_url, conn):
    """m-kill terminates its own backend, in the batch handler and in the handler. Which job of the call did it is
    unknown, so each of the call's jobs keeps its lease and comes back redelivered, to run alone: the four others are
    credited once, only m-kill is dead-lettered once its attempts are spent (as with a per-job handler)."""
    plain = make_consumer(batched=True)
    assert plain.batch_handler is not None
    credit_one, credit_many = plain.handler, plain.batch_handler

    def kill_one(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
        if payload.member_id == "m-kill":
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        credit_one(conn, payload, ctx)

    def kill_many(conn: psycopg.Connection, payloads: list[CreditPoints], contexts: list[JobContext]) -> None:
        if any(p.member_id == "m-kill" for p in payloads):
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        credit_many(conn, payloads, contexts)

    consumer = Consumer(
        name=plain.name, queue=QUEUE, payload_schema=CreditPoints, handler=kill_one, batch_handler=kill_many
    )
    members = ["m-0", "m-1", "m-kill", "m-3", "m-4"]
    for m in members:
        publish(conn, {"member_id": m, "points": 1})
    for _ in range(8):
        with suppress(Exception):
            run(database_url, consumer)
        expire_leases(conn)
        make_due(conn)
    assert [points(conn, m) for m in members] == [1, 1, 0, 1, 1]
    letters = conn.execute("SELECT payload->>'member_id' FROM core.dead_letters").fetchall()
    assert letters == [("m-kill",)]
