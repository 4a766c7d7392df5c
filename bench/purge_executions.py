"""What the purge's execution rule (an unfinished execution keeps its fence) costs: one index-walk batch with and without it.

    uv run python bench/purge_executions.py                        # 1 M fences, shuffled, 60 % expired
    uv run python bench/purge_executions.py --executions 20000     # many unfinished executions

Loads one database (bench/purge.py's loader) plus ``--executions`` PENDING executions on the
``(job_id, consumer)`` of expired fences (each holds its fence), then times one index-walk batch
SELECT (the batch's choice of rows, without deleting; the hashed dead-letter spelling) without
and with the clause ``NOT EXISTS (… core.executions … status <> 'FAILED')`` of
maintenance/jobs/purge/sql.py, interleaved over ``--runs`` rounds, and prints each median and the
ratio. It checks first that the rule keeps every held fence out of the batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.purge import interleaved_medians, scratch_fences
from harness.pg import connect

WITHOUT = """
SELECT p.ctid, p.job_id FROM core.processed_jobs AS p
 WHERE p.expires_at >= '-infinity' AND p.expires_at < now() AND p.processed_at < now() - interval '1 hour'
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE core.holds_fence(d, %(protected_from)s))
 ORDER BY p.expires_at LIMIT 10000"""
WITH_EXECUTIONS = """
SELECT p.ctid, p.job_id FROM core.processed_jobs AS p
 WHERE p.expires_at >= '-infinity' AND p.expires_at < now() AND p.processed_at < now() - interval '1 hour'
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE core.holds_fence(d, %(protected_from)s))
   AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                    WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')
 ORDER BY p.expires_at LIMIT 10000"""
WITH_EXECUTIONS_HASHED = """
SELECT p.ctid, p.job_id FROM core.processed_jobs AS p
 WHERE p.expires_at >= '-infinity' AND p.expires_at < now() AND p.processed_at < now() - interval '1 hour'
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE core.holds_fence(d, %(protected_from)s))
   AND (p.job_id, p.consumer) NOT IN (SELECT e.job_id, e.consumer FROM core.executions AS e WHERE e.status <> 'FAILED')
 ORDER BY p.expires_at LIMIT 10000"""
# Unfinished executions on expired fences drawn at random (as the dead-letter holders of
# bench/purge_guard.py), so that each batch meets its share of them.
ADD_EXECUTIONS = """
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload)
SELECT p.job_id, p.consumer, p.consumer, p.tenant_id, '{}'::jsonb
  FROM core.processed_jobs AS p WHERE p.expires_at < now() ORDER BY random() LIMIT %(n)s"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--executions", type=int, default=1_000, help="PENDING executions on expired fences")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    with (
        scratch_fences("core_jobs_bench_executions", args.rows, shuffled=1.0) as url,
        connect(url, autocommit=True) as conn,
    ):
        conn.execute(ADD_EXECUTIONS, {"n": args.executions})
        conn.execute("ANALYZE core.executions")
        params = {"protected_from": conn.execute("SELECT now() - interval '1 day'").fetchone()[0]}
        held = {r[0] for r in conn.execute("SELECT job_id FROM core.executions")}
        picked = {r[1] for r in conn.execute(WITH_EXECUTIONS, params)}
        assert not picked & held, "the rule let a held fence into the batch"
        assert {r[1] for r in conn.execute(WITHOUT, params)} & held, "no held fence in reach: nothing measured"
        assert picked == {r[1] for r in conn.execute(WITH_EXECUTIONS_HASHED, params)}, "the spellings differ"
        queries = {"without": WITHOUT, "probed": WITH_EXECUTIONS, "hashed": WITH_EXECUTIONS_HASHED}
        medians = interleaved_medians(conn, queries, params, args.runs)
    print(f"{args.rows} fences, {args.executions} unfinished executions on expired fences, {args.runs} rounds")
    print(f"  batch SELECT without the execution rule: {medians['without']:.2f} ms")
    for label in ("probed", "hashed"):
        spelling = "NOT EXISTS" if label == "probed" else "NOT IN"
        print(
            f"  with it, {label} ({spelling}): {medians[label]:.2f} ms, ratio {medians[label] / medians['without']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
