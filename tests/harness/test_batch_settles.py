"""Every way a shared work transaction can fail ends with each of its jobs settled — committed alone, retried with
an attempt counted, or dead-lettered — never with a release that counts nothing; and a redelivered job (one whose
earlier delivery never settled: its worker died) runs alone, so a job that kills its worker takes only itself.
On the reference queue and on RabbitMQ alike (harness.handling.handle_together, harness.worker)."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support.factories import QUEUE, TENANT
from support.harness_support import TTL, expire_leases, fences, points, scalar

from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.fence import Runtime
from harness.handling import BatchProgress, handle_together
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Acked, Delivery, Envelope, QueuePort
from harness.worker import Worker, WorkerConfig, WorkerStats
from tests.harness.test_worker_process import WorkerProcess

# Refuses one member's credit when its transaction commits: a deferred constraint trigger, as a deferred foreign
# key, an exclusion constraint checked at commit or a serialization failure would.
REFUSE_AT_COMMIT = """
CREATE FUNCTION example.refuse_m_refused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.member_id = 'm-refused' THEN
        RAISE EXCEPTION 'member m-refused is refused at commit' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_m_refused AFTER INSERT OR UPDATE ON example.loyalty_points
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION example.refuse_m_refused();
"""

MEMBERS = ["m-1", "m-2", "m-refused", "m-4", "m-5"]
RUNTIME = Runtime(policy=RetryPolicy(), fence_ttl=TTL)  # the run-wide values, as a worker makes them once


@dataclass
class Adapter:
    """One queue adapter under test: how a producer publishes on it, the worker's URL, how a worker dies on it."""

    name: str
    queue_url: str | None
    port: Any  # () -> QueuePort, on its own connection

    def publish(self, member: str) -> uuid.UUID:
        job_id = uuid.uuid4()
        port = self.port()
        port.publish(QUEUE, Envelope(job_id=job_id, payload={"member_id": member, "points": 1}, tenant_id=TENANT))
        port.close()
        return job_id


@pytest.fixture(params=["reference", "rabbitmq"])
def adapter(request: pytest.FixtureRequest, database_url: str) -> Iterator[Adapter]:
    if request.param == "reference":
        conns: list[psycopg.Connection] = []

        def pg_port() -> QueuePort:
            conn = connect(database_url, autocommit=True)
            conns.append(conn)
            return PgQueue(conn, worker="producer")

        yield Adapter("reference", None, pg_port)
        for conn in conns:
            conn.close()
        return
    target = request.getfixturevalue("rabbit_target")
    yield Adapter("rabbitmq", target.worker_url(), lambda: target.port(worker="producer"))


def run_bounded(
    database_url: str, adapter: Adapter, *, policy: RetryPolicy = RetryPolicy(), timeout: float = 20.0
) -> WorkerStats:
    """The points consumer run once over what is ready, in batches of 10; a worker still running after ``timeout``
    seconds (spinning on a batch it never settles) is stopped and fails the test."""
    stop = threading.Event()
    worker = Worker(
        database_url,
        points_consumer,
        policy=policy,
        config=WorkerConfig(fence_ttl=TTL, batch_size=10),
        metrics=HarnessMetrics(CollectorRegistry()),
        stop=stop,
        queue_url=adapter.queue_url,
    )
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(worker.run(once=True)))
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        stop.set()
        thread.join(60)
        pytest.fail(f"the worker was still running after {timeout} s: {worker.stats.fields()}")
    return result[0]


def test_a_shared_commit_refused_at_commit_runs_each_job_again_alone_and_retries_the_refused_one_counted(
    database_url, conn, adapter
):
    """One job's row refused at COMMIT: its four batch-mates are credited once each, committed alone; the refused
    job is scheduled for a retry with its attempt counted and the refusal as its last error — not released."""
    conn.execute(REFUSE_AT_COMMIT)
    jobs = [adapter.publish(member) for member in MEMBERS]
    stats = run_bounded(database_url, adapter, policy=RetryPolicy(max_attempts=3))
    assert (stats.processed, stats.retried, stats.dead_lettered, stats.released) == (4, 1, 0, 0)
    assert [points(conn, m) for m in MEMBERS] == [1, 1, 0, 1, 1]
    assert [fences(conn, j) for j in jobs] == [1, 1, 0, 1, 1]
    if adapter.name == "reference":
        ((attempts, last_error),) = conn.execute("SELECT attempts, last_error FROM core.queue_messages").fetchall()
        assert attempts == 1 and last_error.startswith("CheckViolation: member m-refused is refused at commit")


def test_a_shared_commit_refused_on_the_last_attempt_dead_letters_only_the_refused_job(database_url, conn, adapter):
    """With one attempt allowed, the refused job is dead-lettered (exhausted); its batch-mates are credited."""
    conn.execute(REFUSE_AT_COMMIT)
    for member in MEMBERS:
        adapter.publish(member)
    stats = run_bounded(database_url, adapter, policy=RetryPolicy(max_attempts=1))
    assert (stats.processed, stats.dead_lettered, stats.released) == (4, 1, 0)
    assert [points(conn, m) for m in MEMBERS] == [1, 1, 0, 1, 1]
    assert conn.execute("SELECT payload->>'member_id', attempts FROM core.dead_letters").fetchall() == [
        ("m-refused", 1)
    ]


def delivery(member: str, *, attempt: int = 1, redelivered: bool = False) -> Delivery:
    envelope = Envelope(job_id=uuid.uuid4(), payload={"member_id": member, "points": 1}, tenant_id=TENANT)
    return Delivery(queue=QUEUE, envelope=envelope, attempt=attempt, redelivered=redelivered)


