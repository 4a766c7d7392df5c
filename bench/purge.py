"""Benchmark of the purge job against one unbounded DELETE, under a steady concurrent writer.

    uv run python bench/purge.py                 # 2 M fences in expiry order
    uv run python bench/purge.py --shuffled      # the same, rows not in expiry order
    uv run python bench/purge.py --rows 200000   # smaller, quicker
    uv run python bench/purge.py --shuffled --expired-percent 1   # the steady state: few expired
    uv run python bench/purge.py --shuffled-percent 20  # 20 % of rows scattered, the rest in order
    uv run python bench/purge.py --replay-history 200000  # plus 200 000 replays handled long ago

Loads N fences (60 % expired, 8 consumers, 1 000 tenants, 0.05 % of the expired ones held by
a pending dead letter; with ``--replay-history N`` also N replayed dead letters whose deliveries
were handled 30 days ago, the history the replay guard's index must skip) into a template
database, then on identical copies
(``CREATE DATABASE … TEMPLATE``) runs (a) the purge job (``maintenance.jobs.purge.job.Purger``, default
settings, strategy ``auto``), (a') the purge forced onto the strategy auto did not choose, and
(b) one ``DELETE FROM core.processed_jobs WHERE expires_at < now()``. On each copy a writer
process inserts fences at a steady 500/s, one per transaction, 10 % of them redeliveries
(``ON CONFLICT DO NOTHING``); its latency is measured idle first, then during the run. Prints
auto's choice and the estimates it rests on, rows/s of each run and their ratios, the longest
purge transactions, and the writer's p50/p99/max latency. Ratios matter more than absolute
figures on a shared machine.

Server: ``CORE_JOBS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``
(any database on the server; the benchmark creates and drops its own ``core_jobs_bench_*``).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core_jobs_demo import with_database
from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.pg import connect
from maintenance.jobs.purge.config import PurgeConfig
from maintenance.jobs.purge.job import Purger
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from maintenance.runtime.logs import configure_logging
from maintenance.settings import TtlGuard

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TTL = timedelta(days=7)

# N fences: processed_at spread evenly over :span (10 days by default) so that the oldest
# :expired fraction (60 %) has passed its 7-day TTL; with fewer expired the span shrinks so that
# no fence is processed in the future. Rows go in in expiry order, except a :shuffled fraction
# placed at random among them (all of them with --shuffled).
LOAD_FENCES = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(),
       (ARRAY['points.credit', 'points.expire', 'points.adjust', 'notifications.email',
              'notifications.push', 'ledger.sync', 'tiers.recompute', 'exports.daily'])[1 + g %% 8],
       ('00000000-0000-4000-8000-' || lpad(to_hex(g %% 1000), 12, '0'))::uuid,
       t.processed_at, t.processed_at + %(ttl)s
  FROM generate_series(1, %(rows)s) AS g
 CROSS JOIN LATERAL (SELECT now() - %(ttl)s - %(expired)s * %(span)s + (g::float8 / %(rows)s) * %(span)s
                     AS processed_at) AS t
 ORDER BY {layout}"""

# A few expired fences whose job sits in dead letters pending review: the purge keeps them.
LOAD_PENDING_DEAD_LETTERS = """
INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error)
SELECT job_id, consumer, '{}', 5, 'ProviderUnavailable: HTTP 503'
  FROM core.processed_jobs TABLESAMPLE BERNOULLI (0.05) WHERE expires_at < now()"""

# Replays whose deliveries were handled 30 days ago (dead letters are never deleted, so they pile
# up): the replay guard reads only the outstanding and recent ones, from its index's tail. Loaded
# with the guard trigger set aside, to back-date the stamps.
LOAD_REPLAY_HISTORY = (
    """INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error)
       SELECT gen_random_uuid(), 'points.credit', '{}', 5, 'ProviderUnavailable: HTTP 503'
         FROM generate_series(1, %(rows)s)""",
    "ALTER TABLE core.dead_letters DISABLE TRIGGER dead_letters_guard_update",
    """UPDATE core.dead_letters
          SET status = 'replayed', status_changed_at = now() - interval '31 days',
              replay_outcome = 'duplicate', replay_handled_at = now() - interval '30 days'
        WHERE id > (SELECT max(id) - %(rows)s FROM core.dead_letters)""",
    "ALTER TABLE core.dead_letters ENABLE TRIGGER dead_letters_guard_update",
)

