"""Benchmark: the alert feed's scan over 1 M dead letters with 10 k new and 5 k stale (docs/spec.md NF-10).

Creates a scratch database on the server at ``ALERTS_BENCH_DATABASE_URL`` (default: the tests'
``CORE_JOBS_TEST_DATABASE_URL``, else postgresql://postgres@127.0.0.1:5432/test), migrates it,
seeds it, measures, and drops it. Not a ``CORE_JOBS_*`` variable on purpose: ``load_settings``
rejects unknown ones.

The history is realistic: 985 k handled dead letters (replayed or discarded), each covered by
one of 1 000 resolved alerts; 5 k stale ones (pending 4–30 days, alerted as new by 50 open
alerts, not escalated); 10 k new ones (pending, the last 2 days, in 40 queues, never alerted).

Measured, each the median of ``RUNS`` warm runs, on PostgreSQL's side of the connection:
- the scan (new and stale groups per queue, capped, with top errors and samples);
- the two counts of the result (unalerted, unescalated) and the auto-resolve check;
- a dry ``run_once`` end to end (lock, scan, compose, counts);
- the baseline: one sequential ``count(*)`` of the whole table, in the same run, so the ratio
  says how the scan compares with merely reading the table once.

    uv run python bench/alerts_scan.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from alerts.feed import AlertFeed
from alerts.incidents import scan
from alerts.settings import AlertsFields
from alerts.sql import COUNT_UNALERTED, HANDLED_OPEN_ALERTS, SCAN_NEW, SCAN_STALE
from core_jobs_demo import scratch_database
from harness.pg import connect, server_now
from maintenance.runtime import migrate

TOTAL, NEW, STALE = 1_000_000, 10_000, 5_000
HANDLED = TOTAL - NEW - STALE
RUNS = 7

SEED = {
    "handled": f"""
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, status, discard_reason,
                                       correlation_id, created_at, status_changed_at)
        SELECT gen_random_uuid(), 'queue.' || (g % 60), jsonb_build_object('member_id', 'm-' || g, 'points', g % 500),
               5, 'ProviderUnavailable: HTTP 503 from loyalty ledger',
               CASE WHEN g % 3 = 0 THEN 'discarded' ELSE 'replayed' END,
               CASE WHEN g % 3 = 0 THEN 'duplicate, ticket OPS-' || g END,
               'corr-' || g, now() - interval '90 days' + g * interval '7 seconds', now() - interval '1 day'
          FROM generate_series(1, {HANDLED}) AS g""",
    "stale": f"""
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, created_at)
        SELECT gen_random_uuid(), 'queue.' || (g % 10), '{{}}'::jsonb, 5,
               (ARRAY['DeadlockDetected: deadlock detected', 'ProviderTimeout: no answer in 10 s'])[1 + g % 2],
               'corr-stale-' || g, now() - interval '4 days' - (g % 26) * interval '1 day' - g * interval '1 second'
          FROM generate_series(1, {STALE}) AS g""",
    "new": f"""
        INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, created_at)
        SELECT gen_random_uuid(), 'queue.' || (g % 40), '{{}}'::jsonb, CASE WHEN g % 5 = 0 THEN 1 ELSE 5 END,
               CASE WHEN g % 5 = 0 THEN 'PoisonMessage: payload failed schema validation'
                    ELSE 'ProviderUnavailable: HTTP 503 from loyalty ledger' END,
               'corr-new-' || g, now() - g * interval '15 seconds'
          FROM generate_series(1, {NEW}) AS g""",
    # 1 000 resolved alerts covering the handled history, 50 open ones covering the stale as new.
    "alerts": """
        INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, state, name, summary, description,
                                             num_dead_letters, incident_id, posted_at, resolved_at, resolution)
        SELECT 'bench:' || g, 'new', 'queue.' || (g % 60), CASE WHEN g <= 1000 THEN 'resolved' ELSE 'open' END,
               'n', 's', 'd', 1, (100000 + g)::text, now() - interval '30 days',
               CASE WHEN g <= 1000 THEN now() - interval '1 day' END, CASE WHEN g <= 1000 THEN 'resolved' END
          FROM generate_series(1, 1050) AS g""",
    "coverage": f"""
        INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id)
        SELECT id, 'new', CASE WHEN status = 'pending_review' THEN 1001 + id % 50 ELSE 1 + id % 1000 END
          FROM core.dead_letters
         WHERE status <> 'pending_review' OR id <= {HANDLED + STALE}""",
}


def timed(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def median_ms(action: Callable[[], object]) -> tuple[float, object]:
    value = None
    times = []
    for _ in range(RUNS):
        seconds, value = timed(action)
        times.append(seconds * 1000)
    return statistics.median(times), value


def main() -> None:
    server = os.environ.get("ALERTS_BENCH_DATABASE_URL") or os.environ.get(
        "CORE_JOBS_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
    )
    with scratch_database(server, prefix="core_jobs_bench_alerts") as url:
        run(url)


def run(url: str) -> None:
    migrate.upgrade(url)
    with connect(url, autocommit=True) as conn:
        # Seeding history directly: the guard triggers would make 1 M status changes take minutes.
        conn.execute("SET session_replication_role = replica")
        for step, statement in SEED.items():
            seconds, _ = timed(lambda s=statement: conn.execute(s))
            print(f"seeded {step:9} in {seconds:6.1f} s")
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE core.dead_letters")
        conn.execute("VACUUM ANALYZE core.dead_letter_alert_coverage")
        conn.execute("VACUUM ANALYZE core.dead_letter_alerts")
        counts = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'pending_review') FROM core.dead_letters"
        ).fetchone()
        print(f"dead letters: {counts[0]:,} ({counts[1]:,} pending review)")

        config = AlertsFields()
        now = server_now(conn)
        cutoff = now - config.dead_letter_stale_after

        baseline_ms, _ = median_ms(lambda: conn.execute("SELECT count(*) FROM core.dead_letters").fetchone())
        scan_ms, groups = median_ms(lambda: scan(conn, now, config))
        counts_ms, unalerted = median_ms(lambda: conn.execute(COUNT_UNALERTED, {"stale_cutoff": cutoff}).fetchone())
        resolve_ms, due = median_ms(lambda: conn.execute(HANDLED_OPEN_ALERTS).fetchall())
        feed = AlertFeed(config, connect=lambda: connect(url, autocommit=True), client=None, log=_Quiet())
        run_ms, result = median_ms(lambda: feed.run_once(now))

        new_groups = [g for g in groups if g.kind == "new"]
        stale_groups = [g for g in groups if g.kind == "stale"]
        print(
            f"scan found {sum(len(g.items) for g in new_groups):,} new in {len(new_groups)} incidents, "
            f"{sum(len(g.items) for g in stale_groups):,} stale in {len(stale_groups)} escalations; "
            f"unalerted={unalerted[0]:,} unescalated={unalerted[1]:,}; due for resolve: {len(due)}"
        )
        print(f"baseline: seq count(*) of {counts[0]:,} rows   {baseline_ms:8.1f} ms")
        print(
            f"scan (groups + top errors + samples)      {scan_ms:8.1f} ms   ratio to baseline {scan_ms / baseline_ms:.2f}"
        )
        print(
            f"result counts (unalerted, unescalated)    {counts_ms:8.1f} ms   ratio to baseline {counts_ms / baseline_ms:.2f}"
        )
        print(
            f"auto-resolve check                        {resolve_ms:8.1f} ms   ratio to baseline {resolve_ms / baseline_ms:.2f}"
        )
        total = scan_ms + counts_ms + resolve_ms
        print(
            f"one scan's database time (sum)            {total:8.1f} ms   target <= 1000 ms: {'ok' if total <= 1000 else 'MISSED'}"
        )
        print(
            f"dry run_once end to end                   {run_ms:8.1f} ms   (would post {result.dry_run_incidents} incidents)"
        )
        for query, label in ((SCAN_NEW, "new scan"), (SCAN_STALE, "stale scan")):
            plan = [r[0] for r in conn.execute("EXPLAIN " + query, {"stale_cutoff": cutoff})]
            indexes = sorted(
                {word for line in plan for word in line.split() if word.endswith("_idx") or word.endswith("_pkey")}
            )
            print(f"{label} plan uses: {', '.join(indexes) or 'no index'}")


class _Quiet:
    """A logger that drops the dry run's per-incident events, so the figures stay readable."""

    def info(self, *args: object, **kwargs: object) -> None:
        pass


if __name__ == "__main__":
    main()
