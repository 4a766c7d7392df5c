"""The SQL of durable executions (harness/durable/executor.py), written out whole, one statement each.

Fencing: every write of a worker after its take matches ``id``, its ``fencing_token`` and
``lease_expires_at > now()`` (PostgreSQL's clock), and the first statement of each of its
transactions renews the lease while it locks the row (:data:`RENEW_LEASE_AND_RECORD`), so a
take-over waits for that transaction and then finds the lease live. A statement that matches
nothing means the worker is stale: the transaction is rolled back and nothing changes.
"""

from __future__ import annotations

# The take, first: the execution of a job's first delivery; its id when this delivery inserted it
# (it is then this transaction's alone), no row when it exists. The id is also kept in a
# transaction-local setting for TAKE_NEW_EXECUTION, which is sent with it in one pipeline.
INSERT_EXECUTION = """
WITH inserted AS (
    INSERT INTO core.executions (job_id, consumer, queue, tenant_id, correlation_id, payload, business_scope)
    VALUES (%(job_id)s, %(consumer)s, %(queue)s, %(tenant_id)s, %(correlation_id)s, %(payload)s, %(business_scope)s)
    ON CONFLICT (job_id, consumer) DO NOTHING
    RETURNING id
)
SELECT id, set_config('core_jobs.inserted_execution', id::text, true) FROM inserted
"""

# A new execution — the one INSERT_EXECUTION inserted in this transaction, if it did — taken at
# once, and whether the job's fence exists (a success whose execution is gone). A statement after
# the insert: its snapshot sees a success committed while the insert waited. A fenced one is
# noted in a transaction-local setting for DROP_FENCED_NEW_EXECUTION, the next statement of the
# same pipeline. No row: nothing inserted here (an existing execution: LOCK_EXECUTION).
TAKE_NEW_EXECUTION = """
WITH fence AS (
    SELECT EXISTS (SELECT 1 FROM core.processed_jobs WHERE job_id = %(job_id)s AND consumer = %(consumer)s) AS found
), taken AS (
    UPDATE core.executions
       SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),
           lease_expires_at = now() + %(lease)s::interval, leased_by = %(worker)s, takes = takes + 1
     WHERE id = nullif(current_setting('core_jobs.inserted_execution', true), '')::bigint
       AND job_id = %(job_id)s AND consumer = %(consumer)s
    RETURNING id, fencing_token, takes
)
SELECT taken.fencing_token, taken.takes, fence.found,
       set_config('core_jobs.fenced_execution', CASE WHEN fence.found THEN taken.id::text ELSE '' END, true)
  FROM taken, fence
"""

# The new execution of a job whose fence TAKE_NEW_EXECUTION found, deleted again in the take's own
# transaction (a RUNNING execution may be deleted: the job succeeded), so the take commits nothing.
DROP_FENCED_NEW_EXECUTION = """
DELETE FROM core.executions
 WHERE id = nullif(current_setting('core_jobs.fenced_execution', true), '')::bigint
   AND job_id = %(job_id)s AND consumer = %(consumer)s
"""

# An existing execution: lock it (waits for a worker's transaction on it) and read its state on
# PostgreSQL's clock. A success deletes the row in the transaction that writes its fence, so a row
# found means no success committed; a row deleted while we waited is no row (then FENCE_EXISTS).
LOCK_EXECUTION = """
SELECT e.id, e.status, e.reason,
       e.lease_expires_at > now() AS leased,
       greatest(e.lease_expires_at - now(), interval '0') AS lease_left,
       e.run_at > now() AS not_due,
       greatest(e.run_at - now(), interval '0') AS wait_left,
       EXISTS (SELECT 1 FROM core.processed_jobs AS f WHERE f.job_id = e.job_id AND f.consumer = e.consumer)
         AS fenced,
       -- FAILED by an operator's CLOSE_WITHOUT_TRANSITION (its ledger row carries the execution's
       -- token): the job is settled, another delivery of it is a duplicate, never a dead letter.
       EXISTS (SELECT 1 FROM core.execution_resolutions AS r
                WHERE r.execution_id = e.id AND r.fencing_token = e.fencing_token AND r.status_after = 'FAILED')
         AS closed,
       -- Failed attempts of the final write so far, since its last FAILED (a replay starts again).
       (SELECT count(*) FROM core.execution_events AS v
         WHERE v.execution_id = e.id AND v.kind = 'RETRY_SCHEDULED' AND v.action IS NULL
           AND v.id > coalesce((SELECT max(w.id) FROM core.execution_events AS w
                                 WHERE w.execution_id = e.id AND w.kind = 'FAILED'), 0)) AS final_retries
  FROM core.executions AS e
 WHERE e.job_id = %(job_id)s AND e.consumer = %(consumer)s
   FOR UPDATE OF e
"""

# The fence probe of a take whose lock found no row (a success deleted it while we waited).
FENCE_EXISTS = """
SELECT EXISTS (SELECT 1 FROM core.processed_jobs WHERE job_id = %(job_id)s AND consumer = %(consumer)s)
"""