# The writer: one fence per transaction; a redelivery hits the primary key and does nothing.
INSERT_FENCE = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
VALUES (%s, 'points.credit', '00000000-0000-4000-8000-000000000001', now() + interval '7 days')
ON CONFLICT (job_id, consumer) DO NOTHING"""

# The baseline: every expired fence in one statement, one transaction.
SINGLE_DELETE = "DELETE FROM core.processed_jobs WHERE expires_at < now()"


def admin(server: str, statement: sql.Composable) -> None:
    with connect(server, autocommit=True) as conn:
        conn.execute(statement)


def build_template(
    server: str, name: str, rows: int, shuffled: float, expired: float = 0.6, replay_history: int = 0
) -> tuple[str, float]:
    admin(server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(server, name)
    migrate.upgrade(url)
    started = time.perf_counter()
    layout = f"CASE WHEN random() < {shuffled:f} THEN random() ELSE g::float8 / {rows:d} END"
    with connect(url, autocommit=True) as conn:
        span = min(timedelta(days=10), TTL / (1 - expired))
        conn.execute(LOAD_FENCES.format(layout=layout), {"rows": rows, "ttl": TTL, "expired": expired, "span": span})
        conn.execute(LOAD_PENDING_DEAD_LETTERS)
        if replay_history:
            for statement in LOAD_REPLAY_HISTORY:
                conn.execute(statement, {"rows": replay_history} if "%(rows)s" in statement else None)
        # Hint bits, visibility map and statistics, so both copies start from the same warm state.
        conn.execute("VACUUM (ANALYZE) core.processed_jobs")
        conn.execute("VACUUM (ANALYZE) core.dead_letters")
        conn.execute("CHECKPOINT")
    return url, time.perf_counter() - started


@contextmanager
def scratch_fences(prefix: str, rows: int, shuffled: float) -> Iterator[str]:
    """A scratch database of ``rows`` fences (build_template) on the default server, dropped afterwards."""
    name = f"{prefix}_{int(time.time())}"
    url, _ = build_template(DEFAULT_SERVER, name, rows, shuffled=shuffled)
    try:
        yield url
    finally:
        admin(DEFAULT_SERVER, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def interleaved_medians(conn: Any, queries: Mapping[str, str], params: Any, runs: int) -> dict[str, float]:
    """Each query's median wall time in ms, the queries run in turn ``runs`` times (so drift hits them alike)."""
    times: dict[str, list[float]] = {label: [] for label in queries}
    for _ in range(runs):
        for label, query in queries.items():
            started = time.perf_counter()
            conn.execute(query, params).fetchall()
            times[label].append((time.perf_counter() - started) * 1000)
    return {label: statistics.median(samples) for label, samples in times.items()}


def writer(url: str, rate: float, stop: mp.Event, out: mp.Queue) -> None:
    """Insert fences at ``rate``/s until ``stop``; send back (start, latency) per insert."""
    rng = random.Random(7)
    written: list[uuid.UUID] = []
    samples: list[tuple[float, float]] = []
    with connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        interval = 1.0 / rate
        due = time.monotonic()
        while not stop.is_set():
            due += interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            redelivery = written and rng.random() < 0.10
            job_id = rng.choice(written) if redelivery else uuid.uuid4()
            started = time.monotonic()
            conn.execute(INSERT_FENCE, (job_id,))
            samples.append((started, time.monotonic() - started))
            if not redelivery:
                written.append(job_id)
    out.put(samples)


@dataclass
class Run:
    label: str
    deleted: int
    seconds: float
    longest_ms: float
    idle: tuple[float, float]  # monotonic window of the idle measurement
    busy: tuple[float, float]  # monotonic window of the run


@dataclass
class Latency:
    p50: float
    p99: float
    max: float
    n: int

    def __str__(self) -> str:
        return f"{self.p50:7.2f} {self.p99:7.2f} {self.max:8.2f} {self.n:7d}"


