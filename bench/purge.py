"""Benchmark of the purge job against one unbounded DELETE, under a steady concurrent writer.

    uv run python bench/purge.py                 # 2 M fences in expiry order, 3 rounds
    uv run python bench/purge.py --rounds 5 --skip-other --compare-batch-size 10000
    uv run python bench/purge.py --shuffled      # the same, rows not in expiry order
    uv run python bench/purge.py --rows 200000   # smaller, quicker
    uv run python bench/purge.py --shuffled --expired-percent 1   # the steady state: few expired
    uv run python bench/purge.py --shuffled-percent 20  # 20 % of rows scattered, the rest in order
    uv run python bench/purge.py --replay-history 200000  # plus 200 000 replays handled long ago

Loads N fences (60 % expired, 8 consumers, 1 000 tenants, 0.05 % of the expired ones held by
a pending dead letter; with ``--replay-history N`` also N replayed dead letters whose deliveries
were handled 30 days ago, the history the replay guard's index must skip) into a template
database, then, round after round (``--rounds``, the order rotating so drift hits each alike),
on identical copies (``CREATE DATABASE … TEMPLATE``) runs (a) the purge job
(``maintenance.jobs.purge.job.Purger``, default settings, strategy ``auto``), (a') from the
second round, the purge forced onto the strategy auto did not choose (unless ``--skip-other``),
(a") with ``--compare-batch-size N`` the auto purge with batches of at most N rows, (b) the
baseline: one DELETE with the purge's own guards (``GUARDED_DELETE``), and (b') the unguarded
``DELETE FROM core.processed_jobs WHERE expires_at < now()``. On each copy a writer process
inserts fences at a steady 500/s, one per transaction, 10 % of them redeliveries
(``ON CONFLICT DO NOTHING``); its latency is measured idle first, then during the run. Prints
each run, auto's choice and the estimates it rests on, medians and ranges of rows/s and of the
longest transactions, the ratios round by round, the writer's p50/p99/max latency, and issue
20's targets (≥ 0.8 x the guarded DELETE, transactions ≤ 15 ms, writer p99 ≤ 3 ms). Ratios
matter more than absolute figures on a shared machine.

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
from maintenance.jobs.base import JobEnv
from maintenance.jobs.purge import paths
from maintenance.jobs.purge.job import Purger
from maintenance.jobs.purge.settings import PurgeFields
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

# The baseline: every fence the purge may delete, in one statement, one transaction — with the
# purge's own guards (TTL passed, past the retry window, no dead letter holding it, no unfinished
# execution), in their hashed spelling, on the same clock reading. The purge's speed is measured
# against this.
GUARDED_DELETE = """
DELETE FROM core.processed_jobs AS p
 WHERE p.expires_at < %(cutoff)s
   AND p.processed_at < %(protected_from)s
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d
                         WHERE core.holds_fence(d, %(protected_from)s))
   AND (p.job_id, p.consumer) NOT IN (SELECT e.job_id, e.consumer FROM core.executions AS e
                                       WHERE e.status <> 'FAILED')"""

# Shown beside it: every expired fence, no guard at all (what the rows would cost unprotected).
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


# The purge's guard: TTL 7 days, twice the default retry policy's window.
GUARD = TtlGuard(ttl=TTL, window=max_retry_window(RetryPolicy()), margin=2.0)


def purge_action(batch_size: int, target: timedelta, strategy: str, chosen: list[dict], results: list[dict]):
    """The purge job with ``strategy``; its strategy_chosen event is appended to ``chosen``, its result
    fields to ``results``."""

    def action(url: str) -> tuple[int, float]:
        db = Database(url)
        events = io.StringIO()
        configure_logging(fmt="json", level="INFO", stream=events)
        try:
            fields = PurgeFields(
                purge_batch_size=batch_size, purge_target_batch_duration=target, purge_strategy=strategy
            )
            result = Purger(fields, JobEnv(db, GUARD)).run_once(db.server_now())
        finally:
            configure_logging(fmt="console", level="WARNING", stream=sys.stderr)
        assert result.ok and not result.stopped_on_budget, result.fields()
        parsed = (json.loads(line) for line in events.getvalue().splitlines())
        chosen.extend(e for e in parsed if e["event"] == "maintenance.purge.strategy_chosen")
        results.append(result.fields())
        return result.num_deleted, result.longest_batch_ms

    return action


def always_sampled(action):
    """``action`` with auto's first look disabled (``sweep_floor`` 0: the count never skips the sample), as it was."""

    def sampled(url: str) -> tuple[int, float]:
        real = paths.sweep_floor
        paths.sweep_floor = lambda _estimates: 0  # type: ignore[assignment]
        try:
            return action(url)
        finally:
            paths.sweep_floor = real

    return sampled


