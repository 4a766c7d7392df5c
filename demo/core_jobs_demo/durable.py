"""The durable actions' part of ``core-jobs demo``: the ledger points consumer against a local loyalty ledger.

The consumer (harness/examples/ledger_points.py) makes three calls over HTTP to the loyalty
ledger (demo/core_jobs_demo/ledger.py, a real server on 127.0.0.1 in this process) — a READ_ONLY
lookup, an IDEMPOTENT_WRITE credit that sends its stable key, a NON_IDEMPOTENT_WRITE notify to
a legacy endpoint with no key — then writes the balance in the fence's transaction. Two stories
(docs/durable-actions.md), every time on PostgreSQL's clock and nothing slept through:

1. **A 503, a durable retry, a success.** The ledger answers the credit 503 (``Retry-After: 3``)
   once. The delivery ends ``RETRY_WAIT``: the failed attempt, ``run_at`` and a
   ``RETRY_SCHEDULED`` event were committed together. The demo makes the retry due by moving
   ``run_at`` to ``now()`` (what waiting would do); the next delivery does not repeat the lookup
   (its checkpoint SUCCEEDED), sends the credit again with the same key, and succeeds — leaving
   only its fence (J-AC8).
2. **A worker killed mid-send.** A real worker process (``core-jobs worker --once``) is killed
   with SIGKILL while the ledger holds its notify request (applied, not yet answered). Its
   leases are moved into the past (what waiting them out would do); the next worker finds the
   notify ``STARTED`` — it may have been sent — and parks the execution in
   ``RECONCILIATION_REQUIRED`` without sending it again. The alert feed, run again, names the
   Better Stack incident it would post for it (a dry run, as the demo's first run of every job:
   the demo has no Better Stack token).

:func:`walk_through` returns the story's facts (:class:`DurableStory`) beside the lines it writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import psycopg
from prometheus_client import CollectorRegistry

from core_jobs_demo.ledger import Fault, LoyaltyLedger
from harness.examples import ledger_points
from harness.metrics import HarnessMetrics
from harness.pg import server_now
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.operations.executions import ExecutionDetail, get_execution
from maintenance.runtime.db import Database
from maintenance.service.runner import build_jobs, job_env, run_jobs
from maintenance.service.telemetry import Telemetry
from maintenance.settings import ENV_PREFIX, Settings

TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000d1")
ROOT = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_S = 60.0  # how long the demo waits for the worker process to reach the ledger, and to die
CONSUMER_PATH = "harness.examples.ledger_points:consumer"

# The alert feed's kinds for executions (new, stale): what the demo picks out of its dry run.
RECONCILIATION_KINDS = ("reconciliation",)

# What waiting out the retry delay would do: the execution due now, and its message.
MAKE_EXECUTION_DUE = """
UPDATE core.executions SET run_at = now() WHERE job_id = %(job_id)s AND status = 'RETRY_WAIT'
"""
MAKE_MESSAGE_DUE = """
UPDATE core.queue_messages SET run_at = now() WHERE job_id = %(job_id)s AND run_at > now()
"""

# What waiting out the dead worker's leases would do: its execution's and its message's, in the past.
EXPIRE_EXECUTION_LEASE = """
UPDATE core.executions SET lease_expires_at = now() - interval '1 second'
 WHERE job_id = %(job_id)s AND status = 'RUNNING'
"""
EXPIRE_MESSAGE_LEASE = """
UPDATE core.queue_messages SET lease_expires_at = now() - interval '1 second'
 WHERE job_id = %(job_id)s AND lease_expires_at IS NOT NULL
"""

# What a job left: its fences, its executions, its messages.
LEFT_BY_JOB = """
SELECT (SELECT count(*) FROM core.processed_jobs WHERE job_id = %(job_id)s),
       (SELECT count(*) FROM core.executions WHERE job_id = %(job_id)s),
       (SELECT count(*) FROM core.queue_messages WHERE job_id = %(job_id)s)