def test_a_failed_shared_commit_settles_every_job_of_the_batch(database_url, conn):
    """handle_together itself: after the shared COMMIT fails, each job is run again alone within the same call —
    every delivery of the batch has an outcome, none is left for the caller to give back."""
    conn.execute(REFUSE_AT_COMMIT)
    batch = [delivery(member) for member in MEMBERS]
    progress = BatchProgress()
    with connect(database_url, autocommit=True) as worker_conn:
        handle_together(worker_conn, points_consumer, batch, RUNTIME, progress)
    outcomes = {d.envelope.payload["member_id"]: type(o).__name__ for d, o in progress.settled}
    assert outcomes == {"m-1": "Acked", "m-2": "Acked", "m-refused": "RetryAfter", "m-4": "Acked", "m-5": "Acked"}
    assert not progress.rolled_back


def test_a_failed_shared_commit_while_stopping_hands_its_jobs_back_to_be_retried_counted(database_url, conn):
    """The worker asked to stop as the shared COMMIT fails: its jobs are not run again, and not released either —
    they are in ``rolled_back``, for the caller to retry with the attempt counted."""
    conn.execute(REFUSE_AT_COMMIT)
    batch = [delivery(member) for member in MEMBERS]
    progress = BatchProgress()
    asked: list[Delivery] = []

    def stopping() -> bool:  # true once every job has been handled in the shared transaction
        return len(asked) >= len(batch)

    def each(d: Delivery):
        asked.append(d)
        from contextlib import nullcontext

        return nullcontext()

    with connect(database_url, autocommit=True) as worker_conn:
        handle_together(worker_conn, points_consumer, batch, RUNTIME, progress, each=each, stopping=stopping)
    assert progress.settled == []
    assert [d.envelope.payload["member_id"] for d in progress.rolled_back] == MEMBERS


def test_a_lost_connection_at_the_shared_commit_hands_its_jobs_back_to_be_retried_counted(database_url, conn):
    """The connection dies with the shared transaction open: its jobs are ``rolled_back`` (retried counted by the
    caller), the one in hand is kept (its lease and attempt), none reported acked."""
    batch = [delivery("m-1"), delivery("m-2"), delivery("m-3")]
    progress = BatchProgress()
    worker_conn = connect(database_url, autocommit=True)
    pid = worker_conn.info.backend_pid

    def each(d: Delivery):
        from contextlib import nullcontext

        if d.envelope.payload["member_id"] == "m-3":
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return nullcontext()

    with pytest.raises(psycopg.OperationalError):
        handle_together(worker_conn, points_consumer, batch, RUNTIME, progress, each=each)
    worker_conn.close()
    assert not [o for _d, o in progress.settled if isinstance(o, Acked)]
    assert [d.envelope.payload["member_id"] for d in progress.rolled_back] == ["m-1", "m-2"]
    assert progress.in_hand is batch[2]


def test_the_worker_retries_with_an_attempt_counted_the_jobs_of_a_shared_transaction_its_lost_connection_rolled_back(
    database_url, conn
):
    """On the reference queue: m-disconnect's handler kills the worker's backend mid-batch. The jobs before it in the
    shared transaction are retried with their attempt counted (not released uncounted, to share the next
    transaction with it again); m-disconnect keeps its lease; the job after it, never started, is released — and
    handled once the worker has reconnected."""
    from support.factories import publish
    from support.harness_consumers import fragile

    ids = {m: publish(conn, {"member_id": m, "points": 1}) for m in ("m-1", "m-2", "m-disconnect", "m-4")}
    worker = Worker(
        database_url,
        fragile,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, batch_size=10),
        metrics=HarnessMetrics(CollectorRegistry()),
    )
    stats = worker.run(once=True)
    rows = dict(
        conn.execute(
            "SELECT payload->>'member_id', array[attempts, (lease_expires_at > now())::int, (last_error IS NOT NULL)::int]"
            "  FROM core.queue_messages"
        ).fetchall()
    )
    # [attempts, under a live lease, a last error]; a retried or released message has no lease (NULL)
    assert rows == {"m-1": [1, None, 1], "m-2": [1, None, 1], "m-disconnect": [1, 1, 0]}
    assert (stats.released, stats.retried, stats.processed, stats.connections_lost) == (1, 2, 1, 1)
    assert [fences(conn, ids[m]) for m in ("m-1", "m-2", "m-disconnect", "m-4")] == [0, 0, 0, 1]


def test_a_job_that_kills_its_worker_takes_only_itself(database_url, conn, adapter):
    """m-killer's handler SIGKILLs its worker process, every time: real ``core-jobs worker --once`` processes are
    started until one ends by itself. Its four batch-mates are credited once each and never dead-lettered; the
    killer alone is dead-lettered (``DeliveriesExhausted``) once its attempts are spent."""
    members = ["m-1", "m-2", "m-killer", "m-4", "m-5"]
    for member in members:
        adapter.publish(member)
    env = {"CORE_JOBS_QUEUE_URL": adapter.queue_url} if adapter.queue_url else {}
    for _death in range(12):
        worker = WorkerProcess(
            database_url, "--once", "--batch-size", "10", consumer="support.harness_consumers:killing", env=env
        )
        code = worker.process.wait(60)
        if code == 0:
            break
        assert code == -signal.SIGKILL, "".join(worker.output)
        if adapter.name == "reference":
            expire_leases(conn)  # the dead worker's leases run out (the broker requeues at once)
    else:
        pytest.fail("still dying after 12 deaths")
    letters = conn.execute("SELECT payload->>'member_id', split_part(last_error, ':', 1) FROM core.dead_letters")
    assert letters.fetchall() == [("m-killer", "DeliveriesExhausted")]
    assert [points(conn, m) for m in members] == [1, 1, 0, 1, 1]
    assert scalar(conn, "SELECT count(*) FROM core.processed_jobs") == 4
