"""Benchmark: the purge on a table never analyzed against the same rows analyzed (issue 17, item 8).

    uv run python bench/purge_unanalyzed.py                  # 300 000 expired fences, 3 rounds
    uv run python bench/purge_unanalyzed.py --rows 100000 --rounds 5

Loads N expired fences in expiry order (a bulk load, a restore) into a template database, then
on identical copies (``CREATE DATABASE … TEMPLATE``) runs the purge (``Purger``, default
settings, strategy ``auto``) on a copy never analyzed (autovacuum off for the table, so
``reltuples`` stays -1) and on a copy analyzed first, interleaved round by round in this one
process. Prints each run's seconds and batches, the medians and their ratio (target: never
analyzed within 3x of analyzed). Before the fix, 300 000 fences took 210 s unanalyzed.

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
from maintenance.jobs.purge.config import PurgeConfig
from maintenance.jobs.purge.job import Purger
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from maintenance.settings import TtlGuard

GUARD = TtlGuard(ttl=timedelta(days=7), window=timedelta(minutes=10), margin=2.0)
LOAD = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(),
       now() - interval '10 days' + g * interval '1 ms', now() - interval '3 days' + g * interval '1 ms'
  FROM generate_series(1, %(rows)s) AS g"""


def run(server: str, template: str, copy: str, analyze: bool) -> tuple[float, int, int]:
    """Seconds, batches and rows of one purge run on a fresh copy of the template."""
    admin(server, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(template)))
    try:
        url = with_database(server, copy)
        with connect(url, autocommit=True) as conn:
            if analyze:
                conn.execute("ANALYZE core.processed_jobs")
            reltuples = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'core.processed_jobs'::regclass")
            assert (reltuples.fetchone()[0] == -1) != analyze
        db = Database(url)
        purger = Purger(PurgeConfig(guard=GUARD, max_runtime=timedelta(minutes=10)), db)
        started = time.perf_counter()
        result = purger.run_once(db.server_now())
        return time.perf_counter() - started, result.num_batches, result.num_deleted
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(copy)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="expired fences (default 300 000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, interleaved (default 3)")
    args = parser.parse_args(argv)
    server = os.environ.get("CORE_JOBS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    template = f"core_jobs_bench_unanalyzed_{int(time.time())}"
    admin(server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
    try:
        url = with_database(server, template)
        migrate.upgrade(url)
        with connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
            conn.execute(LOAD, {"rows": args.rows})
            conn.execute("CHECKPOINT")
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.rounds):
            for analyze in (False, True) if i % 2 == 0 else (True, False):
                took, batches, deleted = run(server, template, f"{template}_{i}_{int(analyze)}", analyze)
                seconds[analyze].append(took)
                label = "analyzed      " if analyze else "never analyzed"
                print(f"round {i + 1} {label}: {took:7.3f} s, {batches} batches, {deleted} deleted", flush=True)
        never, analyzed = statistics.median(seconds[False]), statistics.median(seconds[True])
        ratio = never / analyzed
        print(f"median never analyzed {never:.3f} s, analyzed {analyzed:.3f} s: ratio {ratio:.2f} (target <= 3)")
        return 0 if ratio <= 3 else 1
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))


if __name__ == "__main__":
    sys.exit(main())
