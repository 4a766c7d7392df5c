"""The metrics job's SQL, each statement under a name with what it does and why."""

from __future__ import annotations

# --- SQL ---------------------------------------------------------------------------------------
# Make sure the watermark row exists (it is seeded by the migration; an operator may delete it
# to restart the counters), then lock it: concurrent runs serialise here.
ENSURE_WATERMARK = """
INSERT INTO core.metrics_watermark (name) VALUES (%(name)s)
ON CONFLICT (name) DO NOTHING
"""

LOCK_WATERMARK = """
SELECT counted_until, totals FROM core.metrics_watermark WHERE name = %(name)s FOR UPDATE
"""

# success_horizon: where counting may stop. Every transaction open in this database started at
# or after oldest_open, so every fence still to come has processed_at >= oldest_open. `hidden`
# counts sessions whose start this role may not see; `prepared` two-phase transactions (no
# backend, no start time). Autovacuum never writes fences. Runs BEFORE count_successes, which
# (READ COMMITTED) takes a newer snapshot: a transaction gone from this list is visible there.
SUCCESS_HORIZON = """
SELECT min(a.xact_start) AS oldest_open,
       count(*) FILTER (WHERE NOT pg_has_role('pg_read_all_stats', 'USAGE')
                          AND NOT coalesce(pg_has_role(a.usesysid, 'USAGE'), true)) AS hidden,
       (SELECT count(*) FROM pg_prepared_xacts p WHERE p.database = current_database()) AS prepared
  FROM pg_stat_activity a
 WHERE a.datname = current_database()
   AND a.pid <> pg_backend_pid()
   AND a.backend_type IS DISTINCT FROM 'autovacuum worker'  -- NULL for a hidden session: keep it
"""

# count_successes: the fences between the old and the new watermark (half-open, so a fence on
# the boundary is counted exactly once), per consumer; served by the processed_at index
# (migration 0004). The tenant column is NULL unless CORE_JOBS_METRICS_TENANT_LABEL is on.
COUNT_SUCCESSES = """
SELECT consumer, NULL::text AS tenant, count(*) AS n
  FROM core.processed_jobs
 WHERE processed_at >= %(since)s AND processed_at < %(until)s
 GROUP BY 1, 2
"""

# The same, per consumer and tenant (CORE_JOBS_METRICS_TENANT_LABEL=true).
COUNT_SUCCESSES_BY_TENANT = """
SELECT consumer, tenant_id::text AS tenant, count(*) AS n
  FROM core.processed_jobs
 WHERE processed_at >= %(since)s AND processed_at < %(until)s
 GROUP BY 1, 2
"""

ADVANCE_WATERMARK = """
UPDATE core.metrics_watermark SET counted_until = %(until)s, totals = %(totals)s, updated_at = %(now)s
 WHERE name = %(name)s
"""

# dead_letter_figures: per queue; handled dead letters are never deleted, so their counts only grow.
DEAD_LETTER_FIGURES = """
SELECT queue,
       count(*) FILTER (WHERE status = 'pending_review') AS pending,
       min(created_at) FILTER (WHERE status = 'pending_review') AS oldest_pending_at,
       count(*) FILTER (WHERE status = 'replayed') AS replayed,
       count(*) FILTER (WHERE status = 'discarded') AS discarded
  FROM core.dead_letters
 GROUP BY queue
 ORDER BY queue
"""

# execution_figures: durable executions per consumer and state, with the oldest moment
# a group entered its state (the metrics use it for RECONCILIATION_REQUIRED: how long the oldest
# uncertain write has waited for an operator). Succeeded executions are deleted, so these are
# gauges of the work in hand. Reads executions_status_idx.
EXECUTION_FIGURES = """
SELECT consumer, status, count(*) AS n, min(status_changed_at) AS oldest_since
  FROM core.executions
 GROUP BY consumer, status
 ORDER BY consumer, status
"""

# resolution_figures: operator resolutions per consumer and command, from the resolution
# ledger — append-only and never purged, so each count is a true cumulative counter. Resolutions are
# people's decisions: the table stays small, a scan is cheap.
RESOLUTION_FIGURES = """
SELECT consumer, command, count(*) AS n
  FROM core.execution_resolutions
 GROUP BY consumer, command
 ORDER BY consumer, command
"""
