"""A real worker process: killed hard mid-job (J-AC2, R-7), and stopped gracefully on SIGTERM (issue 6, point 5)."""

from __future__ import annotations

import os
import queue as queue_module
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.retry import RetryPolicy
from harness.worker import Worker, WorkerConfig
from harness_consumers import LOCK_KEY
from harness_support import TTL, expire_leases, fences, points, publish, scalar, wait_for_advisory_waiter

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """``core-jobs worker --consumer harness_consumers:blocking`` in a subprocess, its stdout read line by line."""

    def __init__(self, database_url: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
        env |= {"CORE_JOBS_DATABASE_URL": database_url, "CORE_JOBS_LOG_FORMAT": "json",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "maintenance", "worker", "--consumer", "harness_consumers:blocking", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
    stats = Worker(database_url, points_consumer, policy=RetryPolicy(), config=WorkerConfig(fence_ttl=TTL),
                   metrics=HarnessMetrics(CollectorRegistry())).run(once=True)
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
    rest = conn.execute("SELECT payload->>'member_id', attempts, lease_token FROM core.queue_messages"
                        " ORDER BY id").fetchall()
    assert rest == [("m-2", 0, None), ("m-3", 0, None)]
    assert any('"harness.worker.stop"' in line and '"num_processed": 1' in line for line in worker.output)
