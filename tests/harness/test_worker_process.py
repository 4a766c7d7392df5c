"""A real worker process: killed hard mid-job (J-AC2, R-7), stopped gracefully on SIGTERM (issue 6, point 5), one bad
message in a batch (issue 9, items 4 and 12), and its database gone for longer than it reconnects for (issue 27)."""

from __future__ import annotations

import json
import os
import queue as queue_module
import signal
import subprocess
import sys
import threading

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support import ROOT, TESTS
from support.factories import publish
from support.harness_consumers import LOCK_KEY
from support.harness_support import (
    TTL,
    expire_leases,
    fences,
    points,
    scalar,
    wait_for_advisory_waiter,
)
from support.tcp_proxy import proxy_of, through
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.examples.points import OutageLedger, make_consumer
from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.worker import ROLLED_BACK, Worker, WorkerConfig


class WorkerProcess:
    """``core-jobs worker --consumer support.harness_consumers:blocking`` (or ``consumer``) in a subprocess, its stdout read
    line by line."""

    def __init__(
        self,
        database_url: str,
        *args: str,
        consumer: str = "support.harness_consumers:blocking",
        deploy: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``deploy``: a folder of tests/support/deploys/ put first on PYTHONPATH (that version of its consumer modules);
        ``env``: settings of its own (``CORE_JOBS_QUEUE_URL``…) besides the database."""
        settings = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")} | settings
        deployed = [str(TESTS / "support" / "deploys" / deploy)] if deploy else []
        env |= {
            "CORE_JOBS_DATABASE_URL": database_url,
            "CORE_JOBS_LOG_FORMAT": "json",
            "PYTHONPATH": os.pathsep.join([*deployed, str(TESTS), str(ROOT)]),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "maintenance", "worker", "--consumer", consumer, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue_module.Queue[str] = queue_module.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout: float = 30) -> str:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue_module.Empty:
                raise AssertionError(f"no line with {text!r}; output: {''.join(self.output)}") from None
            if text in line:
                return line

    def events(self, name: str) -> list[dict]:
        """The JSON log events called ``name`` that the process printed."""
        found = []
        for line in self.output:
            if line.startswith("{") and (event := json.loads(line)).get("event") == name:
                found.append(event)
        return found


@pytest.fixture
def held_lock(database_url):
    """A session holding the advisory lock the blocking consumer waits for; released at the end."""
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        yield holder


def test_a_worker_killed_between_its_work_and_its_commit_leaves_neither_and_the_redelivery_applies_once(
    database_url, conn, held_lock
):
    """J-AC2: SIGKILL after the credit, before the commit → no credit, no fence; after the lease, one credit."""
    job_id = publish(conn, {"member_id": "m-crash", "points": 40})
    worker = WorkerProcess(database_url, "--once")
    worker.wait_for_line("in-handler")  # the credit is written, uncommitted
    wait_for_advisory_waiter(conn, LOCK_KEY)  # and the worker is stuck before its commit
    worker.process.send_signal(signal.SIGKILL)
    assert worker.process.wait(30) == -signal.SIGKILL
    assert points(conn, "m-crash") == 0 and fences(conn, job_id) == 0
    held_lock.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))  # the orphaned backend can now end

    assert scalar(conn, "SELECT attempts FROM core.queue_messages") == 1  # still there, under its lease
    expire_leases(conn)
    stats = Worker(
        database_url,
        points_consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL),
        metrics=HarnessMetrics(CollectorRegistry()),
    ).run(once=True)
    assert stats.processed == 1
    assert points(conn, "m-crash") == 40 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_sigterm_finishes_the_message_in_hand_and_gives_back_the_rest(database_url, conn, held_lock):
    """On SIGTERM the worker commits and acks the job it is running, releases the unstarted ones, and exits 0."""
    first = publish(conn, {"member_id": "m-1", "points": 1})
    publish(conn, {"member_id": "m-2", "points": 1})
    publish(conn, {"member_id": "m-3", "points": 1})
    worker = WorkerProcess(database_url, "--batch-size", "3")
    worker.wait_for_line(f"in-handler {first}")
    wait_for_advisory_waiter(conn, LOCK_KEY)
    worker.process.send_signal(signal.SIGTERM)
    # Let the job go on only once the worker has taken the signal: else, on a busy machine, it
    # could finish this job and start the next before its main thread runs the signal handler.
    worker.wait_for_line('"harness.worker.stopping"')
    held_lock.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    assert worker.process.wait(30) == 0, "".join(worker.output)
    assert points(conn, "m-1") == 1 and fences(conn, first) == 1
    rest = conn.execute(
        "SELECT payload->>'member_id', attempts, lease_token FROM core.queue_messages ORDER BY id"
    ).fetchall()
    assert rest == [("m-2", 0, None), ("m-3", 0, None)]
    assert any('"harness.worker.stop"' in line and '"num_processed": 1' in line for line in worker.output)


def messages(conn) -> dict[str, tuple]:
    """member_id → (attempts, leased, last_error) of every message still queued."""
    rows = conn.execute(
        "SELECT payload->>'member_id', attempts, lease_token IS NOT NULL, last_error FROM core.queue_messages"
    ).fetchall()
    return {member: tuple(rest) for member, *rest in rows}


def test_a_worker_whose_handler_raises_keyboard_interrupt_acks_what_it_did_gives_back_the_rest_and_exits_1(
    database_url, conn
):
    """A handler raising KeyboardInterrupt: the message in hand stays leased (its attempt counted), the unstarted rest
    is given back unused, the earlier success (sharing the batch's transaction) committed and acked, and the worker
    exits 1."""
    for m in ("m-ok-1", "m-interrupt", "m-ok-2", "m-ok-3"):
        publish(conn, {"member_id": m, "points": 5})
    worker = WorkerProcess(database_url, "--once", "--batch-size", "4", consumer="support.harness_consumers:fragile")
    assert worker.process.wait(60) == 1, "".join(worker.output)
    assert points(conn, "m-ok-1") == 5
    assert messages(conn) == {"m-interrupt": (1, True, None), "m-ok-2": (0, False, None), "m-ok-3": (0, False, None)}
    (stopped,) = worker.events("harness.worker.error")
    assert stopped["error"].startswith("KeyboardInterrupt")


def test_a_worker_whose_handler_loses_the_connection_reconnects_drains_the_rest_and_exits_0(database_url, conn):
    """A handler losing the database connection: the message in hand stays leased (its attempt counted); the earlier
    success, lost with the shared transaction, is retried with its attempt counted (never released uncounted:
    whichever job broke the transaction would share the next one again); the unstarted rest is given back unused and,
    the worker reconnected by itself, credited; the worker exits 0."""
    for m in ("m-ok-1", "m-disconnect", "m-ok-2", "m-ok-3"):
        publish(conn, {"member_id": m, "points": 5})
    worker = WorkerProcess(database_url, "--once", "--batch-size", "4", consumer="support.harness_consumers:fragile")
    assert worker.process.wait(60) == 0, "".join(worker.output)
    assert [points(conn, m) for m in ("m-ok-1", "m-ok-2", "m-ok-3")] == [0, 5, 5]
    assert messages(conn) == {"m-ok-1": (1, False, ROLLED_BACK), "m-disconnect": (1, True, None)}
    (lost,) = worker.events("harness.worker.connection_lost")
    assert lost["error"].startswith("AdminShutdown")  # an OperationalError
    assert worker.events("harness.worker.reconnected") and not worker.events("harness.worker.error")


def test_a_stored_result_a_deploy_no_longer_accepts_fails_its_execution_and_the_worker_goes_on(database_url, conn):
    """Deploy 1 stores lookup's result; deploy 2 requires a ``tier``: that job's execution is FAILED with a dead letter
    naming lookup and the missing field, its SUCCEEDED checkpoint unchanged, the next job of the batch is credited, and
    ``core-jobs worker --once`` exits 0."""
    old = publish(conn, {"member_id": "m-old", "points": 5}, queue="points.quote")
    v1 = WorkerProcess(database_url, "--once", consumer="quote_consumer:consumer", deploy="v1")
    assert v1.process.wait(60) == 0, "".join(v1.output)
    stored = conn.execute(
        "SELECT c.status, c.result FROM core.execution_checkpoints AS c JOIN core.executions AS e ON e.id = c.execution_id"
        " WHERE e.job_id = %s AND c.action = 'lookup'",
        (old,),
    ).fetchone()
    assert stored == ("SUCCEEDED", {"member_id": "m-old"})
    # Deploy 2; the old job's retry is due before a new job arrives, so both are in one batch, the old one first.
    conn.execute("UPDATE core.executions SET run_at = now() WHERE job_id = %s", (old,))
    conn.execute("UPDATE core.queue_messages SET run_at = now() - interval '1 minute' WHERE job_id = %s", (old,))
    new = publish(conn, {"member_id": "m-new", "points": 7}, queue="points.quote")

    v2 = WorkerProcess(database_url, "--once", "--batch-size", "2", consumer="quote_consumer:consumer", deploy="v2")
    assert v2.process.wait(60) == 0, "".join(v2.output)
    assert points(conn, "m-new") == 7 and fences(conn, new) == 1
    assert points(conn, "m-old") == 0 and fences(conn, old) == 0
    execution_id, status, reason, reason_action = conn.execute(
        "SELECT id, status, reason, reason_action FROM core.executions WHERE job_id = %s", (old,)
    ).fetchone()
    assert (status, reason_action) == ("FAILED", "lookup")
    assert reason == (
        "lookup: OutputBroken: lookup: its stored result (SUCCEEDED) breaks today's output contract:"
        " tier: Field required (1 problem(s))"
    )
    assert (
        conn.execute(
            "SELECT c.status, c.result FROM core.execution_checkpoints AS c JOIN core.executions AS e ON e.id = c.execution_id"
            " WHERE e.job_id = %s AND c.action = 'lookup'",
            (old,),
        ).fetchone()
        == stored
    )
    (letter,) = conn.execute("SELECT job_id, last_error FROM core.dead_letters").fetchall()
    assert letter == (old, f"execution {execution_id} FAILED: {reason}")
    assert messages(conn) == {}


def test_a_stored_result_a_deploys_validator_refuses_with_a_type_error_fails_its_execution_too(database_url, conn):
    """Deploy 3's output validator raises TypeError, not a ValidationError, on deploy 1's stored lookup result: the execution is FAILED naming the error, a dead letter written, and the worker exits 0."""
    old = publish(conn, {"member_id": "m-old", "points": 5}, queue="points.quote")
    v1 = WorkerProcess(database_url, "--once", consumer="quote_consumer:consumer", deploy="v1")
    assert v1.process.wait(60) == 0, "".join(v1.output)
    conn.execute("UPDATE core.executions SET run_at = now() WHERE job_id = %s", (old,))
    conn.execute("UPDATE core.queue_messages SET run_at = now() - interval '1 minute' WHERE job_id = %s", (old,))

    v3 = WorkerProcess(database_url, "--once", consumer="quote_consumer:consumer", deploy="v3")
    assert v3.process.wait(60) == 0, "".join(v3.output)
    status, reason = conn.execute("SELECT status, reason FROM core.executions WHERE job_id = %s", (old,)).fetchone()
    assert status == "FAILED"
    assert reason == (
        "lookup: OutputBroken: lookup: its stored result (SUCCEEDED) breaks today's output contract:"
        " TypeError: deploy 3 insists on a tier"
    )
    assert conn.execute("SELECT job_id FROM core.dead_letters").fetchall() == [(old,)]
    assert messages(conn) == {}


def test_a_delivery_the_database_refuses_to_settle_is_retried_with_backoff_and_the_worker_goes_on(database_url, conn):
    """The database refuses one message's dead letter: that message is retried later (attempt counted, the refusal as its
    last_error and in ``harness.worker.delivery_failed``), the rest of the batch is credited, and the worker exits 0."""
    conn.execute(
        "CREATE FUNCTION core.refuse_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " RAISE EXCEPTION 'dead letters of % are refused', NEW.payload->>'member_id' USING ERRCODE = 'check_violation';"
        " END $$"
    )
    conn.execute(
        "CREATE TRIGGER refuse_dead_letter BEFORE INSERT ON core.dead_letters FOR EACH ROW"
        " WHEN (NEW.payload->>'member_id' = 'm-permanent') EXECUTE FUNCTION core.refuse_dead_letter()"
    )
    for m in ("m-ok-1", "m-permanent", "m-ok-2"):
        publish(conn, {"member_id": m, "points": 5})
    worker = WorkerProcess(database_url, "--once", "--batch-size", "3", consumer="support.harness_consumers:fragile")
    assert worker.process.wait(60) == 0, "".join(worker.output)
    assert [points(conn, m) for m in ("m-ok-1", "m-ok-2")] == [5, 5]
    refusal = "CheckViolation: dead letters of m-permanent are refused"
    (attempts, leased, last_error) = messages(conn)["m-permanent"]
    assert (attempts, leased) == (1, False) and last_error.startswith(refusal)
    assert scalar(conn, "SELECT run_at > now() FROM core.queue_messages")  # a backoff, not a hot loop
    (failed,) = worker.events("harness.worker.delivery_failed")
    assert failed["error"].startswith(refusal) and failed["attempt"] == 1 and failed["delay_s"] > 0
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0


def test_a_worker_whose_database_stays_unreachable_for_the_reconnect_time_exits_1_saying_so(database_url, conn):
    """docs/cli.md: the database gone (every connection cut, new ones refused: the TCP proxy) for
    CORE_JOBS_WORKER_RECONNECT_FOR, the process gives up — harness.worker.error says why — and exits 1, for its
    supervisor to restart it; until then it counted the lost connection and kept trying."""
    publish(conn, {"member_id": "m-before", "points": 3})
    with proxy_of(database_url) as proxy:
        worker = WorkerProcess(
            through(database_url, proxy),
            consumer="harness.examples.points:consumer",
            env={"CORE_JOBS_WORKER_RECONNECT_FOR": "PT1S", "CORE_JOBS_WORKER_POLL_INTERVAL": "PT0.05S"},
        )
        try:
            wait_until(lambda: points(conn, "m-before") == 3, 60, "the worker in its loop, its first job credited")
            proxy.cut()
            assert worker.process.wait(60) == 1, "".join(worker.output)
        finally:
            if worker.process.poll() is None:
                worker.process.kill()
    assert len(worker.events("harness.worker.connection_lost")) == 1, "".join(worker.output)
    assert worker.events("harness.worker.reconnect_failed"), "".join(worker.output)
    (error,) = worker.events("harness.worker.error")
    assert error["consumer"] == "points.credit"
    assert "could not be reached again" in error["error"], error
    (stop,) = worker.events("harness.worker.stop")
    assert (stop["ok"], stop["num_processed"], stop["num_connections_lost"]) == (False, 1, 1)


def test_a_retry_delay_that_cannot_be_computed_fails_its_delivery_alone_which_waits_out_its_lease(
    database_url, conn, logs
):
    """The policy's delay computation raises (a deploy's bug) for a failing job: its retry cannot be recorded, so
    ``harness.worker.delivery_failed`` says so with the lease as its delay, the message keeps its lease (its expiry
    redelivers it), and the worker goes on to credit the next job."""
    policy = RetryPolicy(max_attempts=3)
    for member in ("m-fail", "m-ok"):
        publish(conn, {"member_id": member, "points": 5})
    consumer = make_consumer(OutageLedger(timeouts={"m-fail": 3}))
    config = WorkerConfig(fence_ttl=TTL, batch_size=1)
    worker = Worker(database_url, consumer, policy=policy, config=config, metrics=HarnessMetrics(CollectorRegistry()))
    object.__setattr__(policy, "jitter", "unreadable")  # validated, then broken: compute_delay raises TypeError
    stats = worker.run(once=True)
    assert (stats.failed, stats.processed) == (1, 1)
    assert points(conn, "m-ok") == 5 and points(conn, "m-fail") == 0
    (failed,) = logs.named("harness.worker.delivery_failed")
    assert failed["delay_s"] == config.lease.total_seconds()
    assert failed["error"].startswith("TypeError: ") and "its retry was refused too: TypeError: " in failed["error"]
    assert messages(conn) == {"m-fail": (1, True, None)}  # still leased: its lease's expiry redelivers it