def latency(samples: list[tuple[float, float]], window: tuple[float, float]) -> Latency:
    """The writer's latency (ms) of the inserts that started inside ``window``."""
    inside = sorted(lat * 1000 for start, lat in samples if window[0] <= start <= window[1])
    if not inside:
        return Latency(float("nan"), float("nan"), float("nan"), 0)
    return Latency(
        inside[len(inside) // 2], inside[min(len(inside) - 1, int(len(inside) * 0.99))], inside[-1], len(inside)
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def run_on_copy(server: str, template: str, label: str, action, rate: float, idle_s: float):
    """Copy the template, start the writer, measure idle, run ``action(url)``, stop the writer."""
    name = f"{template}_{label}"
    admin(server, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    url = with_database(server, name)
    stop, out = mp.Event(), mp.Queue()
    proc = mp.Process(target=writer, args=(url, rate, stop, out), daemon=True)
    try:
        proc.start()
        time.sleep(0.5)  # connection and first inserts
        idle = (time.monotonic(), time.monotonic() + idle_s)
        time.sleep(idle_s)
        begin = time.monotonic()
        deleted, longest_ms = action(url)
        end = time.monotonic()
        time.sleep(0.2)
        stop.set()
        samples = out.get(timeout=60)
        proc.join(timeout=10)
        return Run(label, deleted, end - begin, longest_ms, idle, (begin, end)), samples
    finally:
        stop.set()
        if proc.is_alive():
            proc.kill()
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def purge_action(batch_size: int, target: timedelta, strategy: str, chosen: list[dict], results: dict[str, dict]):
    """The purge job with ``strategy``; its strategy_chosen event is appended to ``chosen``, its result
    fields stored under ``results[strategy]``."""
    guard = TtlGuard(ttl=TTL, window=max_retry_window(RetryPolicy()), margin=2.0)

    def action(url: str) -> tuple[int, float]:
        db = Database(url)
        events = io.StringIO()
        configure_logging(fmt="json", level="INFO", stream=events)
        try:
            config = PurgeConfig(guard=guard, batch_size=batch_size, target_batch_duration=target, strategy=strategy)
            result = Purger(config, db).run_once(db.server_now())
        finally:
            configure_logging(fmt="console", level="WARNING", stream=sys.stderr)
        assert result.ok and not result.stopped_on_budget, result.fields()
        parsed = (json.loads(line) for line in events.getvalue().splitlines())
        chosen.extend(e for e in parsed if e["event"] == "maintenance.purge.strategy_chosen")
        results[strategy] = result.fields()
        return result.num_deleted, result.longest_batch_ms

    return action


def single_delete_action(url: str) -> tuple[int, float]:
    with connect(url) as conn:
        started = time.perf_counter()
        deleted = conn.execute(SINGLE_DELETE).rowcount
        conn.commit()
        return deleted, (time.perf_counter() - started) * 1000


def purge_line(label: str, run: Run, fields: dict) -> str:
    return (
        f"{label}: {run.deleted:>10,} rows in {run.seconds:6.2f} s = {run.deleted / run.seconds:>10,.0f} rows/s;"
        f" longest transaction {run.longest_ms:.1f} ms; {fields['num_batches']} batches, the last of"
        f" {fields['batch_size']:,}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="fences to load (default 2 000 000)")
    parser.add_argument("--shuffled", action="store_true", help="load rows in random order, not expiry order")
    parser.add_argument(
        "--shuffled-percent",
        type=float,
        default=0.0,
        help="rows placed at random, the rest in expiry order, %% (default 0; --shuffled: 100)",
    )
    parser.add_argument("--expired-percent", type=float, default=60.0, help="expired fences, %% (default 60)")
    parser.add_argument(
        "--replay-history",
        type=int,
        default=0,
        metavar="N",
        help="also load N replayed dead letters handled 30 days ago (default 0)",
    )
    parser.add_argument("--batch-size", type=int, default=10_000, help="purge batch size (default 10 000)")
    parser.add_argument(
        "--target-batch-ms",
        type=float,
        default=PurgeConfig.target_batch_duration.total_seconds() * 1000,
        help="purge target batch duration, ms (default: the setting's, 10)",
    )
    parser.add_argument("--writer-rate", type=float, default=500.0, help="writer inserts per second (default 500)")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="idle writer measurement (default 3)")
    args = parser.parse_args(argv)
    if not 0 < args.expired_percent < 100:
        parser.error("--expired-percent must be between 0 and 100")
    shuffled = 1.0 if args.shuffled else args.shuffled_percent / 100
    if not 0 <= shuffled <= 1:
        parser.error("--shuffled-percent must be between 0 and 100")
    configure_logging(fmt="console", level="WARNING", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)

    server = os.environ.get("CORE_JOBS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    template = f"core_jobs_bench_{os.getpid()}"
    layout = {0.0: "in expiry order", 1.0: "shuffled (not in expiry order)"}.get(
        shuffled, f"{shuffled:.0%} of rows shuffled, the rest in expiry order"
    )
    print(
        f"purge benchmark: {args.rows:,} fences, {args.expired_percent:g} % expired, 8 consumers, 1 000 tenants,"
        f" layout {layout};"
    )
    print(
        f"writer {args.writer_rate:g}/s, one insert per transaction, 10 % redeliveries; purge batch {args.batch_size:,}"
        f" at most, aiming at {args.target_batch_ms:g} ms; {args.replay_history:,} replays handled 30 days ago"
    )
    target = timedelta(milliseconds=args.target_batch_ms)
    results: dict[str, dict] = {}
    chosen: list[dict] = []
    try:
        _, load_s = build_template(
            server, template, args.rows, shuffled, args.expired_percent / 100, args.replay_history
        )
        print(f"loaded template in {load_s:.1f} s")
        auto, auto_samples = run_on_copy(
            server,
            template,
            "auto",
            purge_action(args.batch_size, target, "auto", chosen, results),
            args.writer_rate,
            args.idle_seconds,
        )
        other_strategy = "index" if chosen[0]["strategy"] == "sweep" else "sweep"
        other, other_samples = run_on_copy(
            server,
            template,
            "other",
            purge_action(args.batch_size, target, other_strategy, chosen, results),
            args.writer_rate,
            args.idle_seconds,
        )
        delete, delete_samples = run_on_copy(
            server, template, "delete", single_delete_action, args.writer_rate, args.idle_seconds
        )
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))

    decision = chosen[0]
    print()
    print(
        f"auto chose {decision['strategy']} ({decision['reason']}): expired fraction {decision['expired_fraction']}"
        f" in a sample of {decision['sampled_rows']:,} rows, correlation of expires_at {decision['correlation']},"
        f" {decision['table_blocks']:,} blocks, {decision['rows_per_page']} rows/page; estimated in"
        f" {decision['estimate_ms']} ms"
    )
    auto_rate = auto.deleted / auto.seconds
    other_rate = other.deleted / other.seconds
    delete_rate = delete.deleted / delete.seconds
    print(purge_line(f"(a)  purge, auto -> {decision['strategy']:5}", auto, results["auto"]))
    print(purge_line(f"(a') purge, forced {other_strategy:5} ", other, results[other_strategy]))
    print(
        f"(b)  single DELETE         : {delete.deleted:>10,} rows in {delete.seconds:6.2f} s ="
        f" {delete_rate:>10,.0f} rows/s; one transaction of {delete.longest_ms:.0f} ms"
    )
    print(
        f"ratios of rows/s: auto / single DELETE {auto_rate / delete_rate:.2f};"
        f" forced {other_strategy} / single DELETE {other_rate / delete_rate:.2f};"
        f" auto / forced {other_strategy} {auto_rate / other_rate:.2f}"
    )
    print()
    during_auto = latency(auto_samples, auto.busy)
    idle_auto = latency(auto_samples, auto.idle)
    print("writer latency (ms)           p50     p99      max       n")
    print(f"  idle, copy (a)          {idle_auto}")
    print(f"  during the auto purge   {during_auto}")
    print(f"  idle, copy (a')         {latency(other_samples, other.idle)}")
    print(f"  during the forced {other_strategy:5} {latency(other_samples, other.busy)}")
    print(f"  idle, copy (b)          {latency(delete_samples, delete.idle)}")
    print(f"  during the DELETE       {latency(delete_samples, delete.busy)}")
    print()
    ratio = auto_rate / delete_rate
    print("targets (issue 3), for the auto purge:")
    print(f"  purge >= 0.5 x single DELETE rows/s: {ratio:.2f} {verdict(ratio >= 0.5)}")
    print(f"  longest purge transaction <= 25 ms: {auto.longest_ms:.1f} ms {verdict(auto.longest_ms <= 25)}")
    print(
        f"  writer p99 <= 5 ms during the purge: {during_auto.p99:.2f} ms {verdict(during_auto.p99 <= 5)}"
        f" (idle p99 on the same copy {idle_auto.p99:.2f} ms; p99 during / idle {during_auto.p99 / idle_auto.p99:.2f})"
    )
    if shuffled == 1.0:
        print(f"  shuffled layout >= 250 000 rows/s: {auto_rate:,.0f} {verdict(auto_rate >= 250_000)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
