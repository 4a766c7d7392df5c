"""What a PostgreSQL failover mid-drain costs the promise, per replication mode and queue: jobs lost, effects doubled.

    uv run python bench/failover.py                                  # 20 failovers, 1000 jobs, both modes, reference queue
    uv run python bench/failover.py --queue rabbitmq --mode asynchronous
    uv run python bench/failover.py --failovers 30 --jobs 2000 --queue reference --queue rabbitmq
    uv run python bench/failover.py --consumer send --mode asynchronous --queue rabbitmq --guard barrier

Each run starts the failover rig (tests/support/failover.py: a private primary and a streaming
standby, asynchronous or ``ANY 1`` synchronous; the machine's server is not used), publishes
``--jobs`` jobs of the rig's effect consumer, each holding its transaction ``--work-ms`` (tests/support/failover_consumers.py) — on the
reference queue in the replicated database, or on the RabbitMQ at ``--rabbit-url`` under a queue
prefix of its own — and drains them with a supervised ``core-jobs worker`` on the multi-host URL
while the primary is killed (``pg_ctl stop -m immediate``) and the standby promoted ``--failovers``
times, a new standby built after each. Once nothing is left on the queue, every job is counted
in the independent effects table and the dead letters.

Printed per mode and queue: failovers, jobs, effects, dead letters, **lost** (no effect, no dead
letter), **double** (two effects or more), an effect *and* a dead letter, the worker's restarts
(a worker that reconnects by itself has none), the failover and rebuild times (median / max), and
the drain's wall time. Retries the failovers scheduled are made due at once (what waiting would do).

``--consumer send``: each job first makes a NON_IDEMPOTENT_WRITE, a real HTTP request to the local loyalty ledger
(demo/core_jobs_demo/ledger.py, a server in this process; ``support.failover_consumers:notifier``), which counts the
requests per job; then the effect. Printed instead: effects, dead letters, **sends**, **keys sent twice**, executions
held **RECONCILIATION_REQUIRED** (a send in doubt, never repeated), **lost** (no effect, no dead letter, no
reconciliation) and of those the ones lost after their send. Over asynchronous standbys a worker refuses such a
consumer (and any broker queue) unless told: ``--guard accept`` (CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION,
the default: what is lost is measured) or ``--guard barrier`` (CORE_JOBS_WORKER_AWAIT_STANDBY); synchronous runs
take neither.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import failover
from support.failover import FailoverRig
from support.failover_consumers import LEDGER_URL_VARIABLE, NOTIFIER_QUEUE, QUEUE, sends_per_job
from support.waiting import wait_until

from core_jobs_demo.ledger import LoyaltyLedger
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.queue.rabbitmq import RabbitQueue

# --consumer: the consumer the worker runs, and its queue.
CONSUMERS = {
    "effect": ("support.failover_consumers:effect", QUEUE),
    "send": ("support.failover_consumers:notifier", NOTIFIER_QUEUE),
}
GUARDS = {
    "accept": {"CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION": "true"},
    "barrier": {"CORE_JOBS_WORKER_AWAIT_STANDBY": "PT1M"},
}
TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000be")  # the jobs' tenant


def make_due(rig: FailoverRig, queue: str) -> None:
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        conn.execute("UPDATE core.queue_messages SET run_at = now() WHERE queue = %s AND run_at > now()", (queue,))
        conn.execute("UPDATE core.executions SET run_at = now() WHERE status = 'RETRY_WAIT' AND run_at > now()")


class Reference:
    """The reference queue, in the replicated database."""

    name = "reference"

    def __init__(self, rig: FailoverRig, queue: str) -> None:
        self.rig, self.queue = rig, queue

    def publish(self, envelopes: list[Envelope]) -> None:
        with psycopg.connect(self.rig.primary_url(), autocommit=True) as conn, conn.transaction():
            port = PgQueue(conn)
            for envelope in envelopes:
                port.publish(self.queue, envelope)
        self.rig.wait_caught_up()  # every message on the standby: what a failover may lose is the drain's

    def worker_env(self) -> dict[str, str]:
        return {}

    def settled(self) -> bool:
        make_due(self.rig, self.queue)
        return failover.queue_empty(self.rig, self.queue)

    def close(self) -> None:
        pass


class Rabbit:
    """RabbitMQ at ``url``, under a queue prefix of this run's own (deleted afterwards)."""

    name = "rabbitmq"

    def __init__(self, rig: FailoverRig, url: str, queue: str) -> None:
        self.rig, self.url, self.queue = rig, url, queue
        self.prefix = f"bench.failover.{uuid.uuid4().hex[:8]}."

    def publish(self, envelopes: list[Envelope]) -> None:
        with psycopg.connect(self.rig.primary_url(), autocommit=True) as conn:
            port = RabbitQueue(self.url, conn, worker="bench", prefix=self.prefix)
            try:
                port.publish_many([(self.queue, envelope) for envelope in envelopes])
            finally:
                port.close()

    def worker_env(self) -> dict[str, str]:
        return {"CORE_JOBS_QUEUE_URL": f"{self.url}{'&' if '?' in self.url else '?'}prefix={self.prefix}"}

    def queues(self) -> dict[str, int]:
        """Messages (ready and unacked) of each broker queue of the prefix: delay buckets and .exhausted included."""
        listed = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "name", "messages"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        rows = (line.split("\t") for line in listed if line.startswith(self.prefix))
        return {name: int(count) for name, count in rows}

    def settled(self) -> bool:
        return not any(self.queues().values())

    def close(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        for name in self.queues():
            channel.queue_delete(name)
        connection.close()


def run(
    mode: str,
    queue: str,
    *,
    consumer: str = "effect",
    guard: str = "accept",
    failovers: int,
    jobs: int,
    work_ms: int,
    rabbit_url: str,
) -> dict[str, object]:
    path, queue_name = CONSUMERS[consumer]
    asynchronous = mode == "asynchronous"
    # Over asynchronous standbys the worker refuses a broker queue and a NON_IDEMPOTENT_WRITE (harness/durability.py).
    guarded = asynchronous and (queue == "rabbitmq" or consumer == "send")
    with failover.failover_rig(synchronous=not asynchronous) as rig, LoyaltyLedger() as ledger:
        target: Reference | Rabbit = (
            Reference(rig, queue_name) if queue == "reference" else Rabbit(rig, rabbit_url, queue_name)
        )
        try:
            job_ids = [uuid.uuid4() for _ in range(jobs)]
            target.publish(
                [
                    Envelope(job_id=j, payload={"n": n, "work_ms": work_ms}, tenant_id=TENANT)
                    for n, j in enumerate(job_ids)
                ]
            )
            log = Path(tempfile.mkdtemp(prefix="core-jobs-failover-bench-")) / "worker.log"
            env = target.worker_env() | (GUARDS[guard] if guarded else {}) | {LEDGER_URL_VARIABLE: ledger.url}
            began = time.monotonic()
            worker = failover.SupervisedWorker(rig.url(), path, log, env=env).start()
            try:
                counted = failover.fail_over_mid_drain(
                    rig,
                    failovers=failovers,
                    jobs=jobs,
                    timeout=300,
                    progress=failover.effects if consumer == "effect" else failover.ended,
                )
                wait_until(target.settled, 300, f"every message of {queue_name} acked")
            finally:
                worker.stop()
            drained = time.monotonic() - began
            with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
                figures = (
                    failover.tally(conn, job_ids).figures()
                    if consumer == "effect"
                    else failover.tally_sends(
                        conn, job_ids, sends_per_job(e.body for e in ledger.effects(endpoint="notify")), queue_name
                    ).figures()
                )
        finally:
            target.close()
        late = sum(1 for count in counted if count >= jobs)
        return {
            "mode": mode,
            "queue": queue,
            "guard": guard if guarded else "-",
            "failovers": rig.failovers,
            "after_drain": late,
            **figures,
            "restarts": len(worker.exits),
            "failover_s": _spread(rig.timings.failover),
            "rebuild_s": _spread(rig.timings.rebuild[1:]),  # the first standby is the rig's start
            "drain_s": round(drained, 1),
            "load": Path("/proc/loadavg").read_text().split()[0],
            "log": str(log),
        }


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}/{max(values):.2f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--work-ms", type=int, default=20, help="how long each job's work holds its transaction")
    parser.add_argument("--mode", action="append", choices=("asynchronous", "synchronous"))
    parser.add_argument("--queue", action="append", choices=("reference", "rabbitmq"))
    parser.add_argument("--consumer", default="effect", choices=tuple(CONSUMERS), help="send: a NON_IDEMPOTENT_WRITE")
    parser.add_argument(
        "--guard", action="append", choices=tuple(GUARDS), help="what lets an asynchronous run start (default accept)"
    )
    parser.add_argument(
        "--rabbit-url", default=os.environ.get("CORE_JOBS_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    args = parser.parse_args(argv)
    columns: list[str] = []
    for queue in args.queue or ["reference"]:
        for mode in args.mode or ["asynchronous", "synchronous"]:
            for guard in args.guard or ["accept"]:
                row = run(
                    mode,
                    queue,
                    consumer=args.consumer,
                    guard=guard,
                    failovers=args.failovers,
                    jobs=args.jobs,
                    work_ms=args.work_ms,
                    rabbit_url=args.rabbit_url,
                )
                if not columns:
                    columns = list(row)
                    print(" ".join(columns), flush=True)
                print(" ".join(str(row[c]) for c in columns), flush=True)
                if row["guard"] == "-":
                    break  # a guard changes nothing here: one row
    return 0


if __name__ == "__main__":
    sys.exit(main())
