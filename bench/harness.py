"""Benchmark of the consumer harness: what the fence costs, and what the reference queue carries.

    uv run python bench/harness.py                      # defaults below
    uv run python bench/harness.py --fence-jobs 2000 --queue-jobs 10000

1. **Fence overhead.** On one connection, the example points consumer's work transaction
   (one upsert of a balance) run alternately (a) bare — ``BEGIN; work; COMMIT`` — and (b)
   through ``harness.handling.handle`` — payload validation, ``INSERT … ON CONFLICT DO NOTHING``
   of the fence, the same work, ``COMMIT``. Also (c) the bare transaction plus only the fence
   INSERT, to separate the SQL from the Python. Prints each median and p95 and the median added
   by the fence (target ≤ 0.5 ms).
2. **Queue throughput.** N trivial jobs (the handler does nothing; the fence is still written)
   enqueued on the reference queue, drained by ``Worker.run(once=True)`` in 1 process (batch
   100), in 2 processes (batch 100; target ≥ 1 000 jobs/s) and in 2 processes at the default
   batch of 10; the three alternate within each of ``--rounds`` rounds. Prints each median and
   the 2-vs-1 ratio. The clock starts when every process has imported and connected.

Ratios measured in one run matter more than absolute figures on a shared 2-core machine.
Server: ``HARNESS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``
(the benchmark creates and drops its own scratch databases there).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from core_jobs_demo import scratch_database
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.examples.points import CREDIT_POINTS, make_consumer
from harness.handling import INSERT_FENCE, handle
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Acked, Delivery, Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TTL = timedelta(days=7)
TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000be")


class Anything(BaseModel):
    n: int


def _noop(conn, payload, ctx) -> None:
    return None


TRIVIAL = Consumer(name="bench.trivial", queue="bench.trivial", payload_schema=Anything, handler=_noop)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fence_overhead(url: str, jobs: int) -> dict[str, list[float]]:
    """Per-transaction wall times in ms of: bare work, work + fence SQL, handle() (validation + fence + work)."""
    consumer = make_consumer()
    metrics = HarnessMetrics(CollectorRegistry())
    policy = RetryPolicy()
    times: dict[str, list[float]] = {"bare": [], "fence_sql": [], "handle": []}
    with connect(url, autocommit=True) as conn:

        def bare(i: int) -> None:
            with conn.transaction():
                conn.execute(CREDIT_POINTS, {"tenant_id": TENANT, "member_id": f"m-{i % 100}", "points": 1})

        def fence_sql(i: int) -> None:
            with conn.transaction():
                conn.execute(
                    INSERT_FENCE, {"job_id": uuid.uuid4(), "consumer": consumer.name, "tenant_id": TENANT, "ttl": TTL}
                ).fetchone()
                conn.execute(CREDIT_POINTS, {"tenant_id": TENANT, "member_id": f"m-{i % 100}", "points": 1})

        def through_handle(i: int) -> None:
            envelope = Envelope(
                job_id=uuid.uuid4(), payload={"member_id": f"m-{i % 100}", "points": 1}, tenant_id=TENANT
            )
            outcome = handle(
                conn,
                consumer,
                Delivery(queue=consumer.queue, envelope=envelope, attempt=1),
                policy=policy,
                fence_ttl=TTL,
                metrics=metrics,
            )
            assert outcome == Acked()

        variants = {"bare": bare, "fence_sql": fence_sql, "handle": through_handle}
        for i in range(200):  # warm-up: connections, plans, caches
            for run in variants.values():
                run(i)
        for i in range(jobs):  # interleaved, so drift on a shared machine hits all three alike
            for name, run in variants.items():
                started = time.perf_counter()
                run(i)
                times[name].append((time.perf_counter() - started) * 1000)
    return times


def _drain(url: str, batch_size: int, ready: mp.Barrier) -> None:
    configure_logging(level="ERROR")
    config = WorkerConfig(fence_ttl=TTL, batch_size=batch_size, lease=timedelta(minutes=5))
    worker = Worker(url, TRIVIAL, policy=RetryPolicy(), config=config, metrics=HarnessMetrics(CollectorRegistry()))
    with connect(url):  # warm the libpq and server-side connection path before the clock starts
        pass
    ready.wait()
    worker.run(once=True)


def throughput(url: str, jobs: int, processes: int, batch_size: int) -> float:
    """Jobs/s of ``processes`` worker processes draining ``jobs`` trivial jobs."""
    with connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE core.queue_messages, core.processed_jobs")
        # Published through the port, as every producer does (one statement: PgQueue.publish_many).
        PgQueue(conn).publish_many(
            [
                (TRIVIAL.queue, Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT))
                for n in range(1, jobs + 1)
            ]
        )
        conn.execute("VACUUM ANALYZE core.queue_messages")
    ready = mp.Barrier(processes + 1)  # the clock starts once every process has imported everything
    workers = [mp.Process(target=_drain, args=(url, batch_size, ready)) for _ in range(processes)]
    for w in workers:
        w.start()
    ready.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    with connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0]
        done = conn.execute("SELECT count(*) FROM core.processed_jobs").fetchone()[0]
    assert left == 0 and done == jobs, (left, done)
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fence-jobs", type=int, default=3000, help="transactions per variant (default 3000)")
    parser.add_argument("--queue-jobs", type=int, default=10000, help="jobs per throughput run (default 10000)")
    parser.add_argument("--batch-size", type=int, default=100, help="claim batch of the throughput runs (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3)")
    args = parser.parse_args()
    configure_logging(level="ERROR")
    server = os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER)

    with scratch_database(server) as url:
        migrate.upgrade(url)
        times = fence_overhead(url, args.fence_jobs)
        medians = {k: statistics.median(v) for k, v in times.items()}
        print(f"Fence overhead, {args.fence_jobs} transactions per variant, interleaved, one connection (ms):")
        for name, label in (
            ("bare", "bare work transaction"),
            ("fence_sql", "work + fence INSERT"),
            ("handle", "handle(): validate + fence + work"),
        ):
            print(f"  {label:<36} median {medians[name]:.3f}  p95 {percentile(times[name], 0.95):.3f}")
        print(
            f"  added by the fence SQL:   median {medians['fence_sql'] - medians['bare']:+.3f} ms"
            f" ({medians['fence_sql'] / medians['bare']:.2f}x)"
        )
        print(
            f"  added by handle() in all: median {medians['handle'] - medians['bare']:+.3f} ms"
            f" ({medians['handle'] / medians['bare']:.2f}x)   target <= 0.5 ms"
        )

        print(
            f"\nReference queue throughput, {args.queue_jobs} trivial jobs per run, {args.rounds} rounds"
            " (configurations alternate within each round; median of the rounds):"
        )
        configs = {
            f"1 process, batch {args.batch_size}": (1, args.batch_size),
            f"2 processes, batch {args.batch_size}": (2, args.batch_size),
            "2 processes, batch 10 (default)": (2, 10),
        }
        rates: dict[str, list[float]] = {label: [] for label in configs}
        for _ in range(args.rounds):
            for label, (processes, batch) in configs.items():
                rates[label].append(throughput(url, args.queue_jobs, processes, batch))
        labels = list(configs)
        for label in labels:
            print(
                f"  {label:<32} median {statistics.median(rates[label]):6.0f} jobs/s"
                f"   (runs: {', '.join(f'{r:.0f}' for r in rates[label])})"
            )
        ratio = statistics.median(rates[labels[1]]) / statistics.median(rates[labels[0]])
        print(f"  2 processes / 1 process: {ratio:.2f}x   target >= 1000 jobs/s with 2 processes")


if __name__ == "__main__":
    main()