def guarded_delete_action(url: str) -> tuple[int, float]:
    """GUARDED_DELETE on PostgreSQL's clock read just before, in one transaction."""
    with connect(url) as conn:
        (now,) = conn.execute("SELECT now()").fetchone()
        conn.commit()
        started = time.perf_counter()
        deleted = conn.execute(GUARDED_DELETE, {"cutoff": now, "protected_from": now - GUARD.required}).rowcount
        conn.commit()
        return deleted, (time.perf_counter() - started) * 1000


def single_delete_action(url: str) -> tuple[int, float]:
    with connect(url) as conn:
        started = time.perf_counter()
        deleted = conn.execute(SINGLE_DELETE).rowcount
        conn.commit()
        return deleted, (time.perf_counter() - started) * 1000


def spread(values: list[float], fmt: str) -> str:
    """Median (min-max) of ``values``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


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
    parser.add_argument(
        "--batch-size",
        type=int,
        default=PurgeFields().purge_batch_size,
        help="largest purge batch (default: the setting's)",
    )
    parser.add_argument(
        "--target-batch-ms",
        type=float,
        default=PurgeFields().purge_target_batch_duration.total_seconds() * 1000,
        help="purge target batch duration, ms (default: the setting's, 10)",
    )
    parser.add_argument("--writer-rate", type=float, default=500.0, help="writer inserts per second (default 500)")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="idle writer measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each run once per round (default 3)")
    parser.add_argument(
        "--compare-batch-size",
        type=int,
        default=0,
        metavar="N",
        help="also run the auto purge with batches of at most N rows, to compare with --batch-size",
    )
    parser.add_argument("--skip-other", action="store_true", help="leave out the purge forced onto the other strategy")
    parser.add_argument(
        "--compare-sampled",
        action="store_true",
        help="also the auto purge as before the expired count: always reading the sample to choose",
    )
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
    chosen: list[dict] = []
    # label -> per round: (Run, writer samples); the purges' result fields by label, per round
    runs: dict[str, list[tuple[Run, list]]] = {}
    fields: dict[str, list[dict]] = {"auto": [], "other": [], "auto@": [], "sampled": []}
    try:
        _, load_s = build_template(
            server, template, args.rows, shuffled, args.expired_percent / 100, args.replay_history
        )
        print(f"loaded template in {load_s:.1f} s", flush=True)
        other_strategy = ""
        for round_no in range(args.rounds):
            actions = {
                "auto": purge_action(args.batch_size, target, "auto", chosen, fields["auto"]),
                "guarded": guarded_delete_action,
                "unguarded": single_delete_action,
            }
            if args.compare_batch_size:
                actions["auto@"] = purge_action(args.compare_batch_size, target, "auto", [], fields["auto@"])
            if args.compare_sampled:
                actions["sampled"] = always_sampled(
                    purge_action(args.batch_size, target, "auto", [], fields["sampled"])
                )
            if not args.skip_other and other_strategy:
                actions["other"] = purge_action(args.batch_size, target, other_strategy, [], fields["other"])
            labels = list(actions)
            order = labels[round_no % len(labels) :] + labels[: round_no % len(labels)]
            if round_no == 0:
                order = labels  # auto first: its choice names the other strategy
            for label in order:
                run, samples = run_on_copy(
                    server, template, f"{label}_{round_no}", actions[label], args.writer_rate, args.idle_seconds
                )
                runs.setdefault(label, []).append((run, samples))
                extra = ""
                if label in fields:
                    f = fields[label][-1]
                    path = "sweep" if f["used_sweep"] else "index"
                    extra = f"; {path}, {f['num_batches']} batches, the last of {f['batch_size']:,}"
                during = latency(samples, run.busy)
                print(
                    f"round {round_no + 1} {label:<9}: {run.deleted:>10,} rows in {run.seconds:6.2f} s ="
                    f" {run.deleted / run.seconds:>10,.0f} rows/s; longest transaction {run.longest_ms:.1f} ms;"
                    f" writer p99 {during.p99:.2f} ms{extra}",
                    flush=True,
                )
            if round_no == 0:
                other_strategy = "index" if chosen[0]["strategy"] == "sweep" else "sweep"
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))

    decision = chosen[0]
    print()
    measured = (
        f"{decision['expired_rows']:,} expired fences counted, no sample"
        if decision["expired_rows"] is not None
        else f"expired fraction {decision['expired_fraction']} in a sample of {decision['sampled_rows']:,} rows,"
        f" correlation of expires_at {decision['correlation']}"
    )
    print(
        f"auto chose {decision['strategy']} ({decision['reason']}): {measured},"
        f" {decision['table_blocks']:,} blocks, {decision['rows_per_page']} rows/page; estimated in"
        f" {decision['estimate_ms']} ms; auto's choices over the rounds: {[c['strategy'] for c in chosen]}"
    )
    rates = {label: [run.deleted / run.seconds for run, _ in pairs] for label, pairs in runs.items()}
    names = {
        "auto": "(a)  purge, auto",
        "other": f"(a') purge, forced {other_strategy}",
        "guarded": "(b)  guarded single DELETE",
        "unguarded": "(b') unguarded single DELETE",
        "auto@": f'(a") purge, auto, batch <= {args.compare_batch_size:,}',
        "sampled": "(a~) purge, auto, always sampled",
    }
    print(f"medians (min-max) over {args.rounds} rounds, interleaved:")
    for label, pairs in runs.items():
        longest = [run.longest_ms for run, _ in pairs]
        print(
            f"  {names[label]:<30} {spread(rates[label], ',.0f')} rows/s;"
            f" longest transaction {spread(longest, '.1f')} ms"
        )

    def ratios(label: str, base: str) -> list[float]:
        n = min(len(rates[label]), len(rates[base]))  # the forced run starts in round 2
        return [a / b for a, b in zip(rates[label][-n:], rates[base][-n:], strict=True)]

    print(
        f"ratios of rows/s, round by round: auto / guarded DELETE {spread(ratios('auto', 'guarded'), '.2f')};"
        f" auto / unguarded DELETE {spread(ratios('auto', 'unguarded'), '.2f')};"
        f" guarded / unguarded DELETE {spread(ratios('guarded', 'unguarded'), '.2f')}"
        + (
            f"; forced {other_strategy} / guarded DELETE {spread(ratios('other', 'guarded'), '.2f')}"
            if "other" in runs
            else ""
        )
        + (
            f"; {names['auto@']} / guarded DELETE {spread(ratios('auto@', 'guarded'), '.2f')}"
            if "auto@" in runs
            else ""
        )
        + (
            f"; auto / auto always sampled {spread(ratios('auto', 'sampled'), '.2f')}"
            f"; {names['sampled']} / guarded DELETE {spread(ratios('sampled', 'guarded'), '.2f')}"
            if "sampled" in runs
            else ""
        )
    )
    print()
    print("writer latency (ms), median of the rounds' figures   p50     p99      max")

    def writer_line(label: str, window: str) -> str:
        figures = [latency(samples, getattr(run, window)) for run, samples in runs[label]]
        p50, p99, top = (statistics.median(getattr(f, k) for f in figures) for k in ("p50", "p99", "max"))
        return f"{p50:7.2f} {p99:7.2f} {top:8.2f}  (p99 {spread([f.p99 for f in figures], '.2f')})"

    for label in runs:
        print(f"  idle, copy of {label:<9}                      {writer_line(label, 'idle')}")
        print(f"  during {names[label]:<30}     {writer_line(label, 'busy')}")
    print()
    auto_ratio = ratios("auto", "guarded")
    auto_longest = [run.longest_ms for run, _ in runs["auto"]]
    auto_p99 = [latency(samples, run.busy).p99 for run, samples in runs["auto"]]
    print("targets (docs/spec.md NF-6 to NF-9), for the auto purge, worst round (median):")
    print(
        f"  purge >= 0.8 x guarded single DELETE rows/s: {min(auto_ratio):.2f} ({statistics.median(auto_ratio):.2f})"
        f" {verdict(min(auto_ratio) >= 0.8)}"
    )
    print(
        f"  longest purge transaction <= 15 ms: {max(auto_longest):.1f} ms ({statistics.median(auto_longest):.1f})"
        f" {verdict(max(auto_longest) <= 15)}"
    )
    print(
        f"  writer p99 <= 3 ms during the purge: {max(auto_p99):.2f} ms ({statistics.median(auto_p99):.2f})"
        f" {verdict(max(auto_p99) <= 3)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
