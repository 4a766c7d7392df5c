"""The fence at scale: what a drain costs with 1 M, 10 M, 100 M live fences, random v4 and time-ordered v7 job ids.

    uv run python bench/fence_scale.py                          # --sizes 1e6,1e7, both id kinds
    uv run python bench/fence_scale.py --sizes 1e6,1e7,1e8 --kinds v4
    uv run python bench/fence_scale.py --sizes 2000 --jobs 100 --rounds 1 --fence-samples 50   # a smoke run

One scratch database per id kind (``core_jobs_fence_v4_*``, ``core_jobs_fence_v7_*``, dropped at
the end), migrated to head. For each size, smallest first, the same ``core.processed_jobs`` is
**grown** to that many live fences (never rebuilt: 1 M, then 9 M more, ...) by ``INSERT … SELECT
generate_series`` in chunks of at most 1 M rows, the indexes in place — so the primary key grows
as it does in production, by inserts (random ones split pages all over a v4 index, a v7 one grows
at its right edge). The fences: 8 consumers, 1 000 tenants, ``processed_at`` spread over the TTL
window in load order (the largest size's fences ``0.85·TTL / N`` apart from ``t0 − 0.9·TTL``, ``t0``
the database's clock read once), all of them live. v4 ids are ``gen_random_uuid()``; v7 ids are
:data:`UUIDV7_SQL` of the row's ``processed_at`` (PostgreSQL 15 has no ``uuidv7()``), and the
drained jobs' and fence loop's v7 ids the next instants of the same clock (``Scratch``): every fence
newer than the ones before it, as a producer minting v7 would have minted them. Then ``VACUUM (ANALYZE)`` and a
``CHECKPOINT``.

At each size, for each kind (kinds alternate, so drift on a shared machine hits both alike):

- **drain**: ``--rounds`` times, ``--jobs`` trivial jobs (the handler does nothing; the fence is
  still written) published through ``PgQueue.publish_many`` with ids of the kind and drained by ``--processes`` ``harness.worker.Worker`` processes at
  ``--batch`` — the path of bench/harness.py and bench/peers.py. A ``CHECKPOINT`` before each
  round, so each starts alike: the first touch of a page after a checkpoint writes it whole to the
  WAL (a full-page image), which is where random ids cost most. jobs/s is the median of the rounds;
  **WAL per job** is the drain's own (:data:`OWN_WAL`, read with ``pg_walinspect``: the records
  touching the scratch database's relations and their transactions' commits) over the jobs, with
  its full-page images, beside the server-wide ``pg_current_wal_lsn()`` difference, which on a
  shared server counts whatever else wrote meanwhile.
- **the fence statement alone**: ``--fence-samples`` executions of the harness's own
  ``INSERT_FENCE`` (harness/fence.py), one transaction each, the statement timed (p50, p99), after
  a ``CHECKPOINT``; then a quarter as many again under ``EXPLAIN (ANALYZE, WAL)`` after another:
  the fence's **own** WAL bytes and full-page images per insert, which nothing else on the server
  can inflate.
- **sizes**: ``pg_relation_size`` of the table and of each of its indexes (the primary key
  ``(job_id, consumer)`` is the one the id kind shapes).

Prints one table per kind and the ratio of each size to the first (target of issue 29: jobs/s at
100 M ≥ 0.8× the 1 M rate), the build rate, and the projected time and size of growing to 10× the
largest size, at the last step's rate. The 1-minute load average goes with every figure.

Server: ``HARNESS_BENCH_DATABASE_URL`` (or ``--server``), default the local test server.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from prometheus_client import CollectorRegistry
from psycopg import sql

from bench.harness import DEFAULT_SERVER, TENANT, TTL, Anything, _noop, percentile
from core_jobs_demo import with_database
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.fence import INSERT_FENCE
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.ids import new_job_id
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

QUEUE = "bench.fence_scale"
CHUNK = 1_000_000  # rows per load statement: progress, and a build rate to project from

# A version 7 UUID (RFC 9562) of timestamp ``{ts}``: a random v4's bytes with the first 6 replaced by the
# Unix time in ms (big-endian) and the version nibble turned from 4 (0100) into 7 (0111) by setting bits
# 52 and 53 (set_bit numbers a byte's bits from its least significant); the variant (10) stays v4's.
UUIDV7_SQL = (
    "encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())"
    " placing substring(int8send(floor(extract(epoch FROM {ts}) * 1000)::bigint) FROM 3) FROM 1 FOR 6),"
    " 52, 1), 53, 1), 'hex')::uuid"
)
ID_SQL = {"v4": "gen_random_uuid()", "v7": UUIDV7_SQL.format(ts="t.processed_at")}

# Rows lo..hi, `step` apart in load order from the table's virtual clock (Scratch.frontier), all live.
LOAD_FENCES = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT {job_id},
       (ARRAY['points.credit', 'points.expire', 'points.adjust', 'notifications.email',
              'notifications.push', 'ledger.sync', 'tiers.recompute', 'exports.daily'])[1 + g %% 8],
       ('00000000-0000-4000-8000-' || lpad(to_hex(g %% 1000), 12, '0'))::uuid,
       t.processed_at, t.processed_at + %(ttl)s
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
 CROSS JOIN LATERAL (SELECT %(frontier)s::timestamptz + (g - %(base)s) * %(step)s::interval AS processed_at) AS t"""

