"""Where a purge batch's time goes: the purge's own batch statements in a hand-driven loop, against the guarded DELETE.

    uv run python bench/purge_profile.py                    # 2 M fences in expiry order, 3 rounds
    uv run python bench/purge_profile.py --shuffled --rounds 5
    uv run python bench/purge_profile.py --rows 500000 --batch-rows 10000 20000

Loads the fences of ``bench/purge.py`` (60 % expired, ~600 held by a pending dead letter) into a
template, then, round after round on fresh identical copies, in turn:

- ``guarded DELETE``: one DELETE of every deletable fence with the purge's own guards (the
  issue's baseline), run as ``EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF)`` and committed;
- ``sweep`` loops: the purge's ``SWEEP_BATCH_HASHED`` over the whole table in ranges of whole
  blocks (``--batch-rows`` rows' worth each, fixed, no steering), each batch run under EXPLAIN
  the same way and committed, in one of three protocols:
  ``4rt`` — what the purge sent before: BEGIN, the SET LOCAL limits, the statement, COMMIT (four
  round trips), synchronous_commit off; ``4rt-sync`` — the same with synchronous_commit on (a WAL
  flush per batch); ``1rt`` — what the purge sends now (``paths.fetch_limited``): the limits and
  the statement as one message, one implicit transaction, one round trip.

For each: rows/s, the sum over batches of the server's planning and execution time, and the
rest (round trips, commit, client) as the difference from the wall time; WAL bytes and full-page
images; the longest batch. Medians over the rounds with their ranges: the machine is shared.

Server: ``CORE_JOBS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.purge import DEFAULT_SERVER, GUARD, GUARDED_DELETE, admin, build_template, spread
from core_jobs_demo import with_database
from harness.pg import connect
from maintenance.jobs.purge.paths import fetch_limited
from maintenance.jobs.purge.sql import SET_BATCH_LIMITS, SWEEP_BATCH_HASHED

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, FORMAT JSON) "


@dataclass
class Profile:
    rows: int = 0
    wall_s: float = 0.0
    batches: int = 0
    planning_ms: float = 0.0
    execution_ms: float = 0.0
    wal_bytes: int = 0
    wal_fpi: int = 0
    longest_ms: float = 0.0
    phases_ms: dict[str, float] = field(default_factory=dict)

    def add(self, plan: dict[str, Any]) -> None:
        top = plan["Plan"]
        self.planning_ms += plan["Planning Time"]
        self.execution_ms += plan["Execution Time"]
        self.wal_bytes += top.get("WAL Bytes", 0)
        self.wal_fpi += top.get("WAL FPI", 0)

    @property
    def rate(self) -> float:
        return self.rows / self.wall_s

    @property
    def rest_ms(self) -> float:
        return self.wall_s * 1000 - self.planning_ms - self.execution_ms


def deleted_rows(plan: dict[str, Any]) -> int:
    """Rows the DELETE node of an EXPLAIN ANALYZE deleted (the CTE's, or the statement's own)."""

    def find(node: dict[str, Any]) -> int | None:
        if node.get("Node Type") == "ModifyTable":
            return int(node["Actual Rows"]) if "Actual Rows" in node else None
        for child in node.get("Plans", ()):
            found = find(child)
            if found is not None:
                return found
        return None

    top = plan["Plan"]
    if top.get("Node Type") == "ModifyTable":  # a plain DELETE returns nothing: count its input
        return int(top["Plans"][0]["Actual Rows"])
    return find(top) or 0


def params_for(conn: Any) -> dict[str, Any]:
    (now,) = conn.execute("SELECT now()").fetchone()
    return {"cutoff": now, "protected_from": now - GUARD.required}


def guarded_delete(url: str) -> Profile:
    profile = Profile(batches=1)
    with connect(url) as conn:
        params = params_for(conn)
        conn.commit()
        started = time.perf_counter()
        (plan,) = conn.execute(EXPLAIN + GUARDED_DELETE, params).fetchone()[0]
        conn.commit()
        profile.wall_s = time.perf_counter() - started
    profile.add(plan)
    profile.rows = deleted_rows(plan)
    profile.longest_ms = profile.wall_s * 1000
    return profile


def sweep(url: str, protocol: str, batch_rows: int) -> Profile:
    """The sweep's batch statement over the whole table, ``batch_rows`` rows' worth of blocks per batch."""
    profile = Profile(phases_ms={"begin": 0.0, "limits": 0.0, "statement": 0.0, "commit": 0.0})
    limits = SET_BATCH_LIMITS
    if protocol == "4rt-sync":
        limits = SET_BATCH_LIMITS.replace("'synchronous_commit', 'off'", "'synchronous_commit', 'on'")
        assert limits != SET_BATCH_LIMITS
    with connect(url, autocommit=True) as conn:
        params = params_for(conn)
        blocks_total, reltuples, relpages = conn.execute(
            "SELECT pg_relation_size('core.processed_jobs') / 8192, reltuples, relpages FROM pg_class"
            " WHERE oid = 'core.processed_jobs'::regclass"
        ).fetchone()
        step = max(1, round(batch_rows / (reltuples / relpages)))
        statement = EXPLAIN + SWEEP_BATCH_HASHED
        began = time.perf_counter()
        for first in range(0, blocks_total, step):
            batch = params | {"from_block": first, "to_block": first + step}
            t0 = time.perf_counter()
            if protocol == "1rt":
                (plan,) = fetch_limited(conn, "5s", statement, batch)[0]
                t3 = time.perf_counter()
                profile.phases_ms["statement"] += (t3 - t0) * 1000
            else:
                conn.execute("BEGIN")
                t1 = time.perf_counter()
                conn.execute(limits, {"statement_timeout": "5s"})
                t2 = time.perf_counter()
                (plan,) = conn.execute(statement, batch, prepare=False).fetchone()[0]
                t3 = time.perf_counter()
                conn.execute("COMMIT")
                t4 = time.perf_counter()
                for name, ms in zip(
                    ("begin", "limits", "statement", "commit"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True
                ):
                    profile.phases_ms[name] += ms * 1000
                t3 = t4
            profile.longest_ms = max(profile.longest_ms, (t3 - t0) * 1000)
            profile.batches += 1
            profile.add(plan)
            profile.rows += deleted_rows(plan)
        profile.wall_s = time.perf_counter() - began
    return profile


def on_copy(server: str, template: str, copy: str, action) -> Profile:
    admin(server, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(template)))
    try:
        return action(with_database(server, copy))
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(copy)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="fences to load (default 2 000 000)")
    parser.add_argument("--shuffled", action="store_true", help="load rows in random order, not expiry order")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each variant once per round (default 3)")
    parser.add_argument(
        "--batch-rows", type=int, nargs="+", default=[10_000, 20_000], help="rows' worth of blocks per sweep batch"
    )
    parser.add_argument(
        "--protocols", nargs="+", default=["4rt", "4rt-sync", "1rt"], choices=["4rt", "4rt-sync", "1rt"]
    )
    args = parser.parse_args(argv)
    server = os.environ.get("CORE_JOBS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    template = f"core_jobs_bench_profile_{os.getpid()}"
    variants: dict[str, Any] = {"guarded DELETE": guarded_delete}
    for rows in args.batch_rows:
        for protocol in args.protocols:
            variants[f"sweep {protocol} {rows}"] = lambda url, p=protocol, r=rows: sweep(url, p, r)
    profiles: dict[str, list[Profile]] = {label: [] for label in variants}
    layout = "shuffled" if args.shuffled else "in expiry order"
    print(f"purge profile: {args.rows:,} fences {layout}, 60 % expired, {args.rounds} rounds")
    try:
        _, load_s = build_template(server, template, args.rows, 1.0 if args.shuffled else 0.0)
        print(f"loaded template in {load_s:.1f} s", flush=True)
        labels = list(variants)
        for round_no in range(args.rounds):
            order = labels[round_no % len(labels) :] + labels[: round_no % len(labels)]
            for i, label in enumerate(order):
                profile = on_copy(server, template, f"{template}_{round_no}_{i}", variants[label])
                profiles[label].append(profile)
                phases = " ".join(f"{k} {v:.0f}" for k, v in profile.phases_ms.items())
                print(
                    f"round {round_no + 1} {label:<20}: {profile.rows:>9,} rows {profile.wall_s:6.2f} s"
                    f" {profile.rate:>10,.0f} rows/s; {profile.batches} batches; planning {profile.planning_ms:.0f}"
                    f" ms, execution {profile.execution_ms:.0f} ms, rest {profile.rest_ms:.0f} ms [{phases}];"
                    f" WAL {profile.wal_bytes / 1e6:.1f} MB, {profile.wal_fpi} FPI; longest {profile.longest_ms:.1f} ms",
                    flush=True,
                )
    finally:
        admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))
    base = profiles["guarded DELETE"]
    print()
    print("medians (range) over the rounds; ratio = rows/s / the same round's guarded DELETE rows/s")
    for label, runs in profiles.items():
        ratios = [run.rate / b.rate for run, b in zip(runs, base, strict=True)]
        per_batch = [(run.wall_s * 1000) / run.batches for run in runs]
        plan_share = [run.planning_ms / (run.wall_s * 1000) for run in runs]
        exec_share = [run.execution_ms / (run.wall_s * 1000) for run in runs]
        rest_share = [run.rest_ms / (run.wall_s * 1000) for run in runs]
        print(
            f"  {label:<20} {spread([r.rate for r in runs], ',.0f')} rows/s, ratio {spread(ratios, '.2f')};"
            f" per batch {spread(per_batch, '.2f')} ms; of the wall time: planning {spread(plan_share, '.0%')},"
            f" execution {spread(exec_share, '.0%')}, rest {spread(rest_share, '.0%')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