# A replay of a FAILED execution starts it again: PENDING, its crash-loop count reset.
RESTART_FAILED = """
UPDATE core.executions
   SET status = 'PENDING', takes = 0, reason = NULL, reason_action = NULL, run_at = now()
 WHERE id = %(id)s AND status = 'FAILED'
"""

# A replay keeps the SUCCEEDED checkpoints (never run again, R-3) and forgets the failed attempts.
FORGET_FAILED_CHECKPOINTS = """
DELETE FROM core.execution_checkpoints WHERE execution_id = %(id)s AND status = 'FAILED'
"""

# The take of an existing execution: a new fencing token and a lease; RUNNING → RUNNING is a take-over.
TAKE_EXECUTION = """
UPDATE core.executions
   SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),
       lease_expires_at = now() + %(lease)s::interval, leased_by = %(worker)s, takes = takes + 1
 WHERE id = %(id)s
RETURNING fencing_token, takes
"""

# A take-over's record in the history, with the new token.
RECORD_TAKE_OVER = """
INSERT INTO core.execution_events (execution_id, kind, fencing_token, detail)
VALUES (%(id)s, 'TAKEN_OVER', %(token)s, %(detail)s)
"""

# The checkpoints of an execution in action order, as the take found them.
LOAD_CHECKPOINTS = """
SELECT action, status, attempts, result
  FROM core.execution_checkpoints
 WHERE execution_id = %(id)s
 ORDER BY position
"""

# The first statement of every later transaction of a worker: renew the lease if this worker
# still holds it (locking the row), and write checkpoints (parallel arrays, possibly empty) under
# that same guard. held = 0: stale, roll back.
RENEW_LEASE_AND_RECORD = """
WITH held AS (
    UPDATE core.executions
       SET lease_expires_at = now() + %(lease)s::interval
     WHERE id = %(id)s AND fencing_token = %(token)s AND lease_expires_at > now()
    RETURNING id, fencing_token
), written AS (
    INSERT INTO core.execution_checkpoints AS c
           (execution_id, action, position, effect, status, attempts, result, last_error, fencing_token, finished_at)
    SELECT held.id, k.action, k.position, k.effect, k.status, k.attempts, k.result, k.last_error, held.fencing_token,
           CASE WHEN k.status = 'STARTED' THEN NULL ELSE now() END
      FROM held,
           unnest(%(actions)s::text[], %(positions)s::smallint[], %(effects)s::text[], %(statuses)s::text[],
                  %(attempts)s::integer[], %(results)s::jsonb[], %(errors)s::text[])
           AS k(action, position, effect, status, attempts, result, last_error)
    ON CONFLICT (execution_id, action) DO UPDATE
       SET status = EXCLUDED.status, attempts = EXCLUDED.attempts, result = EXCLUDED.result,
           last_error = coalesce(EXCLUDED.last_error, c.last_error), fencing_token = EXCLUDED.fencing_token,
           started_at = CASE WHEN EXCLUDED.status = 'STARTED' THEN now() ELSE c.started_at END,
           finished_at = EXCLUDED.finished_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM held) AS held, (SELECT count(*) FROM written) AS written
"""

# RETRY_WAIT: the new run_at on PostgreSQL's clock and its RETRY_SCHEDULED record, fenced.
SCHEDULE_RETRY = """
WITH moved AS (
    UPDATE core.executions
       SET status = 'RETRY_WAIT', lease_expires_at = NULL, leased_by = NULL, run_at = now() + %(delay)s::interval
     WHERE id = %(id)s AND fencing_token = %(token)s AND lease_expires_at > now()
    RETURNING id, fencing_token, run_at
)
INSERT INTO core.execution_events (execution_id, kind, action, attempt, fencing_token, run_at, detail)
SELECT id, 'RETRY_SCHEDULED', %(action)s, %(attempt)s, fencing_token, run_at, %(detail)s FROM moved
RETURNING run_at
"""

# FAILED or RECONCILIATION_REQUIRED, with the reason and its record in the history, fenced.
SETTLE_EXECUTION = """
WITH moved AS (
    UPDATE core.executions
       SET status = %(status)s, lease_expires_at = NULL, leased_by = NULL,
           reason = %(reason)s, reason_action = %(action)s
     WHERE id = %(id)s AND fencing_token = %(token)s AND lease_expires_at > now()
    RETURNING id, fencing_token
)
INSERT INTO core.execution_events (execution_id, kind, action, attempt, fencing_token, detail)
SELECT id, %(status)s, %(action)s, %(attempt)s, fencing_token, %(reason)s FROM moved
RETURNING 1
"""

# Success (J-AC8), the first statement of the final transaction: delete the execution (its
# checkpoints and history go with it, ON DELETE CASCADE), fenced, and write the job's fence (J-B1)
# in its place. gone = 0: stale, roll back; fenced = 0: the fence was there already.
FINISH_EXECUTION = """
WITH gone AS (
    DELETE FROM core.executions
     WHERE id = %(id)s AND fencing_token = %(token)s AND lease_expires_at > now()
    RETURNING job_id, consumer, tenant_id
), fenced AS (
    INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
    SELECT job_id, consumer, tenant_id, now() + %(ttl)s::interval FROM gone
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS gone, (SELECT count(*) FROM fenced) AS fenced
"""