SIZES = """
SELECT c.relname, pg_relation_size(c.oid)
  FROM pg_class AS c
 WHERE c.oid = 'core.processed_jobs'::regclass
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'core.processed_jobs'::regclass)
 ORDER BY c.relname"""

PKEY = "processed_jobs_pkey"

# The WAL this database wrote between two positions (pg_walinspect): every record touching one of its relations
# ("rel <tablespace>/<database oid>/<relfilenode>" in block_ref) and every other record of those transactions
# (their commits). What other databases on the server write meanwhile is left out.
OWN_WAL = """
WITH r AS MATERIALIZED (
    SELECT xid, record_length, fpi_length, block_ref
      FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
), own AS (
    SELECT DISTINCT xid::text FROM r WHERE block_ref LIKE %(pattern)s AND xid::text <> '0'
)
SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0), count(*)
  FROM r
 WHERE block_ref LIKE %(pattern)s OR xid::text IN (SELECT xid FROM own)"""


KINDS = ("v4", "v7")


def load() -> float:
    return os.getloadavg()[0]


TRIVIAL = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Anything, handler=_noop)


def _drain(url: str, batch_size: int, ready: Any) -> None:
    configure_logging(level="ERROR")
    config = WorkerConfig(fence_ttl=TTL, batch_size=batch_size, lease=timedelta(minutes=5))
    worker = Worker(url, TRIVIAL, policy=RetryPolicy(), config=config, metrics=HarnessMetrics(CollectorRegistry()))
    with connect(url):  # warm the connection path before the clock starts
        pass
    ready.wait()
    worker.run(once=True)


@dataclass
class Drain:
    rate: float
    wal_per_job: float  # server-wide
    own_wal_per_job: float | None  # this database's alone (None: its WAL was recycled before it was read)
    fpi_per_job: float | None
    load: float


def hold_wal(conn: Any) -> str | None:
    """A temporary physical replication slot: the server keeps the drain's WAL until :func:`own_wal` has read it.

    Without it, a checkpoint of a busy server (anyone's, or one forced by max_wal_size) recycles the segments
    first. Temporary: dropped when this session ends, whatever happens to the benchmark. None if none is free.
    """
    name = f"core_jobs_fence_{secrets.token_hex(4)}"
    try:
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (name,))
    except psycopg.Error as e:
        print(f"  (no replication slot to hold the WAL: {str(e).splitlines()[0]})", flush=True)
        return None
    return name


def own_wal(conn: Any, start: str, end: str) -> tuple[float, float] | None:
    """Bytes of WAL and of full-page images this database wrote in [start, end), or None if already recycled."""
    oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
    try:
        total, fpi, _records = conn.execute(OWN_WAL, {"start": start, "end": end, "pattern": f"%/{oid}/%"}).fetchone()
    except psycopg.Error as e:  # "requested WAL segment … has already been removed": a busy server
        print(f"  (own WAL not read: {str(e).splitlines()[0]})", flush=True)
        return None
    return float(total), float(fpi)


