"""The purge's fence-hold rule spelled inline (before migration 0008) against the predicate ``core.holds_fence`` (after).

    uv run python bench/purge_guard.py                     # 2 M fences, shuffled, 60 % expired
    uv run python bench/purge_guard.py --holders 80000     # past HASHED_PENDING_LIMIT: the probed spelling's case

Loads one database (bench/purge.py's loader) plus ``--holders`` pending dead letters on expired
fences, then times one index-walk batch SELECT (the batch's choice of rows, without deleting) in
four spellings — hashed/probed × inline/function — interleaved over ``--runs`` rounds, and
prints each median and the function/inline ratio. Both spellings must pick the same rows; the
script checks that first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.purge import interleaved_medians, scratch_fences
from harness.pg import connect

INLINE = {
    "hashed": """p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE d.status = 'pending_review'
                        UNION ALL SELECT d.job_id FROM core.dead_letters AS d
                         WHERE d.status = 'replayed' AND d.replay_handled_at IS NULL
                        UNION ALL SELECT d.job_id FROM core.dead_letters AS d
                         WHERE d.status = 'replayed' AND d.replay_handled_at >= %(protected_from)s)""",
    "probed": """NOT EXISTS (SELECT 1 FROM core.dead_letters AS d WHERE d.job_id = p.job_id
                      AND (d.status = 'pending_review' OR (d.status = 'replayed'
                           AND (d.replay_handled_at IS NULL OR d.replay_handled_at >= %(protected_from)s))))""",
}
FUNCTION = {
    "hashed": "p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE core.holds_fence(d, %(protected_from)s))",
    "probed": """NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                      WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))""",
}

BATCH = """
SELECT p.ctid FROM core.processed_jobs AS p
 WHERE p.expires_at >= '-infinity' AND p.expires_at < now() AND p.processed_at < now() - interval '1 hour'
   AND {guard}
 ORDER BY p.expires_at LIMIT 10000"""
ADD_HOLDERS = """
INSERT INTO core.dead_letters (job_id, queue, consumer, payload, attempts, last_error)
SELECT p.job_id, 'points.credit', p.consumer, '{}'::jsonb, 5, 'Bench: held'
  FROM core.processed_jobs AS p WHERE p.expires_at < now() ORDER BY random() LIMIT %(n)s"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--holders", type=int, default=600, help="pending dead letters on expired fences")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    with scratch_fences("core_jobs_bench_guard", args.rows, shuffled=1.0) as url, connect(url, autocommit=True) as conn:
        conn.execute(ADD_HOLDERS, {"n": args.holders})
        conn.execute("ANALYZE core.dead_letters")
        params = {"protected_from": conn.execute("SELECT now() - interval '1 day'").fetchone()[0]}
        queries = {
            f"{spelling} {kind}": BATCH.format(guard=rules[spelling])
            for kind, rules in (("inline", INLINE), ("function", FUNCTION))
            for spelling in rules
        }
        picked = {label: sorted(str(r[0]) for r in conn.execute(q, params)) for label, q in queries.items()}
        assert len({tuple(v) for v in picked.values()}) == 1, "the spellings picked different rows"
        medians = interleaved_medians(conn, queries, params, args.runs)
    print(f"{args.rows} fences, {args.holders} pending dead letters holding expired fences, {args.runs} rounds")
    for spelling in ("hashed", "probed"):
        inline, function = medians[f"{spelling} inline"], medians[f"{spelling} function"]
        print(
            f"  {spelling}: inline {inline:.2f} ms, function {function:.2f} ms, function/inline {function / inline:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
