"""The price of a failover that loses nothing: the drain with no standby, an asynchronous one, a synchronous one and
the replication barrier, interleaved, in jobs/s and as ratios to no standby.

    uv run python bench/replication_cost.py                          # 3 rounds of 1000 jobs, both queues
    uv run python bench/replication_cost.py --rounds 5 --jobs 2000 --queue rabbitmq

One failover rig (tests/support/failover.py: a private primary and a streaming standby on ports of their own; the
machine's server is not used) is switched between the modes before each drain: **none** (the standby stopped, no
``synchronous_standby_names``: a single node), **asynchronous** (the standby streaming), **synchronous**
(``ANY 1 (standby1)``, reloaded: each commit waits for the standby's flush) and, on a broker only, **barrier**
(asynchronous, ``CORE_JOBS_WORKER_AWAIT_STANDBY``: each batch's ack waits until the standby flushed its commit —
on the reference queue the ack is in the same database and the barrier never waits). The rig runs ``fsync = off``
(a crash of processes, never of the machine): the standby's round trip is what is measured, not a disk's flush.

Each drain publishes ``--jobs`` jobs of the rig's effect consumer (one row each in the effects table, work 0 ms)
and runs an in-process worker (``--batch-size``, one thread) over them to the end, its rate taken between the first
and the last effect (the database's clock); the modes' order rotates each round. Printed per queue and mode: the median jobs/s over the rounds, each round's, and the ratio to **none**. The
load average is printed before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pika
import psycopg
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.failover import STANDBY_NAME, FailoverRig, failover_rig
from support.failover_consumers import QUEUE, effect

from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.queue.rabbitmq import RabbitQueue
from harness.worker import Worker, WorkerConfig
from maintenance.runtime.logs import configure_logging

MODES = ("none", "asynchronous", "synchronous", "barrier")
TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000bf")


def set_mode(rig: FailoverRig, mode: str, current: list[str]) -> None:
    """The rig switched to ``mode`` (the standby stopped or started, synchronous_standby_names reloaded)."""
    names = f"ANY 1 ({STANDBY_NAME})" if mode == "synchronous" else ""
    with psycopg.connect(rig.primary_url("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
    if mode == "none" and current[0] != "none":
        rig.stop_standby()
    elif mode != "none" and current[0] == "none":
        rig.start_standby()
    if mode == "synchronous":  # streaming already: until it counts in the quorum
        _wait_quorum(rig)
    current[0] = mode


def _wait_quorum(rig: FailoverRig) -> None:
    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(rig.primary_url("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
        if row and row[0] == "quorum":
            return
        assert time.monotonic() < deadline, "the standby never joined the quorum"
        time.sleep(0.05)


def envelopes(jobs: int) -> list[Envelope]:
    return [Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT) for n in range(jobs)]


def publish(rig: FailoverRig, queue: str, rabbit_url: str, prefix: str, batch: list[Envelope]) -> None:
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        if queue == "reference":
            with conn.transaction():
                port = PgQueue(conn)
                for envelope in batch:
                    port.publish(QUEUE, envelope)
            return
        broker = RabbitQueue(rabbit_url, conn, worker="bench", prefix=prefix)
        try:
            broker.publish_many([(QUEUE, envelope) for envelope in batch])
        finally:
            broker.close()


def sep(url: str) -> str:
    return "&" if "?" in url else "?"


def drain(rig: FailoverRig, queue: str, mode: str, rabbit_url: str, prefix: str, batch_size: int) -> None:
    queue_url = None if queue == "reference" else f"{rabbit_url}{sep(rabbit_url)}prefix={prefix}&claim_wait=5000"
    worker = Worker(
        rig.url(),
        effect,
        policy=RetryPolicy(),
        config=WorkerConfig(
            fence_ttl=timedelta(days=7),
            batch_size=batch_size,
            await_standby=timedelta(seconds=30) if mode == "barrier" else None,
            accept_asynchronous_replication=True,
        ),
        metrics=HarnessMetrics(CollectorRegistry()),
        queue_url=queue_url,
    )
    worker.run(once=True)


def last_effect(rig: FailoverRig) -> int:
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM public.failover_effects").fetchone()[0]


def drain_rate(rig: FailoverRig, after: int) -> tuple[int, float]:
    """The effects past id ``after``: how many, and how many per second between the first and the last (the
    database's clock: the worker's start and its last empty claim are not the drain's)."""
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        count, span = conn.execute(
            "SELECT count(*), extract(epoch FROM max(at) - min(at)) FROM public.failover_effects WHERE id > %s",
            (after,),
        ).fetchone()
    return count, (count - 1) / float(span)


def delete_queues(rabbit_url: str, prefix: str) -> None:
    listed = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name"], capture_output=True, text=True, check=False)
    connection = pika.BlockingConnection(pika.URLParameters(rabbit_url))
    channel = connection.channel()
    for name in listed.stdout.split():
        if name.startswith(prefix):
            channel.queue_delete(name)
    connection.close()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--queue", action="append", choices=("reference", "rabbitmq"))
    parser.add_argument(
        "--rabbit-url", default=os.environ.get("CORE_JOBS_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    args = parser.parse_args(argv)
    configure_logging(fmt="text", level="ERROR", secrets=())  # the worker's events would drown the figures
    queues = args.queue or ["reference", "rabbitmq"]
    print(f"loadavg before {loadavg()}", flush=True)
    rates: dict[tuple[str, str], list[float]] = {}
    prefix = f"bench.replication.{uuid.uuid4().hex[:8]}."
    with failover_rig(synchronous=False) as rig:
        current = ["asynchronous"]
        try:
            for round_ in range(args.rounds):
                for queue in queues:
                    modes = [m for m in MODES if queue == "rabbitmq" or m != "barrier"]
                    shift = round_ % len(modes)
                    for mode in modes[shift:] + modes[:shift]:
                        set_mode(rig, mode, current)
                        publish(rig, queue, args.rabbit_url, prefix, envelopes(args.jobs))
                        before = last_effect(rig)
                        drain(rig, queue, mode, args.rabbit_url, prefix, args.batch_size)
                        done, rate = drain_rate(rig, before)
                        assert done == args.jobs, f"{queue} {mode}: {done} effects of {args.jobs} jobs"
                        rates.setdefault((queue, mode), []).append(rate)
                        print(f"round {round_ + 1} {queue} {mode}: {rate:.0f} jobs/s", flush=True)
            if current[0] == "none":
                rig.start_standby()
        finally:
            if "rabbitmq" in queues:
                delete_queues(args.rabbit_url, prefix)
    print(f"loadavg after {loadavg()}")
    print("queue mode jobs_per_s(median) ratio_to_none rounds")
    for queue in queues:
        base = statistics.median(rates[(queue, "none")])
        for mode in MODES:
            if (queue, mode) not in rates:
                continue
            median = statistics.median(rates[(queue, mode)])
            rounds = ",".join(f"{r:.0f}" for r in rates[(queue, mode)])
            print(f"{queue} {mode} {median:.0f} {median / base:.2f} {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