def drain(url: str, new_id: Callable[[], uuid.UUID], jobs: int, processes: int, batch_size: int) -> Drain:
    """One drain of ``jobs`` fresh jobs with ids from ``new_id``, after a CHECKPOINT: jobs/s, WAL bytes per job."""
    with connect(url, autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM core.processed_jobs").fetchone()[0]  # type: ignore[index]
        PgQueue(conn).publish_many(
            [(QUEUE, Envelope(job_id=new_id(), payload={"n": n}, tenant_id=TENANT)) for n in range(jobs)]
        )
        conn.execute("VACUUM (ANALYZE) core.queue_messages")
        conn.execute("CHECKPOINT")
        slot = hold_wal(conn)
        ready = mp.Barrier(processes + 1)
        workers = [mp.Process(target=_drain, args=(url, batch_size, ready)) for _ in range(processes)]
        for w in workers:
            w.start()
        ready.wait()
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        wal = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, lsn)).fetchone()[0]  # type: ignore[index]
        for _ in range(100):  # pg_walinspect reads only flushed WAL; the workers' commits are, others' may not be
            flushed = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,)).fetchone()[0]  # type: ignore[index]
            if flushed:
                break
            time.sleep(0.01)
        own = own_wal(conn, str(lsn), str(end))
        if slot:
            # (an error in this session, own_wal's, has already dropped it: the server drops temporary slots so)
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
        left = conn.execute("SELECT count(*) FROM core.queue_messages").fetchone()[0]  # type: ignore[index]
        after = conn.execute("SELECT count(*) FROM core.processed_jobs").fetchone()[0]  # type: ignore[index]
    assert left == 0 and after - before == jobs, f"{left} jobs left, {after - before} fences written of {jobs}"
    return Drain(
        rate=jobs / elapsed,
        wal_per_job=float(wal) / jobs,
        own_wal_per_job=None if own is None else own[0] / jobs,
        fpi_per_job=None if own is None else own[1] / jobs,
        load=load(),
    )


@dataclass
class FenceInsert:
    p50_ms: float
    p99_ms: float
    wal_bytes: float
    fpi: float
    load: float


