"""The alert feed's SQL for RECONCILIATION_REQUIRED executions (migrations 0010_durable_actions, 0011_execution_alerts).

The same statements as the dead letters' (sql.py), with the same parameters, over
``core.executions`` and ``core.execution_alert_coverage``. What is paged is an **episode**: one
stay of an execution in RECONCILIATION_REQUIRED, ``(id, status_changed_at)`` — the database
sets ``status_changed_at`` when the state changes and never while it stays. Coverage rows name
the episode (``entered_at``), so an execution that is resolved and becomes uncertain again pages
again; a statement given execution ids always means their *current* episode, and an execution
no longer RECONCILIATION_REQUIRED is no longer "pending" for the feed. The group is the consumer
(in the alert's ``queue`` column). ``stale_cutoff`` is the run's ``now − stale_after``.
"""

from __future__ import annotations

# --- SQL --------------------------------------------------------------------------------------
# New: uncertain since after the cutoff, its episode not covered by a 'reconciliation' alert.
# Walks executions_status_idx (status, status_changed_at, id): its cost follows the backlog.
SCAN_NEW_EXECUTIONS = """
SELECT e.consumer, array_agg(e.id ORDER BY e.id), min(e.status_changed_at), max(e.status_changed_at),
       array_agg(e.status_changed_at ORDER BY e.id)
  FROM core.executions AS e
 WHERE e.status = 'RECONCILIATION_REQUIRED'
   AND e.status_changed_at > %(stale_cutoff)s
   AND NOT EXISTS (SELECT 1 FROM core.execution_alert_coverage AS c
                    WHERE c.execution_id = e.id AND c.entered_at = e.status_changed_at
                      AND c.kind = 'reconciliation')
 GROUP BY e.consumer
"""

# Stale: uncertain since the cutoff or before, its episode not yet escalated.
SCAN_STALE_EXECUTIONS = """
SELECT e.consumer, array_agg(e.id ORDER BY e.id), min(e.status_changed_at), max(e.status_changed_at),
       array_agg(e.status_changed_at ORDER BY e.id)
  FROM core.executions AS e
 WHERE e.status = 'RECONCILIATION_REQUIRED'
   AND e.status_changed_at <= %(stale_cutoff)s
   AND NOT EXISTS (SELECT 1 FROM core.execution_alert_coverage AS c
                    WHERE c.execution_id = e.id AND c.entered_at = e.status_changed_at
                      AND c.kind = 'reconciliation_stale')
 GROUP BY e.consumer
"""

# The most frequent reasons of a set of executions, first line only, prefixed by the action they
# concern unless the reason already starts with it ("notify: …", or the executor's "notify (EFFECT): …").
TOP_EXECUTION_REASONS = """
SELECT left(CASE WHEN reason_action IS NULL OR starts_with(reason, reason_action || ':')
                      OR starts_with(reason, reason_action || ' (') THEN ''
                 ELSE reason_action || ': ' END || split_part(reason, E'\\n', 1), %(chars)s) AS error,
       count(*) AS n
  FROM core.executions
 WHERE id = ANY(%(ids)s)
 GROUP BY 1
 ORDER BY n DESC, error
 LIMIT %(top)s
"""

EXECUTION_SAMPLES = """
SELECT id, job_id::text, correlation_id FROM core.executions WHERE id = ANY(%(ids)s) ORDER BY id"""

# Uncertain executions whose episode no confirmed (open or resolved) alert covers, per kind.
COUNT_UNALERTED_EXECUTIONS = """
SELECT count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM core.execution_alert_coverage AS c
             JOIN core.dead_letter_alerts AS a ON a.id = c.alert_id
            WHERE c.execution_id = e.id AND c.entered_at = e.status_changed_at AND c.kind = 'reconciliation'
              AND a.state IN ('open', 'resolved'))),
       count(*) FILTER (WHERE e.status_changed_at <= %(stale_cutoff)s AND NOT EXISTS (
           SELECT 1 FROM core.execution_alert_coverage AS c
             JOIN core.dead_letter_alerts AS a ON a.id = c.alert_id
            WHERE c.execution_id = e.id AND c.entered_at = e.status_changed_at AND c.kind = 'reconciliation_stale'
              AND a.state IN ('open', 'resolved')))
  FROM core.executions AS e
 WHERE e.status = 'RECONCILIATION_REQUIRED'
"""

