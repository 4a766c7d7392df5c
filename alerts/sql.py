"""The alert feed's SQL: every statement under a name with what it does and why (its state machine is enforced by
migrations 0002_alerts and 0006_alert_identity), one section per source after the installation's identity.

The executions' statements (migrations 0010_durable_actions, 0011_execution_alerts) are the dead letters', with the
same parameters, over ``core.executions`` and ``core.execution_alert_coverage``. What is paged is an **episode**: one
stay of an execution in RECONCILIATION_REQUIRED, ``(id, status_changed_at)`` — the database sets
``status_changed_at`` when the state changes and never while it stays. Coverage rows name the episode
(``entered_at``), so an execution that is resolved and becomes uncertain again pages again; a statement given
execution ids always means their *current* episode, and an execution no longer RECONCILIATION_REQUIRED is no longer
"pending" for the feed. The group is the consumer (in the alert's ``queue`` column). ``stale_cutoff`` is the run's
``now − stale_after``.
"""

from __future__ import annotations

# --- the installation's identity ---------------------------------------------------------------
# This installation's identity (migration 0006_alert_identity): one row, never changed.
READ_INSTALLATION = "SELECT id::text FROM core.installation"

# The identity with its binding (place: migration 0015_installation_copies; environment:
# 0016_installation_environment) and where the database is now, and whether this database ever recorded an alert: a copy that never did can take a new identity
# by itself (identity.py).
READ_IDENTITY = """
SELECT i.id::text, i.system_identifier, i.database_oid::bigint, i.database_name,
       i.bound_at, i.bound_how, i.bound_by, i.bound_reason,
       l.system_identifier, l.database_oid::bigint, l.database_name,
       EXISTS (SELECT 1 FROM core.dead_letter_alerts) AS has_alerts, i.environment
  FROM core.installation AS i CROSS JOIN core.installation_location() AS l
"""

# Bind the identity to where the database is now and to an environment: keep the id (adopted, or
# declared: the first environment of an installation that had none) or take a new one (renewed).
# The database checks the rest (where, when, no unfinished alert for a renew, declared from none).
REBIND_INSTALLATION = """
UPDATE core.installation AS i
   SET id = CASE WHEN %(how)s = 'renewed' THEN gen_random_uuid() ELSE i.id END,
       (system_identifier, database_oid, database_name) = (l.system_identifier, l.database_oid, l.database_name),
       bound_at = now(), bound_how = %(how)s, bound_by = %(by)s, bound_reason = %(reason)s,
       environment = %(environment)s
  FROM core.installation_location() AS l
RETURNING i.id::text
"""

# A renew: the origin's open incidents are its own, not this copy's to resolve; recorded resolved
# with resolution 'inherited', nothing sent to Better Stack.
RESOLVE_INHERITED = """
UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = %(now)s, resolution = 'inherited'
 WHERE state = 'open'
RETURNING id
"""

# --- dead letters ------------------------------------------------------------------------------
# New: pending, younger than the stale cutoff, not covered by a 'new' alert. Walks the partial
# index of pending dead letters only, so its cost follows the backlog, not the table's history.
SCAN_NEW = """
SELECT dl.queue, array_agg(dl.id ORDER BY dl.id), min(dl.created_at), max(dl.created_at)
  FROM core.dead_letters AS dl
 WHERE dl.status = 'pending_review'
   AND dl.created_at > %(stale_cutoff)s
   AND NOT EXISTS (SELECT 1 FROM core.dead_letter_alert_coverage AS c
                    WHERE c.dead_letter_id = dl.id AND c.kind = 'new')
 GROUP BY dl.queue
"""

# Stale: pending at the cutoff, not yet covered by an escalation.
SCAN_STALE = """
SELECT dl.queue, array_agg(dl.id ORDER BY dl.id), min(dl.created_at), max(dl.created_at)
  FROM core.dead_letters AS dl
 WHERE dl.status = 'pending_review'
   AND dl.created_at <= %(stale_cutoff)s
   AND NOT EXISTS (SELECT 1 FROM core.dead_letter_alert_coverage AS c
                    WHERE c.dead_letter_id = dl.id AND c.kind = 'stale')
 GROUP BY dl.queue
"""

# The most frequent errors of a set of dead letters, by their first line (tracebacks differ below it).
TOP_ERRORS = """
SELECT left(split_part(last_error, E'\\n', 1), %(chars)s) AS error, count(*) AS n
  FROM core.dead_letters
 WHERE id = ANY(%(ids)s)
 GROUP BY 1
 ORDER BY n DESC, error
 LIMIT %(top)s
"""

SAMPLES = "SELECT id, job_id::text, correlation_id FROM core.dead_letters WHERE id = ANY(%(ids)s) ORDER BY id"

