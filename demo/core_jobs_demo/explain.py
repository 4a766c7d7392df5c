"""The demo's account of each job's run: what it did and why, in sentences.

Kept apart from the jobs, so their results carry only what their events report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alerts.feed import AlertFeedResult
from maintenance.fields.durations import format_duration
from maintenance.jobs.metrics.job import MetricsResult
from maintenance.jobs.purge.job import PurgeResult
from maintenance.runtime.db import Database
from maintenance.settings import ENV_PREFIX

# The demo's account of the fences a run kept, by the rule that kept them.
COUNT_KEPT = """
SELECT count(*) FILTER (WHERE p.expires_at >= %(cutoff)s) AS not_expired,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at >= %(protected_from)s) AS inside_window,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s
                          AND EXISTS (SELECT 1 FROM core.dead_letters AS d
                                       WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s)))
                                                                                              AS held_by_dead_letter
  FROM core.processed_jobs AS p"""


def purge_lines(db: Database, result: PurgeResult) -> list[str]:
    """What the run deleted and which fences it kept, by the rule that kept each."""
    if result.skipped:
        return ["skipped: another purge run held the lock"]
    with db.connect(autocommit=True) as conn:
        row = conn.execute(COUNT_KEPT, {"cutoff": result.cutoff, "protected_from": result.protected_from}).fetchone()
    assert row is not None  # counts: always one row
    assert result.cutoff is not None and result.protected_from is not None  # set by every run that was not skipped
    not_expired, inside_window, pending = row
    return [
        f"deleted {result.num_deleted} fences in {result.num_batches} batch(es): expired, processed more than"
        f" {format_duration(result.cutoff - result.protected_from)} (margin x retry window) ago, no dead letter holding them",
        f"kept {inside_window} expired fences still inside the retry window (a late retry still needs them)",
        f"kept {pending} expired fences whose job has a dead letter pending review, or a replay not yet handled"
        " or handled inside the retry window (a replay needs them)",
        f"kept {not_expired} fences not expired yet",
        f"access path: {'sweep of the table in block ranges' if result.used_sweep else 'walk of the expires_at index'}"
        " (why: the maintenance.purge.strategy_chosen event)",
    ]


def alerts_lines(db: Database, result: AlertFeedResult) -> list[str]:
    """The incidents a dry run would post (the demo has no token)."""
    if not result.dry_run:
        return [f"posted {result.incidents_posted} incidents and {result.escalations_posted} escalations"]
    lines = [
        f"dry run (no {ENV_PREFIX}BETTERSTACK_API_TOKEN): would post {result.dry_run_incidents} incidents, recorded nothing"
    ]
    for incident in result.planned:
        label = "escalation" if incident.kind == "stale" else "incident"
        lines.append(f"{label}: {incident.name}")
        lines.append(f"    {incident.summary}")
    return lines


def metrics_lines(db: Database, result: MetricsResult) -> list[str]:
    figures = result.log_figures()
    lines = [
        f"counted {sum(result.successes.values())} successes up to {figures['counted_until']} (horizon: {result.horizon});"
        " the watermark row is the only row written",
    ]
    lines += [f'core_jobs_successes_total{{consumer="{k}"}} {v}' for k, v in figures["successes_total"].items()]
    for q in result.dead_letters:
        lines.append(
            f"queue {q.queue}: {q.pending} pending (oldest {q.oldest_pending_age_seconds or 0:.0f} s),"
            f" {q.replayed} replayed, {q.discarded} discarded"
        )
    return lines


EXPLAIN: dict[str, Callable[[Database, Any], list[str]]] = {
    "purge": purge_lines,
    "alerts": alerts_lines,
    "metrics": metrics_lines,
}