# The intent covers the current episode of its executions for its kind (one still uncertain:
# one resolved since the scan has nothing left to page about).
RECORD_EXECUTION_COVERAGE = """
INSERT INTO core.execution_alert_coverage (execution_id, entered_at, kind, alert_id)
SELECT e.id, e.status_changed_at, %(kind)s, %(alert_id)s
  FROM core.executions AS e
 WHERE e.id = ANY(%(ids)s::bigint[]) AND e.status = 'RECONCILIATION_REQUIRED'
"""

# An escalation also covers, as 'reconciliation', the episodes never paged before (an execution
# already stale when first seen pages once, not twice).
RECORD_NEW_EXECUTION_COVERAGE_OF_ESCALATION = """
INSERT INTO core.execution_alert_coverage (execution_id, entered_at, kind, alert_id)
SELECT e.id, e.status_changed_at, 'reconciliation', %(alert_id)s
  FROM core.executions AS e
 WHERE e.id = ANY(%(ids)s::bigint[]) AND e.status = 'RECONCILIATION_REQUIRED'
   AND NOT EXISTS (SELECT 1 FROM core.execution_alert_coverage AS c
                    WHERE c.execution_id = e.id AND c.entered_at = e.status_changed_at
                      AND c.kind = 'reconciliation')
"""

# What an earlier intent's episodes have become: how many are still uncertain, and how many of
# those are stale at the cutoff (a 'reconciliation' intent with a stale one is superseded).
EXECUTION_INTENT_STANDING = """
SELECT count(e.id),
       count(e.id) FILTER (WHERE e.status_changed_at <= %(stale_cutoff)s)
  FROM core.execution_alert_coverage AS c
  LEFT JOIN core.executions AS e
    ON e.id = c.execution_id AND e.status_changed_at = c.entered_at AND e.status = 'RECONCILIATION_REQUIRED'
 WHERE c.alert_id = %(id)s AND c.kind = %(kind)s
"""

# A cancelled intent releases the episodes it covers that are still uncertain (the scan plans
# them again); the coverage of resolved ones stays, as the record of what it covered.
RELEASE_EXECUTION_COVERAGE = """
DELETE FROM core.execution_alert_coverage AS c
 USING core.executions AS e
 WHERE c.alert_id = %(id)s AND e.id = c.execution_id AND e.status_changed_at = c.entered_at
   AND e.status = 'RECONCILIATION_REQUIRED'
RETURNING c.execution_id
"""

# A released episode an escalation already covers is paged by that escalation: it covers it as
# 'reconciliation' too, as RECORD_NEW_EXECUTION_COVERAGE_OF_ESCALATION does.
COVER_RELEASED_EXECUTIONS_BY_ESCALATION = """
INSERT INTO core.execution_alert_coverage (execution_id, entered_at, kind, alert_id)
SELECT s.execution_id, s.entered_at, 'reconciliation', s.alert_id
  FROM core.execution_alert_coverage AS s
  JOIN core.executions AS e ON e.id = s.execution_id AND e.status_changed_at = s.entered_at
 WHERE s.kind = 'reconciliation_stale' AND s.execution_id = ANY(%(ids)s::bigint[])
   AND NOT EXISTS (SELECT 1 FROM core.execution_alert_coverage AS c
                    WHERE c.execution_id = s.execution_id AND c.entered_at = s.entered_at
                      AND c.kind = 'reconciliation')
"""

# Open execution incidents none of whose episodes is still uncertain (each was resolved by an
# operator: RESUME to PENDING, or CLOSE to FAILED): due for auto-resolve. Once none of a
# consumer's executions is RECONCILIATION_REQUIRED, every incident of that consumer is due.
RESOLVED_OPEN_EXECUTION_ALERTS = """
SELECT a.id, a.incident_id, a.alert_key, a.kind, a.queue
  FROM core.dead_letter_alerts AS a
 WHERE a.state = 'open' AND a.kind IN ('reconciliation', 'reconciliation_stale')
   AND NOT EXISTS (SELECT 1 FROM core.execution_alert_coverage AS c
                     JOIN core.executions AS e
                       ON e.id = c.execution_id AND e.status_changed_at = c.entered_at
                    WHERE c.alert_id = a.id AND e.status = 'RECONCILIATION_REQUIRED')
 ORDER BY a.id
"""
