"""Benchmark: the purge without current statistics against the same rows analyzed (docs/spec.md NF-9a).

    uv run python bench/purge_unanalyzed.py                  # 300 000 expired fences, 3 rounds
    uv run python bench/purge_unanalyzed.py --rows 100000 --rounds 5 --shuffled

Two template databases hold the same rows: 2 000 fresh fences (processed now, expiring within a
week), then N expired fences loaded in one statement, in expiry order (a bulk load, a restore)
or with ``--shuffled`` in random order; autovacuum off for the table. One template is never
analyzed (``reltuples`` -1); the other was analyzed after the 2 000 fresh fences and before the
load, so its statistics are *stale* (they say no row is old enough to delete). On identical
copies (``CREATE DATABASE … TEMPLATE``) the purge (``Purger``, default settings, strategy
``auto``) runs on a copy never analyzed, a copy with the stale statistics and a copy of the latter
analyzed first, interleaved round by round in this one process. Prints each run's seconds,
batches and strategy, the medians and their ratios to analyzed (target: both within 3x). Before
the fixes, 300 000 fences took 210 s never analyzed, and 25 s with stale statistics (sweep
batches bitmap-scanning every expired row).

Server: ``CORE_JOBS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.purge import DEFAULT_SERVER, admin
from core_jobs_demo import with_database
from harness.pg import connect
from maintenance.jobs.base import JobEnv
from maintenance.jobs.purge.job import Purger
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from maintenance.settings import TtlGuard

GUARD = TtlGuard(ttl=timedelta(days=7), window=timedelta(minutes=10), margin=2.0)
LOAD_FRESH = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(), now(), now() + random() * interval '7 days'
  FROM generate_series(1, 2000)"""
LOAD = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(),
       now() - interval '10 days' + g * interval '1 ms', now() - interval '3 days' + g * interval '1 ms'
  FROM generate_series(1, %(rows)s) AS g"""
STATES = ("never analyzed", "stale", "analyzed")


def make_template(server: str, name: str, rows: int, *, shuffled: bool, analyze_first: bool) -> None:
    """A migrated database: 2 000 fresh fences, ANALYZE if ``analyze_first``, then ``rows`` expired ones."""
    admin(server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(server, name)
    migrate.upgrade(url)
    with connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
        conn.execute(LOAD_FRESH)
        if analyze_first:
            conn.execute("ANALYZE core.processed_jobs")
        conn.execute(LOAD + (" ORDER BY random()" if shuffled else ""), {"rows": rows})
        conn.execute("CHECKPOINT")


def run(server: str, template: str, copy: str, state: str) -> tuple[float, int, int, bool]:
    """Seconds, batches, rows and whether it swept, of one purge run on a fresh copy of the template."""
    admin(server, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(template)))
    try:
        url = with_database(server, copy)
        with connect(url, autocommit=True) as conn:
            if state == "analyzed":
                conn.execute("ANALYZE core.processed_jobs")
            reltuples = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'core.processed_jobs'::regclass")
            expected = {"never analyzed": -1, "stale": 2000}.get(state)
            found = reltuples.fetchone()[0]
            assert found == expected if expected is not None else found > 2000, (state, found)
        db = Database(url)
        purger = Purger(PurgeFields(purge_max_runtime=timedelta(minutes=10)), JobEnv(db, GUARD))
        started = time.perf_counter()
        result = purger.run_once(db.server_now())
        return time.perf_counter() - started, result.num_batches, result.num_deleted, bool(result.used_sweep)
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(copy)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="expired fences (default 300 000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, interleaved (default 3)")
    parser.add_argument("--shuffled", action="store_true", help="load the expired fences in random order")
    args = parser.parse_args(argv)
    server = os.environ.get("CORE_JOBS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    base = f"core_jobs_bench_unanalyzed_{int(time.time())}"
    templates = {"never analyzed": f"{base}_never", "stale": f"{base}_stale", "analyzed": f"{base}_stale"}
    try:
        make_template(server, templates["never analyzed"], args.rows, shuffled=args.shuffled, analyze_first=False)
        make_template(server, templates["stale"], args.rows, shuffled=args.shuffled, analyze_first=True)
        seconds: dict[str, list[float]] = {state: [] for state in STATES}
        for i in range(args.rounds):
            order = STATES[i % len(STATES) :] + STATES[: i % len(STATES)]  # each state first once in 3 rounds
            for j, state in enumerate(order):
                took, batches, deleted, swept = run(server, templates[state], f"{base}_{i}_{j}", state)
                seconds[state].append(took)
                path = "sweep" if swept else "index"
                print(
                    f"round {i + 1} {state:<14}: {took:7.3f} s, {batches} batches, {deleted} deleted, {path}",
                    flush=True,
                )
        medians = {state: statistics.median(seconds[state]) for state in STATES}
        ratios = {state: medians[state] / medians["analyzed"] for state in STATES}
        layout = "shuffled" if args.shuffled else "in expiry order"
        print(f"{args.rows} expired fences {layout}, medians:")
        for state in STATES:
            print(f"  {state:<14} {medians[state]:7.3f} s  ratio {ratios[state]:.2f}")
        worst = max(ratios["never analyzed"], ratios["stale"])
        print(f"worst ratio {worst:.2f} (target <= 3)")
        return 0 if worst <= 3 else 1
    finally:
        for name in set(templates.values()):
            admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    sys.exit(main())
