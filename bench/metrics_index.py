"""Which index should the metrics job's success count use on core.processed_jobs.processed_at?

The count runs once a minute over the newest minute of fences; every consumer pays for an
index on every fence it writes. This script measures both sides for three variants — no index,
a btree and a BRIN on ``processed_at`` — on copies of the fence table (same primary key and
expires_at index as core.processed_jobs), in one process, so the ratios compare like with like:

* bulk insert: ``INSERT … SELECT`` of many fences into a table already holding ``--rows``
  (index maintenance dominates), best of ``--rounds``;
* single fences: one-row INSERTs, each its own committed transaction (what a consumer does;
  round trip and commit dominate), the variants taking turns every 50 inserts;
* the metrics count for the newest minute and the newest hour of a week of fences, median of
  repeated runs;
* the same count after one and after ``--cycles`` purge cycles (oldest day deleted, VACUUM, a
  new day inserted into the freed pages), where a BRIN's block ranges hold old and new
  timestamps at once;
* the WAL of one fence insert (EXPLAIN (ANALYZE, WAL), one insert per slice): records and
  bytes, which other processes do not disturb, unlike the timings on a shared machine;
* the index size.

Usage::

    CORE_JOBS_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \\
        uv run python bench/metrics_index.py [--rows 1000000] [--singles 3000]

It creates a scratch database on that server and drops it afterwards. Variants run
interleaved, so load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core_jobs_demo import scratch_database
from harness.pg import connect

VARIANTS = {
    "none": None,
    "btree": "CREATE INDEX {idx} ON {table} (processed_at)",
    "brin": "CREATE INDEX {idx} ON {table} USING brin (processed_at) WITH (autosummarize = on)",
}

CREATE_TABLE = """
CREATE TABLE {table} (
    job_id       uuid        NOT NULL,
    consumer     text        NOT NULL,
    tenant_id    uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (job_id, consumer)
);
CREATE INDEX ON {table} (expires_at);
"""

# Fences spread over `span` ending at `until`, in time order (as consumers write them).
FILL = """
INSERT INTO {table} (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), (ARRAY['points.credit', 'points.expire', 'notifications.email'])[1 + g %% 3],
       ('00000000-0000-4000-8000-' || lpad(to_hex(g %% 50), 12, '0'))::uuid,
       %(until)s - %(span)s + g * (%(span)s / %(n)s), %(until)s - %(span)s + g * (%(span)s / %(n)s) + interval '7 days'
  FROM generate_series(1, %(n)s) AS g
"""

SINGLE = """
INSERT INTO {table} (job_id, consumer, tenant_id, expires_at)
VALUES (gen_random_uuid(), 'points.credit', '00000000-0000-4000-8000-000000000001', now() + interval '7 days')
"""

# The metrics job's count (maintenance/jobs/metrics/__init__.py, count_successes).
COUNT = """
SELECT consumer, count(*) FROM {table}
 WHERE processed_at >= %(since)s AND processed_at < %(until)s
 GROUP BY consumer
