"""core-jobs beside its peers on PostgreSQL: pgqueuer and procrastinate, draining and enqueuing the same jobs.

    uv run --group bench python bench/peers.py                  # 10 000 jobs, 3 rounds
    uv run --group bench python bench/peers.py --jobs 5000 --rounds 5

**Drain.** ``--jobs`` ready jobs, drained by 2 worker processes of each system, every job doing
the same trivial work — one ``INSERT INTO bench_effects`` — each system the way it is meant to
be used:

- **core-jobs**: ``harness.worker.Worker`` on the reference queue (``PgQueue``), batch 10 and
  100. Exactly once: the INSERT and the job's fence commit in one transaction, shared by
  the batch's jobs (docs/harness.md, "Batched work transactions"); the same consumer with
  ``shares_transactions=False`` (``--per-job``) — one transaction per job; and with a **batch handler**
  (``--batch-handler``): the same effects, a shared transaction's jobs in one ``INSERT`` (docs/harness.md,
  "Batch handlers") — the shape of the database's limit below, which is one statement a batch.
- **pgqueuer** 1.6 as its users run it: its recommended asyncpg driver (``QueueManager`` over
  ``Queries.from_asyncpg_connection``, ``mode=drain``) and an asyncpg pool of 10 per process for
  the jobs' work, batch 10 and 100. At least once: the INSERT commits on a pool connection, then
  the job's completion is buffered in memory and logged with its batch-mates' — a crash in
  between runs the job again, and nothing fences the second run. And **pgqueuer doing
  nothing**: the same with an empty entrypoint, its queue machinery alone.
- **the database's limit**: the same exactly-once work with no worker around it — claim a batch,
  write its fences, INSERT each new job's effect and ack the batch, in one statement
  (:data:`LIMIT_BATCH`) and one synchronous commit a batch, 2 clients.
- **procrastinate** 3.10 (``--procrastinate``) (``App`` with a ``PsycopgConnector``, ``run_worker(wait=False)``,
  concurrency ``--procrastinate-concurrency``). At least once: the INSERT commits, then the
  job's status is written.

Each system has its own scratch database; the configurations alternate within each round (the
machine is shared and noisy), the clock starts once every process has imported and connected,
and stops when both have exited with the queue empty. Each run checks that every job left
exactly one effect. Prints each median in jobs/s, core-jobs's ratio to each peer and the load
average before and after.

**Enqueue.** ``--jobs`` jobs published in one call, alternately: core-jobs's
``PgQueue.publish_many`` (its port's batch publish: one COPY, all or none), pgqueuer's
``Queries.enqueue`` with lists (its batch insert), and ``publish_many`` inside a pipeline, where
it sends one INSERT of arrays (the statement it sent everywhere before the COPY). Prints jobs/s
and the ratios. ``--skip-drain`` runs only this part.

Server: ``HARNESS_BENCH_DATABASE_URL`` (bench/harness.py), default the local test server.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from bench.harness import DEFAULT_SERVER, TENANT, TTL
from core_jobs_demo import scratch_database
from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

QUEUE = "bench.peers"
PROCESSES = 2
# pgqueuer's work pool per process: asyncpg's default pool size, what its users get.
PGQUEUER_POOL = 10

# The one piece of work every system's job does.
EFFECTS_TABLE = "CREATE TABLE bench_effects (n bigint NOT NULL)"
EFFECT = "INSERT INTO bench_effects (n) VALUES (%s)"
EFFECT_ASYNCPG = "INSERT INTO bench_effects (n) VALUES ($1)"
EFFECTS = "SELECT count(*), count(DISTINCT n) FROM bench_effects"


# --- core-jobs ----------------------------------------------------------------------------------


class Numbered(BaseModel):
    n: int


def _effect(conn: psycopg.Connection, payload: Numbered, ctx: JobContext) -> None:
    conn.execute(EFFECT, (payload.n,))


CORE_JOBS = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Numbered, handler=_effect)


def _effects(conn: psycopg.Connection, payloads: list[Numbered], contexts: list[JobContext]) -> None:
    conn.execute(EFFECTS_MANY, ([p.n for p in payloads],))


EFFECTS_MANY = "INSERT INTO bench_effects (n) SELECT unnest(%s::bigint[])"
# The same consumer with a batch handler: a shared transaction's effects in one INSERT.
BATCHED = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Numbered, handler=_effect, batch_handler=_effects)
# The same consumer opting out of shared transactions: one commit per job, as before batched work transactions.
ALONE = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Numbered, handler=_effect, shares_transactions=False)


def core_jobs_fill(url: str, jobs: int) -> None:
    with connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE core.queue_messages, core.processed_jobs, bench_effects")
        PgQueue(conn).publish_many(envelopes(jobs))
        conn.execute("VACUUM ANALYZE core.queue_messages")


def envelopes(jobs: int) -> list[tuple[str, Envelope]]:
    return [(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT)) for n in range(jobs)]


def core_jobs_drain(url: str, batch_size: int, consumer: Consumer, ready: mp.Barrier) -> None:
    configure_logging(level="ERROR")
    config = WorkerConfig(fence_ttl=TTL, batch_size=batch_size, lease=timedelta(minutes=5))
    worker = Worker(url, consumer, policy=RetryPolicy(), config=config, metrics=HarnessMetrics(CollectorRegistry()))
    with connect(url):  # warm the connection path before the clock starts
        pass
    ready.wait()
    worker.run(once=True)


# --- pgqueuer -----------------------------------------------------------------------------------


async def _pgqueuer_install(url: str) -> None:
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await Queries.from_psycopg_connection(conn).install()
        await conn.execute(EFFECTS_TABLE)


async def _pgqueuer_enqueue(url: str, jobs: int) -> float:
    """Seconds ``Queries.enqueue`` takes to insert ``jobs`` jobs in one call (lists: its batch insert)."""
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics, bench_effects")
        queries = Queries.from_psycopg_connection(conn)
        payloads: list[bytes | None] = [str(n).encode() for n in range(jobs)]
        started = time.perf_counter()
        await queries.enqueue([QUEUE] * jobs, payloads, [0] * jobs)
        elapsed = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE pgqueuer")
    return elapsed


async def _pgqueuer_drain(url: str, batch_size: int, work: bool, ready: mp.Barrier) -> None:
    """pgqueuer as its users run it: its recommended asyncpg driver on one connection for the queue (its
    LISTEN included), and an asyncpg pool of :data:`PGQUEUER_POOL` connections for the jobs' work, so its
    concurrent jobs commit side by side. ``work`` False: the entrypoint does nothing (its queue machinery alone)."""
    import asyncpg
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    queue_conn = await asyncpg.connect(url)
    pool = await asyncpg.create_pool(url, min_size=PGQUEUER_POOL, max_size=PGQUEUER_POOL)
    try:
        manager = QueueManager(Queries.from_asyncpg_connection(queue_conn))

        @manager.entrypoint(QUEUE)
        async def effect(job: Job) -> None:
            assert job.payload is not None
            if work:
                async with pool.acquire() as conn:
                    await conn.execute(EFFECT_ASYNCPG, int(job.payload))

        ready.wait()
        await manager.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
    finally:
        await pool.close()
        await queue_conn.close()


def pgqueuer_drain(url: str, batch_size: int, work: bool, ready: mp.Barrier) -> None:
    import logging

    logging.getLogger("pgqueuer").setLevel(logging.ERROR)
    asyncio.run(_pgqueuer_drain(url, batch_size, work, ready))


# --- the database's own limit -------------------------------------------------------------------

# The same exactly-once work with no worker around it: claim a batch, write its fences, do each new job's
# INSERT and ack (delete) the batch's messages, in one statement and one synchronous commit.
LIMIT_BATCH = """
WITH claimed AS (
    SELECT id, job_id, tenant_id, payload
      FROM core.queue_messages
     WHERE queue = %(queue)s AND run_at <= now() AND (lease_expires_at IS NULL OR lease_expires_at <= now())
     ORDER BY run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), fenced AS (
    INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
    SELECT job_id, %(consumer)s, tenant_id, now() + %(ttl)s FROM claimed
    ON CONFLICT DO NOTHING
    RETURNING job_id
), effects AS (
    INSERT INTO bench_effects (n)
    SELECT (c.payload ->> 'n')::bigint FROM claimed AS c JOIN fenced AS f USING (job_id)
), acked AS (
    DELETE FROM core.queue_messages AS m USING claimed AS c WHERE m.id = c.id RETURNING 1
)
SELECT count(*) FROM acked
"""


def limit_drain(url: str, batch_size: int, ready: mp.Barrier) -> None:
    """One client of the database's limit: :data:`LIMIT_BATCH` until a batch finds nothing."""
    params = {"queue": QUEUE, "limit": batch_size, "consumer": QUEUE, "ttl": TTL}
    with connect(url, autocommit=True) as conn:
        ready.wait()
        while conn.execute(LIMIT_BATCH, params, prepare=True).fetchone()[0]:  # type: ignore[index]
            pass


