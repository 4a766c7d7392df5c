"""Benchmark of pickup latency on the reference queue: waking on NOTIFY against polling.

    uv run python bench/pickup.py                       # 3 rounds of 20 s per mode, 100 jobs/s
    uv run python bench/pickup.py --rounds 5 --seconds 30 --rate 100

Two worker processes (``core-jobs worker``'s ``Worker``, one thread, batch 10, the default
``poll_interval`` of 1 s), each alone in a scratch database of its own: one listening
(``listen=True``, harness/queue/wakeup.py), one polling only (``listen=False``). A publisher
publishes one job per transaction (``PgQueue.publish``) at ``--rate`` jobs/s on a fixed schedule for
``--seconds`` to one of them, then to the other; the order alternates round by round, so drift on a
shared machine hits both alike. The **pickup latency** of a job is from its publish's commit (when
``COMMIT`` returned to the publisher) to its handler's start in the worker, both read on
``time.monotonic()`` — CLOCK_MONOTONIC, one clock for every process of the machine. The handler does
nothing (the fence is still written). Prints p50/p95/p99/max per mode over every round and the
polling/NOTIFY ratio; target p99 ≤ 10 ms with NOTIFY at 100 jobs/s.

First, **idle load**: both workers idle for ``--idle-seconds``; the claims each worker made (counted
in its process) and the transactions each database committed meanwhile
(``pg_stat_database.xact_commit``), per second. Listening must add none: the listening connection
sends nothing while it waits, and the threads poll as often as before.

Server: ``HARNESS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from core_jobs_demo import scratch_database
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TTL = timedelta(days=7)
TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000be")
QUEUE = "bench.pickup"
MODES = ("notify", "poll")


class Job(BaseModel):
    n: int


def _work(url: str, listen: bool, ready: mp.Event, stop: mp.Event, results: Connection, claims: Any) -> None:
    """A worker process: records (job n, when its handler started) and sends them back when stopped; counts its
    claims in ``claims`` (shared with the parent)."""
    configure_logging(level="ERROR")
    started: list[tuple[int, float]] = []
    claim = PgQueue.claim

    def counted(self: PgQueue, queue: str, limit: int) -> Any:
        with claims.get_lock():
            claims.value += 1
        return claim(self, queue, limit)

    PgQueue.claim = counted  # type: ignore[method-assign]  # this process's worker only

    def record(conn, payload: Job, ctx) -> None:
        started.append((payload.n, time.monotonic()))

    consumer = Consumer(name="bench.pickup", queue=QUEUE, payload_schema=Job, handler=record)
    worker = Worker(
        url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, listen=listen),  # the defaults: batch 10, poll_interval 1 s
        metrics=HarnessMetrics(CollectorRegistry()),
    )
    threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
    ready.set()
    worker.run()
    results.send(started)


def publish_for(url: str, rate: float, seconds: float, first: int) -> dict[int, float]:
    """Jobs ``first``… published one per transaction at ``rate``/s for ``seconds``; each n's commit time."""
    committed: dict[int, float] = {}
    interval = 1 / rate
    with connect(url, autocommit=True) as conn:
        queue = PgQueue(conn)
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            due = start + i * interval
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            n = first + i
            queue.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT))
            committed[n] = time.monotonic()
    return committed


def drained(url: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    with connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the worker did not drain its queue"
            time.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def commits(server: str, names: dict[str, str]) -> dict[str, int]:
    with connect(server, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, xact_commit FROM pg_stat_database WHERE datname = ANY(%s)", (list(names.values()),)
        ).fetchall()
    by_name = dict(rows)
    return {mode: by_name[name] for mode, name in names.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100, help="jobs published per second (default 100)")
    parser.add_argument("--seconds", type=float, default=20, help="publishing per mode and round (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the modes alternating (default 3)")
    parser.add_argument("--idle-seconds", type=float, default=10, help="idle-load measurement (default 10)")
    args = parser.parse_args()
    configure_logging(level="ERROR")
    server = os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER)

    with ExitStack() as stack:
        urls = {mode: stack.enter_context(scratch_database(server, prefix="bench_pickup")) for mode in MODES}
        names = {mode: urlsplit(url).path.lstrip("/") for mode, url in urls.items()}
        stop = mp.Event()
        workers = {}
        for mode, url in urls.items():
            migrate.upgrade(url)
            ready, (receive, send), claims = mp.Event(), mp.Pipe(duplex=False), mp.Value("q", 0)
            process = mp.Process(target=_work, args=(url, mode == "notify", ready, stop, send, claims))
            process.start()
            ready.wait()
            workers[mode] = (process, receive, claims)
        try:
            time.sleep(2)  # both idle: connected, first claim done, listening
            before = commits(server, names)
            claimed = {mode: claims.value for mode, (_p, _r, claims) in workers.items()}
            time.sleep(args.idle_seconds)
            after = commits(server, names)
            idle = {mode: (after[mode] - before[mode]) / args.idle_seconds for mode in MODES}
            idle_claims = {
                mode: (claims.value - claimed[mode]) / args.idle_seconds for mode, (_p, _r, claims) in workers.items()
            }

            committed: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
            for r in range(args.rounds):
                order = MODES if r % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    first = len(committed[mode])
                    committed[mode].update(publish_for(urls[mode], args.rate, args.seconds, first))
                    drained(urls[mode])
        finally:
            stop.set()
        latencies: dict[str, list[float]] = {}
        for mode, (process, receive, _claims) in workers.items():
            started = dict(receive.recv())
            process.join(30)
            assert set(started) == set(committed[mode]), f"{mode}: jobs not handled"
            latencies[mode] = [(started[n] - committed[mode][n]) * 1000 for n in committed[mode]]

    jobs = len(latencies["notify"])
    print(
        f"Pickup latency, publish commit -> handler start (ms), {args.rate:g} jobs/s, {args.rounds} rounds x"
        f" {args.seconds:g} s per mode, interleaved; {jobs} jobs per mode; batch 10, poll_interval 1 s:"
    )
    stats = {}
    for mode, label in (("notify", "NOTIFY (listen, default)"), ("poll", "polling only (listen off)")):
        values = latencies[mode]
        stats[mode] = {q: percentile(values, q) for q in (0.5, 0.95, 0.99)}
        print(
            f"  {label:<27} p50 {stats[mode][0.5]:7.2f}  p95 {stats[mode][0.95]:7.2f}  p99 {stats[mode][0.99]:7.2f}"
            f"  max {max(values):7.2f}"
        )
    print(
        "  polling / NOTIFY:           "
        + "  ".join(f"p{int(q * 100)} {stats['poll'][q] / stats['notify'][q]:.0f}x" for q in (0.5, 0.95, 0.99))
        + "   target: NOTIFY p99 <= 10 ms"
    )
    print(
        f"Idle load over {args.idle_seconds:g} s, per second: claims NOTIFY {idle_claims['notify']:.2f}, polling"
        f" {idle_claims['poll']:.2f}; transactions committed in each worker's database (pg_stat_database, flushed"
        f" by the backends at most once a second, so +-1 flush) NOTIFY {idle['notify']:.2f}, polling {idle['poll']:.2f}"
    )


if __name__ == "__main__":
    main()
