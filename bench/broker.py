"""core-jobs on RabbitMQ beside its own queue and beside Celery: jobs/s, and effects per job after a SIGKILL.

    uv run --group bench python bench/broker.py                    # 10 000 jobs, 3 rounds, 3 kills
    uv run --group bench python bench/broker.py --jobs 2000 --rounds 1 --kills 1   # quicker

The same trivial consumer — one INSERT of the job's id into ``bench_effects`` in the work
transaction — drained by **2 worker processes** of each system, the systems alternating within
each round:

- **core-jobs on RabbitMQ**: ``harness.worker.Worker`` with ``queue_url=amqp://…`` (the adapter
  harness/queue/rabbitmq.py: a quorum queue, prefetch = the batch of 10, the fence in the work
  transaction, acks after the commit);
- **core-jobs on its reference queue** (``core.queue_messages``, batch 10);
- **Celery** with ``acks_late`` on the same RabbitMQ — what a Python team would pick: at-least-once,
  no fence — one ``solo`` worker per process, prefetch 10 (``worker_prefetch_multiplier``), its
  default (classic, durable) queue, and once more on a quorum queue (``celery-quorum``), the
  queue type our adapter declares;
- **Celery's default pool** (``celery-prefork``): one worker with the ``prefork`` pool, concurrency 2
  (its parent process and 2 children), prefetch 10 per child, on a classic queue: how
  ``celery worker`` runs when given no ``--pool``. Its crash run SIGKILLs the parent.

**Throughput** is measured on the database's clock, from the first effect's commit to the last
(``clock_timestamp()`` of each row), so no system is charged for its start-up. **Crash**: the
same drain, and each time another ``N/(kills+1)`` jobs have taken effect one worker process is
SIGKILLed and a fresh one started; once every job has taken effect (or, on core-jobs, has a dead
letter instead) and nothing changes for 1.5 s, it counts effect rows per job and the jobs
dead-lettered without an effect. An at-least-once consumer redoes the job in hand when its ack was lost;
core-jobs redelivers it too, and the fence makes the redelivery a no-op.

The brokers: ``BENCH_RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/%2F``);
PostgreSQL: ``CORE_JOBS_BENCH_DATABASE_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``,
where it creates and drops a scratch database). Ratios measured in one run matter more than the
absolute figures on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pika
import psycopg
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from bench.harness import DEFAULT_SERVER, TTL
from core_jobs_demo import scratch_database
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

DEFAULT_RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/%2F"
BATCH = 10
PROCESSES = 2

EFFECTS = """
CREATE TABLE IF NOT EXISTS bench_effects (
    system text NOT NULL,
    job_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
# The consumer's whole work: no unique key, so a second effect of a job is a second row.
RECORD_EFFECT = "INSERT INTO bench_effects (system, job_id) VALUES (%(system)s, %(job_id)s)"
PROGRESS = "SELECT count(DISTINCT job_id), count(*) FROM bench_effects WHERE system = %(system)s"
# Jobs with a dead letter and no effect: settled too (core-jobs's promise is one effect or one dead letter each).
DEAD_LETTERED = """
SELECT count(DISTINCT job_id) FROM core.dead_letters
 WHERE queue = 'bench.' || %(system)s
   AND job_id NOT IN (SELECT job_id FROM bench_effects WHERE system = %(system)s)
"""
SPAN = "SELECT extract(epoch FROM max(at) - min(at)) FROM bench_effects WHERE system = %(system)s"


class Job(BaseModel):
    n: int


def _consumer(system: str) -> Consumer:
    def record(conn: psycopg.Connection, payload: Job, ctx: Any) -> None:
        conn.execute(RECORD_EFFECT, {"system": system, "job_id": ctx.job_id})

    return Consumer(name=f"bench.{system}", queue=f"bench.{system}", payload_schema=Job, handler=record)


# --- core-jobs -------------------------------------------------------------------------------------


def _core_jobs_process(url: str, queue_url: str | None, system: str, lease_s: float) -> None:
    configure_logging(level="CRITICAL")
    config = WorkerConfig(
        fence_ttl=TTL, batch_size=BATCH, lease=timedelta(seconds=lease_s), poll_interval=timedelta(milliseconds=50)
    )
    worker = Worker(
        url,
        _consumer(system),
        policy=RetryPolicy(),
        config=config,
        metrics=HarnessMetrics(CollectorRegistry()),
        queue_url=queue_url,
    )
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    worker.run()


def _enqueue_core_jobs(url: str, queue_url: str | None, system: str, jobs: int) -> None:
    from harness.queue.adapters import open_queue

    with connect(url, autocommit=True) as conn:
        port = open_queue(queue_url, conn, lease=timedelta(seconds=30))
        try:
            for start in range(0, jobs, 1000):
                port.publish_many(
                    [
                        (f"bench.{system}", Envelope(job_id=uuid.uuid4(), payload={"n": n}))
                        for n in range(start, min(jobs, start + 1000))
                    ]
                )
        finally:
            port.close()


# --- Celery ----------------------------------------------------------------------------------------

_CELERY_CONN: psycopg.Connection | None = None
_CELERY: dict[str, Any] = {}


def _celery_app(rabbitmq: str, url: str, queue: str, quorum: bool):  # type: ignore[no-untyped-def]
    """The process's one Celery app (tasks are registered by name, process-wide), with ``queue`` declared."""
    from celery import Celery
    from kombu import Queue

    if not _CELERY:
        app = Celery("bench", broker=rabbitmq.replace("amqp://", "pyamqp://", 1))
        app.conf.update(
            task_acks_late=True,
            worker_prefetch_multiplier=BATCH,
            task_queues=[],
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
            task_ignore_result=True,
            # A quorum queue refuses global QoS: the prefetch is per consumer.
            worker_detect_quorum_queues=True,
            worker_enable_remote_control=False,  # no pidbox queue: two workers on one host would share its name
        )

        @app.task(name="bench.effect", acks_late=True)
        def effect(system: str, job_id: str) -> None:
            global _CELERY_CONN
            if _CELERY_CONN is None:
                _CELERY_CONN = psycopg.connect(url, autocommit=True)
            _CELERY_CONN.execute(RECORD_EFFECT, {"system": system, "job_id": job_id})

        _CELERY.update(app=app, effect=effect)
    app = _CELERY["app"]
    if queue not in {q.name for q in app.conf.task_queues}:
        arguments = {"x-queue-type": "quorum"} if quorum else None
        app.conf.task_queues = [*app.conf.task_queues, Queue(queue, durable=True, queue_arguments=arguments)]
    return app, _CELERY["effect"]


def _celery_process(rabbitmq: str, url: str, queue: str, quorum: bool, pool: str = "solo") -> None:
    app, _effect = _celery_app(rabbitmq, url, queue, quorum)
    worker = app.Worker(
        hostname=f"bench-{os.getpid()}@%h",
        pool=pool,
        concurrency=PROCESSES if pool == "prefork" else 1,
        queues=[queue],
        loglevel="ERROR",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        quiet=True,
    )
    worker.start()


def _enqueue_celery(rabbitmq: str, url: str, queue: str, quorum: bool, jobs: int) -> None:
    _app, effect = _celery_app(rabbitmq, url, queue, quorum)
    for _ in range(jobs):
        effect.apply_async(args=(queue, str(uuid.uuid4())), queue=queue)


def _delete_queues(rabbitmq: str, names: list[str]) -> None:
    with pika.BlockingConnection(pika.URLParameters(rabbitmq)) as connection:
        for name in names:
            channel = connection.channel()
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                channel.queue_delete(name)


# --- one run ---------------------------------------------------------------------------------------


class System:
    def __init__(
        self,
        label: str,
        system: str,
        start: Callable[[], mp.Process],
        enqueue: Callable[[int], None],
        processes: int = PROCESSES,
    ):
        self.label, self.system, self.start, self.enqueue = label, system, start, enqueue
        self.processes = processes  # worker processes started (a prefork worker's children are not counted)


def run(url: str, system: System, jobs: int, kills: int) -> tuple[float, int, int, int]:
    """Drain ``jobs`` with 2 processes (SIGKILLing one ``kills`` times); (jobs/s, effect rows, distinct jobs, jobs
    dead-lettered without an effect). Done when every job has an effect or a dead letter."""
    system.enqueue(jobs)
    processes = [system.start() for _ in range(system.processes)]
    thresholds = [jobs * (k + 1) // (kills + 1) for k in range(kills)]
    with connect(url, autocommit=True) as conn:
        before = -1
        while True:
            distinct, _rows = conn.execute(PROGRESS, {"system": system.system}).fetchone()  # type: ignore[misc]
            if thresholds and distinct >= thresholds[0]:
                thresholds.pop(0)
                victim = processes.pop(0)
                os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
                victim.join()
                processes.append(system.start())
            if distinct >= jobs:
                break
            # Dead letters are read only once the effects stop growing, not on every poll of the timed drain.
            if distinct == before and distinct + _dead_lettered(conn, system.system) >= jobs:
                break
            before = distinct
            time.sleep(0.02)
        # Redeliveries of a killed process's messages may still take effect: wait until nothing changes for 1.5 s.
        settled, last = time.monotonic(), None
        while time.monotonic() - settled < 1.5:
            rows = conn.execute(PROGRESS, {"system": system.system}).fetchone()[1]  # type: ignore[index]
            if rows != last:
                settled, last = time.monotonic(), rows
            time.sleep(0.1)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
        distinct, rows = conn.execute(PROGRESS, {"system": system.system}).fetchone()  # type: ignore[misc]
        dead = _dead_lettered(conn, system.system)
        span = conn.execute(SPAN, {"system": system.system}).fetchone()[0]  # type: ignore[index]
        conn.execute("DELETE FROM bench_effects WHERE system = %(system)s", {"system": system.system})
        conn.execute("TRUNCATE core.queue_messages, core.processed_jobs")
    return jobs / float(span), rows, distinct, dead


def _dead_lettered(conn: psycopg.Connection, system: str) -> int:
    return int(conn.execute(DEAD_LETTERED, {"system": system}).fetchone()[0])  # type: ignore[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="jobs per run (default 10000)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3)")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs in the crash run (default 3)")
    parser.add_argument(
        "--only",
        default="rabbitmq,reference,celery,celery-quorum,celery-prefork",
        help="the systems to run, comma-separated (default: rabbitmq,reference,celery,celery-quorum,celery-prefork)",
    )
    args = parser.parse_args()
    configure_logging(level="CRITICAL")
    server = os.environ.get("CORE_JOBS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    rabbitmq = os.environ.get("BENCH_RABBITMQ_URL", DEFAULT_RABBITMQ)
    tag = uuid.uuid4().hex[:6]

    with scratch_database(server, prefix="core_jobs_bench_broker") as url:
        migrate.upgrade(url)
        with connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS)

        def core_jobs(label: str, system: str, queue_url: str | None, lease_s: float) -> System:
            return System(
                label,
                system,
                start=lambda: _started(_core_jobs_process, url, queue_url, system, lease_s),
                enqueue=lambda n: _enqueue_core_jobs(url, queue_url, system, n),
            )

        def celery(label: str, queue: str, quorum: bool, pool: str = "solo") -> System:
            return System(
                label,
                queue,
                start=lambda: _started(_celery_process, rabbitmq, url, queue, quorum, pool),
                enqueue=lambda n: _enqueue_celery(rabbitmq, url, queue, quorum, n),
                processes=1 if pool == "prefork" else PROCESSES,
            )

        every = {
            "rabbitmq": lambda: core_jobs("core-jobs on RabbitMQ", f"rabbit_{tag}", rabbitmq, 30),
            "reference": lambda: core_jobs("core-jobs on its reference queue", f"pg_{tag}", None, 2),
            "celery": lambda: celery("Celery acks_late, classic queue", f"celery_{tag}", quorum=False),
            "celery-quorum": lambda: celery("Celery acks_late, quorum queue", f"celeryq_{tag}", quorum=True),
            "celery-prefork": lambda: celery(
                "Celery acks_late, prefork x2, classic", f"celeryp_{tag}", quorum=False, pool="prefork"
            ),
        }
        systems = [every[name.strip()]() for name in args.only.split(",")]
        baseline = next((s for s in systems if s.label.startswith("Celery")), systems[0])
        try:
            rates: dict[str, list[float]] = {s.label: [] for s in systems}
            print(
                f"Drain, {args.jobs} jobs, {PROCESSES} worker processes, batch/prefetch {BATCH}, {args.rounds} rounds:"
            )
            for _ in range(args.rounds):
                for s in systems:
                    rate, rows, distinct, _dead = run(url, s, args.jobs, kills=0)
                    assert distinct == args.jobs, (s.label, distinct)
                    rates[s.label].append(rate)
            base_rate = statistics.median(rates[baseline.label])
            for s in systems:
                median = statistics.median(rates[s.label])
                runs = ", ".join(f"{r:.0f}" for r in rates[s.label])
                print(
                    f"  {s.label:<36} median {median:7.0f} jobs/s  ({runs})  ratio to {baseline.label}: {median / base_rate:.2f}"
                )

            print(f"\nCrash: the same drain, one worker process SIGKILLed {args.kills} times and replaced:")
            for s in systems:
                rate, rows, distinct, dead = run(url, s, args.jobs, kills=args.kills)
                print(
                    f"  {s.label:<36} {rows} effects for {distinct} jobs: {rows / distinct:.4f} per job,"
                    f" {rows - distinct} duplicated, {dead} dead-lettered without one   ({rate:.0f} jobs/s)"
                )
        finally:
            # The adapter's queues include the work queue's `.exhausted` one (its broker delivery limit's dead letters).
            names = [s.system for s in systems] + [
                f"bench.{s.system}{tail}" for s in systems for tail in ("", ".exhausted")
            ]
            _delete_queues(rabbitmq, names)


def _started(target: Callable[..., None], *args: Any) -> mp.Process:
    process = mp.Process(target=target, args=args, daemon=False)
    process.start()
    return process


if __name__ == "__main__":
    main()