# --- procrastinate ------------------------------------------------------------------------------


def _procrastinate_app(url: str, concurrency: int):  # type: ignore[no-untyped-def]
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    work: dict[str, psycopg.AsyncConnection] = {}

    @app.task(name="effect", queue=QUEUE)
    async def effect(n: int) -> None:
        if "conn" not in work:
            work["conn"] = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await work["conn"].execute(EFFECT, (n,))

    return app, effect, work


def procrastinate_install(url: str) -> None:
    app, _effect_task, _work = _procrastinate_app(url, 1)
    with app.open():
        app.schema_manager.apply_schema()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)


def procrastinate_fill(url: str, jobs: int) -> None:
    app, effect_task, _work = _procrastinate_app(url, 1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events, bench_effects CASCADE")
    with app.open():
        for start in range(0, jobs, 1000):
            effect_task.batch_defer(*[{"n": n} for n in range(start, min(jobs, start + 1000))])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")


def procrastinate_drain(url: str, concurrency: int, ready: mp.Barrier) -> None:
    import logging

    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app, _effect_task, work = _procrastinate_app(url, concurrency)

    async def run() -> None:
        async with app.open_async():
            ready.wait()
            await app.run_worker_async(
                queues=[QUEUE], wait=False, concurrency=concurrency, install_signal_handlers=False, listen_notify=False
            )
        if "conn" in work:
            await work["conn"].close()

    asyncio.run(run())


# --- the runs -----------------------------------------------------------------------------------


def drain(url: str, target: Callable[..., None], args: tuple, jobs: int, left: str, effects: bool = True) -> float:
    """Jobs/s of :data:`PROCESSES` processes running ``target(url, *args, ready)``; checks one effect per job
    (``effects`` False: none, every job done all the same)."""
    ready = mp.Barrier(PROCESSES + 1)
    workers = [mp.Process(target=target, args=(url, *args, ready)) for _ in range(PROCESSES)]
    for w in workers:
        w.start()
    ready.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    assert all(w.exitcode == 0 for w in workers), [w.exitcode for w in workers]
    with psycopg.connect(url, autocommit=True) as conn:
        done, distinct = conn.execute(EFFECTS).fetchone()  # type: ignore[misc]
        remaining = conn.execute(left).fetchone()[0]  # type: ignore[index]
    expected = jobs if effects else 0
    assert (done, distinct, remaining) == (expected, expected, 0), (done, distinct, remaining)
    return jobs / elapsed


def core_jobs_enqueue(url: str, jobs: int, pipelined: bool = False) -> float:
    """Seconds ``PgQueue.publish_many`` takes to publish ``jobs`` envelopes (built beforehand, as pgqueuer's lists are).

    ``pipelined``: inside a pipeline, where it sends its INSERT of arrays instead of a COPY (the path before).
    """
    messages = envelopes(jobs)
    with connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE core.queue_messages")
        started = time.perf_counter()
        with conn.pipeline() if pipelined else nullcontext():
            PgQueue(conn).publish_many(messages)
        elapsed = time.perf_counter() - started
        conn.execute("VACUUM ANALYZE core.queue_messages")
    return elapsed


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def report(rates: dict[str, list[float]]) -> dict[str, float]:
    medians = {label: statistics.median(values) for label, values in rates.items()}
    for label, values in rates.items():
        print(f"  {label:<40} median {medians[label]:7.0f} jobs/s   (runs: {', '.join(f'{r:.0f}' for r in values)})")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="jobs per run (default 10000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--procrastinate-concurrency", type=int, default=1, help="its worker's concurrency (default 1)")
    parser.add_argument("--skip-drain", action="store_true", help="only the enqueue rates")
    parser.add_argument("--skip-enqueue", action="store_true", help="only the drain rates")
    parser.add_argument("--procrastinate", action="store_true", help="procrastinate's drain too")
    parser.add_argument("--per-job", action="store_true", help="core-jobs with a transaction per job too")
    parser.add_argument(
        "--batch-handler", action="store_true", help="core-jobs with a batch handler too (one INSERT a transaction)"
    )
    args = parser.parse_args()
    configure_logging(level="ERROR")
    server = os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    jobs = args.jobs

    with (
        scratch_database(server, "bench_core_jobs") as core_url,
        scratch_database(server, "bench_pgqueuer") as pgq_url,
        scratch_database(server, "bench_procrastinate") as proc_url,
    ):
        migrate.upgrade(core_url)
        with connect(core_url, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        asyncio.run(_pgqueuer_install(pgq_url))
        procrastinate_install(proc_url)

        def core(batch: int, consumer: Consumer = CORE_JOBS) -> Callable[[], float]:
            def run() -> float:
                core_jobs_fill(core_url, jobs)
                return drain(
                    core_url, core_jobs_drain, (batch, consumer), jobs, "SELECT count(*) FROM core.queue_messages"
                )

            return run

        def pgq(batch: int, work: bool = True) -> Callable[[], float]:
            def run() -> float:
                asyncio.run(_pgqueuer_enqueue(pgq_url, jobs))
                return drain(pgq_url, pgqueuer_drain, (batch, work), jobs, "SELECT count(*) FROM pgqueuer", work)

            return run

        def limit(batch: int) -> Callable[[], float]:
            def run() -> float:
                core_jobs_fill(core_url, jobs)
                return drain(core_url, limit_drain, (batch,), jobs, "SELECT count(*) FROM core.queue_messages")

            return run

        def proc() -> float:
            procrastinate_fill(proc_url, jobs)
            return drain(
                proc_url,
                procrastinate_drain,
                (args.procrastinate_concurrency,),
                jobs,
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
            )

        if not args.skip_drain:
            configs: dict[str, Callable[[], float]] = {}
            for batch in (10, 100):
                configs[f"core-jobs, batch {batch}"] = core(batch)
                configs[f"pgqueuer, batch {batch}"] = pgq(batch)
                configs[f"pgqueuer doing nothing, batch {batch}"] = pgq(batch, work=False)
                configs[f"database limit, batch {batch}"] = limit(batch)
            if args.procrastinate:
                configs[f"procrastinate, concurrency {args.procrastinate_concurrency}"] = proc
            if args.per_job:
                configs["core-jobs, batch 10, a transaction per job"] = core(10, ALONE)
                configs["core-jobs, batch 100, a transaction per job"] = core(100, ALONE)
            if args.batch_handler:
                configs["core-jobs, batch 10, batch handler"] = core(10, BATCHED)
                configs["core-jobs, batch 100, batch handler"] = core(100, BATCHED)
            print(f"load average before: {_loadavg()}", flush=True)
            rates: dict[str, list[float]] = {label: [] for label in configs}
            for _ in range(args.rounds):
                for label, run in configs.items():
                    rates[label].append(run())
                    print(f"    {label}: {rates[label][-1]:.0f} jobs/s", file=sys.stderr, flush=True)
            print(
                f"Drain: {jobs} ready jobs, {PROCESSES} worker processes, one INSERT per job, {args.rounds} rounds"
                " (configurations alternate within each round; median of the rounds). pgqueuer on asyncpg"
                f" (its recommended driver), its work on an asyncpg pool of {PGQUEUER_POOL} per process; the database"
                " limit: claim, fences, INSERTs and ack in one statement a batch, 2 clients:"
            )
            medians = report(rates)
            for batch in (10, 100):
                ours = medians[f"core-jobs, batch {batch}"]
                for peer in ("pgqueuer", "pgqueuer doing nothing", "database limit"):
                    print(f"  core-jobs / {peer}, batch {batch}: {ours / medians[f'{peer}, batch {batch}']:.2f}x")
                if args.batch_handler:
                    batched = medians[f"core-jobs, batch {batch}, batch handler"]
                    for peer in ("pgqueuer doing nothing", "database limit"):
                        ratio = batched / medians[f"{peer}, batch {batch}"]
                        print(f"  core-jobs with a batch handler / {peer}, batch {batch}: {ratio:.2f}x")
            print(f"load average after: {_loadavg()}", flush=True)
            if args.skip_enqueue:
                return

        ours, before, theirs = (
            "core-jobs publish_many (COPY)",
            "core-jobs, INSERT of arrays",
            "pgqueuer enqueue (lists)",
        )
        enqueue: dict[str, list[float]] = {ours: [], before: [], theirs: []}
        for _ in range(args.rounds):
            enqueue[ours].append(jobs / core_jobs_enqueue(core_url, jobs))
            enqueue[theirs].append(jobs / asyncio.run(_pgqueuer_enqueue(pgq_url, jobs)))
            enqueue[before].append(jobs / core_jobs_enqueue(core_url, jobs, pipelined=True))
        print(f"\nEnqueue: {jobs} jobs in one call, {args.rounds} rounds alternating (median):")
        medians = report(enqueue)
        print(f"  core-jobs / pgqueuer: {medians[ours] / medians[theirs]:.2f}x")
        print(f"  {before} / pgqueuer: {medians[before] / medians[theirs]:.2f}x")
        rounds = [o / t for o, t in zip(enqueue[ours], enqueue[theirs], strict=True)]
        print(f"  core-jobs / pgqueuer, round by round: {', '.join(f'{r:.2f}' for r in rounds)}")


if __name__ == "__main__":
    main()