"""


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median_ms(conn: psycopg.Connection, query: sql.Composable, params: dict, repeat: int) -> float:
    return statistics.median(timed(lambda: conn.execute(query, params).fetchall()) for _ in range(repeat)) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="fences per table (a week of them)")
    parser.add_argument("--bulk", type=int, default=200_000, help="fences per bulk insert")
    parser.add_argument("--singles", type=int, default=10000, help="one-fence transactions per variant")
    parser.add_argument("--rounds", type=int, default=5, help="bulk inserts per variant (the best counts)")
    parser.add_argument("--repeat", type=int, default=15, help="runs of each count")
    parser.add_argument("--cycles", type=int, default=7, help="purge cycles (a day each; 7 = every fence replaced)")
    args = parser.parse_args()

    server = os.environ.get("CORE_JOBS_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    with scratch_database(server, prefix="core_jobs_bench") as url, connect(url, autocommit=True) as conn:
        run(conn, args)
    return 0


def run(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    now = conn.execute("SELECT date_trunc('second', now())").fetchone()[0]
    tables = {v: sql.Identifier(f"fences_{v}") for v in VARIANTS}
    week, day = timedelta(days=7), timedelta(days=1)
    print(
        f"rows per table: {args.rows:,}; bulk insert {args.bulk:,} (best of {args.rounds});"
        f" single-fence transactions {args.singles:,} (interleaved); counts: median of {args.repeat}"
    )
    for variant, table in tables.items():
        conn.execute(sql.SQL(CREATE_TABLE).format(table=table))
        if VARIANTS[variant]:
            conn.execute(sql.SQL(VARIANTS[variant]).format(table=table, idx=sql.Identifier(f"fences_{variant}_at")))
        conn.execute(sql.SQL(FILL).format(table=table), {"until": now, "span": week, "n": args.rows})
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))

    # The metrics count first, on the pristine week of fences (newest minute and hour).
    minute = {"since": now - timedelta(minutes=1), "until": now}
    hour = {"since": now - timedelta(hours=1), "until": now}
    counts = {
        v: (
            median_ms(conn, sql.SQL(COUNT).format(table=t), minute, args.repeat),
            median_ms(conn, sql.SQL(COUNT).format(table=t), hour, args.repeat),
        )
        for v, t in tables.items()
    }

    # The write side. Bulk fences go into the hour after `now` (outside every window counted).
    # Variants take turns in small slices, so load from other processes hits them alike; the
    # bulk figure is the best of the rounds (the least disturbed), the single-fence one the sum.
    bulk: dict[str, list[float]] = {v: [] for v in VARIANTS}
    single: dict[str, float] = {v: 0.0 for v in VARIANTS}
    wal: dict[str, list[int]] = {v: [0, 0, 0] for v in VARIANTS}  # records, full-page images, bytes
    ahead = now + timedelta(hours=1)
    for _ in range(args.rounds):
        for variant, table in tables.items():
            fill = sql.SQL(FILL).format(table=table)
            bulk[variant].append(
                timed(
                    lambda fill=fill: conn.execute(fill, {"until": ahead, "span": timedelta(hours=1), "n": args.bulk})
                )
            )
    slice_size = 50
    for _ in range(max(1, args.singles // slice_size)):
        for variant, table in tables.items():
            one = sql.SQL(SINGLE).format(table=table)
            single[variant] += timed(lambda one=one: [conn.execute(one) for _ in range(slice_size)])
            # This statement's own WAL (EXPLAIN's counters; the server-wide LSN includes others').
            plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, WAL, FORMAT JSON) ") + one).fetchone()[0]
            for i, key in enumerate(("WAL Records", "WAL FPI", "WAL Bytes")):
                wal[variant][i] += plan[0]["Plan"][key]
    singles = max(1, args.singles // slice_size) * slice_size

    # Purge cycles: the oldest day goes, VACUUM frees its pages, a new day of fences fills them.
    # A BRIN range summary only widens, so reused pages may make more ranges match.
    counts_after: dict[int, dict[str, float]] = {}
    day_end = now
    for cycle in range(1, args.cycles + 1):
        day_end += day
        for table in tables.values():
            conn.execute(sql.SQL("DELETE FROM {} WHERE processed_at < %s").format(table), (day_end - week,))
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
            conn.execute(sql.SQL(FILL).format(table=table), {"until": day_end, "span": day, "n": args.rows // 7})
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        if cycle in (1, args.cycles):
            newest = {"since": day_end - timedelta(minutes=1), "until": day_end}
            counts_after[cycle] = {
                v: median_ms(conn, sql.SQL(COUNT).format(table=t), newest, args.repeat) for v, t in tables.items()
            }
    sizes = {
        v: conn.execute("SELECT coalesce(pg_relation_size(to_regclass(%s)), 0)", (f"fences_{v}_at",)).fetchone()[0]
        for v in VARIANTS
    }

    base_bulk = min(bulk["none"])
    base_single = single["none"]
    base_count = counts["none"]
    header = (
        f"{'variant':<7} {'bulk insert':>14} {'one fence/txn':>16} {'WAL rec/fence':>14} {'count 1 min':>16} {'count 1 h':>16}"
        + "".join(f" {'1 min, purge ' + str(c):>17}" for c in counts_after)
        + f" {'index size':>11}"
    )
    print(header)
    for v in VARIANTS:
        b, s = min(bulk[v]), single[v]
        samples = singles // slice_size
        records = wal[v][0] / samples
        print(
            f"{v:<7} {b:>7.2f}s x{b / base_bulk:4.2f} {s / singles * 1e6:>8.0f}us x{s / base_single:4.2f}"
            f" {records:>8.2f} x{wal[v][0] / wal['none'][0]:4.2f}"
            f" {counts[v][0]:>7.2f}ms x{counts[v][0] / base_count[0]:5.3f} {counts[v][1]:>7.2f}ms x{counts[v][1] / base_count[1]:5.3f}"
            + "".join(f" {after[v]:>8.2f}ms x{after[v] / after['none']:5.3f}" for after in counts_after.values())
            + f" {sizes[v] / 1024:>8.0f}kB"
        )
    print(
        "WAL of one fence insert (EXPLAIN ANALYZE WAL, mean of "
        + str(singles // slice_size)
        + "): "
        + "; ".join(
            f"{v} {wal[v][0] / (singles // slice_size):.2f} records, {wal[v][2] / (singles // slice_size):.0f} bytes"
            f" ({wal[v][1]} full-page images)"
            for v in VARIANTS
        )
    )
    print("ratios (x) are against 'none' measured in this same run.")


if __name__ == "__main__":
    sys.exit(main())