def fence_inserts(url: str, new_id: Callable[[], uuid.UUID], samples: int) -> FenceInsert:
    """The harness's fence INSERT alone, one transaction each: its time, then its own WAL (EXPLAIN WAL)."""

    def params() -> dict[str, Any]:
        return {"job_id": new_id(), "consumer": QUEUE, "tenant_id": TENANT, "ttl": TTL}

    times: list[float] = []
    wal: list[float] = []
    fpi: list[float] = []
    with connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        for _ in range(samples):
            with conn.transaction():
                started = time.perf_counter()
                conn.execute(INSERT_FENCE, params(), prepare=True).fetchone()
                times.append((time.perf_counter() - started) * 1000)
        conn.execute("CHECKPOINT")
        explain = "EXPLAIN (ANALYZE, WAL, TIMING OFF, FORMAT JSON) " + INSERT_FENCE
        for _ in range(max(1, samples // 4)):
            with conn.transaction():
                plan = conn.execute(explain, params()).fetchone()[0]  # type: ignore[index]
            top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
            wal.append(top["WAL Bytes"])
            fpi.append(top["WAL FPI"])
    return FenceInsert(
        p50_ms=statistics.median(times),
        p99_ms=percentile(times, 0.99),
        wal_bytes=statistics.mean(wal),
        fpi=statistics.mean(fpi),
        load=load(),
    )


@dataclass
class Point:
    size: int
    build_rows: int
    build_s: float
    build_load: float
    drains: list[Drain]
    fence: FenceInsert
    relations: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return statistics.median(d.rate for d in self.drains)

    @property
    def wal_per_job(self) -> float:
        return statistics.median(d.wal_per_job for d in self.drains)

    @property
    def own_wal_per_job(self) -> float | None:
        own = [d.own_wal_per_job for d in self.drains if d.own_wal_per_job is not None]
        return statistics.median(own) if own else None

    @property
    def fpi_per_job(self) -> float | None:
        fpi = [d.fpi_per_job for d in self.drains if d.fpi_per_job is not None]
        return statistics.median(fpi) if fpi else None

    @property
    def indexes(self) -> int:
        return sum(size for name, size in self.relations.items() if name != "processed_jobs")


@dataclass
class Scratch:
    """One id kind's database, its fences and its virtual clock.

    ``frontier`` is the time of its newest v7 id: loaded rows are ``step`` apart after it, and every id minted
    for a drain or the fence loop is the next ``step`` — so each fence, loaded or drained, is newer than every
    one before it, as fences of time-ordered ids are in production. (Minting the drained ids at the real now
    put them right of every row loaded later: the next growth then split pages inside the index, never at its
    right edge, and left them half full — a 10 M v7 primary key of 856 MB against v4's 641.)
    """

    kind: str
    url: str
    frontier: datetime
    step: timedelta
    rows: int = 0
    points: list[Point] = field(default_factory=list)

    def new_id(self) -> uuid.UUID:
        if self.kind == "v4":
            return uuid.uuid4()
        self.frontier += self.step
        return new_job_id(lambda: int(self.frontier.timestamp() * 1000) * 1_000_000)


def grow(scratch: Scratch, size: int) -> tuple[float, float]:
    """Add rows up to ``size`` live fences (chunks of :data:`CHUNK`), VACUUM ANALYZE, CHECKPOINT; seconds, load."""
    statement = LOAD_FENCES.format(job_id=ID_SQL[scratch.kind])
    started = time.perf_counter()
    with connect(scratch.url, autocommit=True) as conn:
        for lo in range(scratch.rows + 1, size + 1, CHUNK):
            hi = min(size, lo + CHUNK - 1)
            params = {"lo": lo, "hi": hi, "base": scratch.rows, "frontier": scratch.frontier, "step": scratch.step}
            conn.execute(statement, {**params, "ttl": TTL})
            print(
                f"  {scratch.kind}: {hi:>12,} fences (+{hi - scratch.rows:,})"
                f"  {time.perf_counter() - started:7.1f} s  load {load():.1f}",
                flush=True,
            )
        conn.execute("VACUUM (ANALYZE) core.processed_jobs")
        conn.execute("CHECKPOINT")
    elapsed = time.perf_counter() - started
    scratch.frontier += (size - scratch.rows) * scratch.step
    scratch.rows = size
    return elapsed, load()


def relation_sizes(url: str) -> dict[str, int]:
    with connect(url, autocommit=True) as conn:
        return {name: size for name, size in conn.execute(SIZES).fetchall()}


def parse_sizes(text: str) -> list[int]:
    sizes = [int(float(part)) for part in text.split(",") if part.strip()]
    if not sizes or any(s <= 0 for s in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"sizes must be positive and increasing, got {text!r}")
    return sizes


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def ratio(value: float | None, base: float | None) -> str:
    return "–" if value is None or not base else f"{value / base:.2f}×"


def report(scratch: Scratch, args: argparse.Namespace) -> None:
    points = scratch.points
    first = points[0]
    print(
        f"\n{scratch.kind} job ids — drain: {args.jobs} jobs × {args.rounds} rounds, {args.processes} processes,"
        f" batch {args.batch}; fence statement: {args.fence_samples} inserts"
    )
    print(
        "| live fences | grown by (rows, s, rows/s, load) | drain jobs/s, median (runs) |"
        " drain's own WAL/job (B), of it full-page images | server-wide WAL/job (B) | load |"
        " fence INSERT p50 / p99 (ms) | fence's own WAL (B), full-page images | load |"
        " primary key (MB) | other indexes (MB) | table (MB) |"
    )
    print("|" + "---|" * 12)
    for p in points:
        runs = ", ".join(f"{d.rate:,.0f}" for d in p.drains)
        loads = "–".join(f"{x:.1f}" for x in (min(d.load for d in p.drains), max(d.load for d in p.drains)))
        own = "–" if p.own_wal_per_job is None else f"{p.own_wal_per_job:,.0f} ({p.fpi_per_job or 0:,.0f})"
        print(
            f"| {p.size:,} | {p.build_rows:,}, {p.build_s:,.1f} s, {p.build_rows / p.build_s:,.0f}/s, {p.build_load:.1f}"
            f" | **{p.rate:,.0f}** ({runs}) | {own} | {p.wal_per_job:,.0f} | {loads}"
            f" | {p.fence.p50_ms:.3f} / **{p.fence.p99_ms:.3f}** | {p.fence.wal_bytes:,.0f}, {p.fence.fpi:.2f}"
            f" | {p.fence.load:.1f} | {mb(p.relations.get(PKEY, 0))} | {mb(p.indexes - p.relations.get(PKEY, 0))}"
            f" | {mb(p.relations.get('processed_jobs', 0))} |"
        )
    if len(points) > 1:
        print(f"\nratio to {first.size:,} fences:")
        for p in points[1:]:
            print(
                f"  {p.size:>13,}: jobs/s {p.rate / first.rate:.2f}×  fence p99 {p.fence.p99_ms / first.fence.p99_ms:.2f}×"
                f"  own WAL/job {ratio(p.own_wal_per_job, first.own_wal_per_job)}  fence WAL {p.fence.wal_bytes / first.fence.wal_bytes:.2f}×"
                f"  primary key {p.relations.get(PKEY, 0) / max(1, first.relations.get(PKEY, 0)):.2f}×"
            )
        last = points[-1]
        if last.size >= 100 * first.size:
            verdict = "met" if last.rate / first.rate >= 0.8 else "NOT met"
            print(
                f"  target (issue 29): jobs/s at {last.size:,} ≥ 0.8× the {first.size:,} rate:"
                f" {last.rate / first.rate:.2f}× — {verdict}"
            )
    last = points[-1]
    rate = last.build_rows / last.build_s
    bytes_per_fence = (last.indexes + last.relations.get("processed_jobs", 0)) / last.size
    nxt = last.size * 10
    print(
        f"  projected: growing to {nxt:,} fences at the last step's {rate:,.0f} rows/s"
        f" ≈ {(nxt - last.size) / rate / 60:,.0f} min,"
        f" ≈ {bytes_per_fence * nxt / 2**30:,.1f} GiB (table + indexes, {bytes_per_fence:.0f} B a fence)"
    )


@contextmanager
def scratch_databases(
    server: str, kinds: list[str], keep: bool, start: datetime, step: timedelta
) -> Iterator[list[Scratch]]:
    names = {kind: f"core_jobs_fence_{kind}_{secrets.token_hex(3)}" for kind in kinds}
    with ExitStack() as stack:
        scratches = []
        for kind, name in names.items():
            with connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            if not keep:
                stack.callback(drop, server, name)
            url = with_database(server, name)
            migrate.upgrade(url)
            with connect(url, autocommit=True) as conn:
                try:  # the drain's own WAL (OWN_WAL); without it, only the server-wide figure
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                except psycopg.Error as e:
                    print(f"no pg_walinspect in {name}: {str(e).splitlines()[0]}")
            scratches.append(Scratch(kind=kind, url=url, frontier=start, step=step))
        yield scratches


def drop(server: str, name: str) -> None:
    with connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[1_000_000, 10_000_000], help="live fences (1e6,1e7)")
    parser.add_argument("--kinds", default="v4,v7", help="job id kinds, of v4 and v7 (default both)")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per drain (default 5000)")
    parser.add_argument("--rounds", type=int, default=3, help="drains per size and kind (default 3)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--batch", type=int, default=10, help="the worker's batch (default 10)")
    parser.add_argument("--fence-samples", type=int, default=2000, help="timed fence INSERTs (default 2000)")
    parser.add_argument("--server", default=os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases (their names are printed)")
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():  # a kill drops the scratch databases too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kinds = [k.strip() for k in args.kinds.split(",")]
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--kinds takes v4 and/or v7, got {args.kinds!r}")
    configure_logging(level="ERROR")
    free = shutil.disk_usage("/").free
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; free disk on / {free / 2**30:,.0f} GiB")
    with connect(args.server, autocommit=True) as conn:
        t0 = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]  # the clock, read once
    # The largest size's fences spread over 0.85 of the TTL, from 0.9 of it ago: all live for the whole run.
    start, step = t0 - 0.9 * TTL, 0.85 * TTL / args.sizes[-1]
    with scratch_databases(args.server, kinds, args.keep, start, step) as scratches:
        for size in args.sizes:
            print(f"\ngrowing to {size:,} live fences", flush=True)
            built = {}
            for scratch in scratches:
                rows = size - scratch.rows
                seconds, build_load = grow(scratch, size)
                built[scratch.kind] = (rows, seconds, build_load)
            drains: dict[str, list[Drain]] = {s.kind: [] for s in scratches}
            for _ in range(args.rounds):  # kinds alternate within a round
                for scratch in scratches:
                    drains[scratch.kind].append(
                        drain(scratch.url, scratch.new_id, args.jobs, args.processes, args.batch)
                    )
            for scratch in scratches:
                fence = fence_inserts(scratch.url, scratch.new_id, args.fence_samples)
                rows, seconds, build_load = built[scratch.kind]
                point = Point(size, rows, seconds, build_load, drains[scratch.kind], fence, relation_sizes(scratch.url))
                scratch.points.append(point)
                print(
                    f"  {scratch.kind} at {size:,}: {point.rate:,.0f} jobs/s, fence p99 {fence.p99_ms:.3f} ms,"
                    f" own WAL/job {point.own_wal_per_job or 0:,.0f} B (server-wide {point.wal_per_job:,.0f}), fence WAL {fence.wal_bytes:,.0f} B,"
                    f" primary key {mb(point.relations.get(PKEY, 0))} MB, load {fence.load:.1f}",
                    flush=True,
                )
        for scratch in scratches:
            report(scratch, args)
        if args.keep:
            print("\nkept: " + ", ".join(s.url for s in scratches))
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