"""

# The execution of a job, by job id (the views read executions by their own id).
EXECUTION_OF_JOB = """
SELECT id FROM core.executions WHERE job_id = %(job_id)s
"""


@dataclass
class DurableStory:
    """The facts the demo showed, for its test."""

    retry_status: str = ""
    retry_due_in_s: float = 0.0
    retry_events: list[tuple[str, str | None, int | None, float | None]] = field(default_factory=list)
    retried_left: tuple[int, int, int] = (0, 0, 0)  # fences, executions, messages after the success
    lookups_of_retried_job: int = 0
    credits_of_retried_job: int = 0
    killed_job_id: uuid.UUID | None = None
    worker_exit: int | None = None
    killed_status: str = ""
    killed_checkpoints: list[tuple[str, str, str, int]] = field(default_factory=list)
    killed_events: list[str] = field(default_factory=list)
    notify_effects: int = 0
    notify_calls: int = 0
    killed_left: tuple[int, int, int] = (0, 0, 0)
    incident_lines: list[str] = field(default_factory=list)


def walk_through(settings: Settings, db: Database, out: TextIO) -> DurableStory:
    """Run both stories on ``db`` (migrated), one line per step to ``out``; return their facts."""
    story = DurableStory()
    with LoyaltyLedger() as ledger, db.connect(autocommit=True) as conn:
        consumer = ledger_points.make_consumer(ledger.url)
        queue = PgQueue(conn)
        config = WorkerConfig(fence_ttl=settings.processed_jobs_ttl, lease=settings.worker_lease)
        metrics = HarnessMetrics(CollectorRegistry())

        def say(line: str) -> None:
            out.write(f"  {line}\n")

        def enqueue(member: str, points: int) -> uuid.UUID:
            envelope = Envelope(
                job_id=uuid.uuid4(),
                payload={"member_id": member, "points": points},
                tenant_id=TENANT,
                correlation_id=f"demo-durable-{member}",
            )
            queue.publish(consumer.queue, envelope)
            return envelope.job_id

        def work() -> str:
            policy = settings.retry_policy(consumer.queue)
            stats = Worker(db.conninfo, consumer, policy=policy, config=config, metrics=metrics).run(once=True)
            return ", ".join(f"{k}={v}" for k, v in stats.fields().items() if v) or "nothing to do"

        def show(job_id: uuid.UUID) -> ExecutionDetail:
            detail = _execution_of(conn, job_id)
            say(
                "   checkpoints: "
                + "; ".join(f"{c.action} ({c.effect}) {c.status}, attempt {c.attempts}" for c in detail.checkpoints)
            )
            return detail

        def left(job_id: uuid.UUID) -> tuple[int, int, int]:
            row = conn.execute(LEFT_BY_JOB, {"job_id": job_id}).fetchone()
            assert row is not None  # counts: always one row
            return row[0], row[1], row[2]

        # 1. A 503 on the credit: RETRY_WAIT on PostgreSQL's clock, then a success.
        ledger.fail("credits", Fault.unavailable(retry_after="3"))
        ana = enqueue("m-ana", 40)
        say(f"1. enqueued a credit of 40 points for m-ana on {consumer.queue}; the ledger answers its credit 503 once")
        say(f"   worker: {work()}")
        detail = _execution_of(conn, ana)
        now = server_now(conn)
        story.retry_status, story.retry_due_in_s = detail.row.status, (detail.row.run_at - now).total_seconds()
        say(
            f"   execution {detail.row.id}: {story.retry_status}, run_at {detail.row.run_at:%H:%M:%S.%f}"
            f" = PostgreSQL's now() {now:%H:%M:%S.%f} + {story.retry_due_in_s:.1f} s"
        )
        show(ana)
        for event in detail.events:
            delay = (event.run_at - event.at).total_seconds() if event.run_at else None
            story.retry_events.append((event.kind, event.action, event.attempt, delay))
            say(f"   event {event.kind}: {event.action} attempt {event.attempt}, {delay:.1f} s later: {event.detail}")
        for statement in (MAKE_EXECUTION_DUE, MAKE_MESSAGE_DUE):
            conn.execute(statement, {"job_id": ana})
        say("   fast-forward: run_at moved to now() (what waiting out the delay would do)")
        say(f"   worker: {work()}")
        key = f"{ana}:{consumer.name}:credit"
        story.credits_of_retried_job = len(ledger.effects(endpoint="credits", key=key))
        story.lookups_of_retried_job = ledger.calls("lookup")
        story.retried_left = fences, executions, messages = left(ana)
        say(
            f"   the ledger: {story.credits_of_retried_job} credit applied for key {key} in"
            f" {ledger.calls('credits')} requests; {story.lookups_of_retried_job} lookup (its checkpoint held)"
        )
        say(f"   left by the job: {fences} fence, {executions} executions, {messages} messages (J-AC8)")

        # 2. A worker process killed hard while its notify is in the ledger's hands.
        ledger.fail("notify", Fault.hang(seconds=10 * WORKER_TIMEOUT_S))  # ends when the ledger closes
        ben = story.killed_job_id = enqueue("m-ben", 25)
        say("2. enqueued a credit of 25 points for m-ben; the ledger holds its notify (applied, never answered)")
        notify_before = ledger.calls("notify")
        pid, story.worker_exit = _kill_mid_send(db.conninfo, ledger.url, lambda: ledger.calls("notify") > notify_before)
        say(f"   worker process {pid} killed (SIGKILL) while its notify was at the ledger: exit {story.worker_exit}")
        detail = _execution_of(conn, ben)
        say(f"   execution {detail.row.id}: {detail.row.status}, under the dead worker's lease")
        show(ben)
        for statement in (EXPIRE_EXECUTION_LEASE, EXPIRE_MESSAGE_LEASE):
            conn.execute(statement, {"job_id": ben})
        say("   fast-forward: the dead worker's leases moved into the past (what waiting them out would do)")
        say(f"   new worker: {work()}")
        say(f"   execution {detail.row.id}: {_execution_of(conn, ben).row.status}")
        detail = show(ben)
        story.killed_status = detail.row.status
        story.killed_checkpoints = [(c.action, c.effect, c.status, c.attempts) for c in detail.checkpoints]
        story.killed_events = [e.kind for e in detail.events]
        say(f"   reason: {detail.row.reason}")
        say("   events: " + ", ".join(e.kind + (f" ({e.action})" if e.action else "") for e in detail.events))
        story.notify_effects = sum(e.body.get("member_id") == "m-ben" for e in ledger.effects(endpoint="notify"))
        story.notify_calls = ledger.calls("notify") - notify_before
        story.killed_left = left(ben)
        say(
            f"   the ledger: {story.notify_calls} notify request for m-ben, {story.notify_effects} applied"
            " (the killed worker's): never sent again; no final write yet, so no balance and no fence"
        )
        story.incident_lines = _incidents(settings, db)
        for line in story.incident_lines:
            say(f"   {line}")
    return story


def _execution_of(conn: psycopg.Connection, job_id: uuid.UUID) -> ExecutionDetail:
    row = conn.execute(EXECUTION_OF_JOB, {"job_id": job_id}).fetchone()
    detail = get_execution(conn, row[0]) if row is not None else None
    if detail is None:
        raise RuntimeError(f"the demo expected an execution of job {job_id} and found none")
    return detail


def _kill_mid_send(database_url: str, ledger_url: str, reached: Callable[[], bool]) -> tuple[int, int]:
    """Start ``core-jobs worker --once`` on the ledger consumer; SIGKILL it once ``reached()``; (pid, exit code)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env |= {f"{ENV_PREFIX}DATABASE_URL": database_url, ledger_points.LEDGER_URL_VARIABLE: ledger_url}
    command = [sys.executable, "-m", "maintenance", "worker", "--consumer", CONSUMER_PATH, "--once"]
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(lambda: reached() or process.poll() is not None, WORKER_TIMEOUT_S)
            if process.poll() is not None:
                output.seek(0)
                raise RuntimeError(f"the worker process ended before its notify reached the ledger: {output.read()}")
            os.kill(process.pid, signal.SIGKILL)
            return process.pid, process.wait(timeout=WORKER_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    """Until ``condition()`` holds, checked every 20 ms for at most ``timeout`` s: waiting for a process, not for time."""
    pause = threading.Event()  # never set: a wait that is only a pause
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker process did not reach the ledger in {timeout:g} s")
        pause.wait(0.02)


def _incidents(settings: Settings, db: Database) -> list[str]:
    """The incidents about executions that the alert feed, run again, would post (a dry run: the demo has no token)."""
    stop = threading.Event()  # runs to its end: nothing sets it
    (outcome,) = run_jobs(
        build_jobs(settings, job_env(settings, db, stop=stop), ["alerts"]), db, Telemetry(), stop=stop
    )
    planned = [i for i in getattr(outcome.result, "planned", []) if str(i.kind).startswith(RECONCILIATION_KINDS)]
    lines = [f"the alert feed, run again (dry: no {ENV_PREFIX}BETTERSTACK_API_TOKEN), would post:"]
    for incident in planned:
        lines += [f"  incident: {incident.name}", f"      {incident.summary}"]
    return lines if planned else [lines[0] + " no incident about executions"]