# Pending dead letters not yet covered by a confirmed (open or resolved) alert, per kind.
COUNT_UNALERTED = """
SELECT count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM core.dead_letter_alert_coverage AS c
             JOIN core.dead_letter_alerts AS a ON a.id = c.alert_id
            WHERE c.dead_letter_id = dl.id AND c.kind = 'new' AND a.state IN ('open', 'resolved'))),
       count(*) FILTER (WHERE dl.created_at <= %(stale_cutoff)s AND NOT EXISTS (
           SELECT 1 FROM core.dead_letter_alert_coverage AS c
             JOIN core.dead_letter_alerts AS a ON a.id = c.alert_id
            WHERE c.dead_letter_id = dl.id AND c.kind = 'stale' AND a.state IN ('open', 'resolved')))
  FROM core.dead_letters AS dl
 WHERE dl.status = 'pending_review'
"""

RECORD_INTENT = """
INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, name, summary, description, num_dead_letters, created_at)
VALUES (%(alert_key)s, %(kind)s, %(queue)s, %(name)s, %(summary)s, %(description)s, %(num)s, %(now)s)
RETURNING id
"""

# The intent covers its dead letters for its kind; an escalation also covers, as 'new', those
# never alerted before (a dead letter already stale when first seen pages once, not twice).
RECORD_COVERAGE = """
INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id)
SELECT id, %(kind)s, %(alert_id)s FROM unnest(%(ids)s::bigint[]) AS id
"""

RECORD_NEW_COVERAGE_OF_ESCALATION = """
INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id)
SELECT u.id, 'new', %(alert_id)s FROM unnest(%(ids)s::bigint[]) AS u(id)
 WHERE NOT EXISTS (SELECT 1 FROM core.dead_letter_alert_coverage AS c WHERE c.dead_letter_id = u.id AND c.kind = 'new')
"""

# An alert row names its group's key ``queue`` and its number of items ``num_dead_letters``, for
# either source: the schema's names, older than the execution source (migration 0002_alerts).
PENDING_INTENTS = """
SELECT id, alert_key, kind, queue, name, summary, description, num_dead_letters
  FROM core.dead_letter_alerts WHERE state = 'pending' ORDER BY id
"""

# What an earlier intent's dead letters have become: how many are still pending review, and how
# many of those are stale at the cutoff (a 'new' intent with a stale one is superseded).
INTENT_STANDING = """
SELECT count(*) FILTER (WHERE dl.status = 'pending_review'),
       count(*) FILTER (WHERE dl.status = 'pending_review' AND dl.created_at <= %(stale_cutoff)s)
  FROM core.dead_letter_alert_coverage AS c
  JOIN core.dead_letters AS dl ON dl.id = c.dead_letter_id
 WHERE c.alert_id = %(id)s AND c.kind = %(kind)s
"""

CANCEL_INTENT = """
UPDATE core.dead_letter_alerts SET state = 'cancelled', cancelled_at = %(now)s, cancel_reason = %(reason)s
 WHERE id = %(id)s AND state = 'pending'
"""

# A cancelled intent paged nothing: its dead letters still pending review are released (the
# database allows deleting only a cancelled alert's coverage), so this run's scan plans them
# again. The coverage of its handled dead letters stays, as the record of what it covered.
RELEASE_COVERAGE = """
DELETE FROM core.dead_letter_alert_coverage AS c
 USING core.dead_letters AS dl
 WHERE c.alert_id = %(id)s AND dl.id = c.dead_letter_id AND dl.status = 'pending_review'
RETURNING c.dead_letter_id
"""

# A released dead letter an escalation already covers (recorded in an earlier run) is paged by
# that escalation: it covers it as 'new' too, as RECORD_NEW_COVERAGE_OF_ESCALATION does.
COVER_RELEASED_BY_ESCALATION = """
INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id)
SELECT s.dead_letter_id, 'new', s.alert_id
  FROM core.dead_letter_alert_coverage AS s
 WHERE s.kind = 'stale' AND s.dead_letter_id = ANY(%(ids)s::bigint[])
   AND NOT EXISTS (SELECT 1 FROM core.dead_letter_alert_coverage AS c
                    WHERE c.dead_letter_id = s.dead_letter_id AND c.kind = 'new')
"""

MARK_OPEN = """
UPDATE core.dead_letter_alerts SET state = 'open', incident_id = %(incident_id)s, posted_at = %(now)s
 WHERE id = %(id)s AND state = 'pending'
"""

# Open dead-letter incidents none of whose dead letters is still pending review: due for
# auto-resolve. (The execution incidents have their own rule: RESOLVED_OPEN_EXECUTION_ALERTS.)
HANDLED_OPEN_ALERTS = """
SELECT a.id, a.incident_id, a.alert_key, a.kind, a.queue
  FROM core.dead_letter_alerts AS a
 WHERE a.state = 'open' AND a.kind IN ('new', 'stale')
   AND NOT EXISTS (SELECT 1 FROM core.dead_letter_alert_coverage AS c
                     JOIN core.dead_letters AS dl ON dl.id = c.dead_letter_id
                    WHERE c.alert_id = a.id AND dl.status = 'pending_review')
 ORDER BY a.id
"""

# resolution: 'resolved' (Better Stack has it resolved) or 'gone' (deleted there).
MARK_RESOLVED = """
UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = %(now)s, resolution = %(resolution)s
 WHERE id = %(id)s AND state = 'open'
"""


# --- executions --------------------------------------------------------------------------------
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
