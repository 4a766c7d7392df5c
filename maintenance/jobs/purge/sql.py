"""The purge's SQL, each statement under a name with what it does and why; EXPLAIN them as they stand.

The time guards and the replay guard are fragments shared by the batch statements of both
access paths (paths.py fills them in), so both paths delete exactly the same rows."""

from __future__ import annotations

# The time guards. :cutoff is PostgreSQL's now() read once per run; :protected_from is
# cutoff - margin x retry window, so a fence written with a too-short expires_at survives.
TIME_GUARDS = """
       p.expires_at < %(cutoff)s
   AND p.processed_at < %(protected_from)s"""

# The replay guard: a pending dead letter may still be replayed, so its fence must stay. A
# replayed one holds it too while its republished delivery is *outstanding* (replay_outcome NULL:
# not yet processed, found a duplicate or dead-lettered again — the harness marks that in the
# outcome's own transaction), however long it waits; and then for margin x retry window after it
# was handled (replay_handled_at, stamped by the database), as a fence is kept after it is
# processed: a lost ack or a broker redelivery may still bring the delivery back. Without it, a
# fence processed long ago would be deleted under a redelivery of a replay found a duplicate.
# Two equivalent spellings; the run picks one from the number of dead letters holding a fence:
# - hashed: PostgreSQL reads the holding job_ids once per batch (the partial indexes
#   dead_letters_pending_job_idx, and dead_letters_replay_hold_idx from its tail: the NULLs, then
#   the recent stamps) into a hash table and probes it per row. Measured 15 ms vs 24 ms per
#   10 000-row batch with ~600 pending. NOT IN is exact here: job_id is NOT NULL. With too many
#   for work_mem the plan would turn into a scan per row, hence:
# - probed: one probe of dead_letters_job_id_idx per row, for any number.
REPLAY_GUARD = {
    "hashed": """
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE d.status = 'pending_review'
                        UNION ALL
                        SELECT d.job_id FROM core.dead_letters AS d
                         WHERE d.status = 'replayed' AND d.replay_handled_at IS NULL
                        UNION ALL
                        SELECT d.job_id FROM core.dead_letters AS d
                         WHERE d.status = 'replayed' AND d.replay_handled_at >= %(protected_from)s)""",
    "probed": """
   AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                    WHERE d.job_id = p.job_id
                      AND (d.status = 'pending_review'
                           OR (d.status = 'replayed'
                               AND (d.replay_handled_at IS NULL OR d.replay_handled_at >= %(protected_from)s))))""",
}

# Dead letters holding a fence: pending, replayed and outstanding, or replayed and handled within margin x retry window.
COUNT_HOLDING = """
SELECT (SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review')
     + (SELECT count(*) FROM core.dead_letters WHERE status = 'replayed' AND replay_handled_at IS NULL)
     + (SELECT count(*) FROM core.dead_letters WHERE status = 'replayed' AND replay_handled_at >= %(protected_from)s)"""

# Per batch transaction: the statement timeout, and no wait for the WAL flush at commit — a
# server crash may undo the last few batches, which the next run simply deletes again.
SET_BATCH_LIMITS = """
SELECT set_config('statement_timeout', %s, true), set_config('synchronous_commit', 'off', true)"""

# index: one batch. The inner SELECT walks processed_jobs_expires_at_idx from the cursor in
# expiry order and picks the physical addresses (ctid) of up to :batch_size deletable rows; the
# DELETE fetches exactly those tuples (a TID scan). It runs in the same snapshot as the SELECT,
# so the guards need no second check; the time guards are repeated only because a row updated
# concurrently is re-checked against them (and then skipped: its ctid changed). The largest
# expires_at deleted is the next batch's cursor (">=": rows tied with it may not all have fit).
INDEX_BATCH = """
WITH deleted AS (
    DELETE FROM core.processed_jobs AS p
     WHERE p.ctid = ANY (ARRAY(
               SELECT p.ctid
                 FROM core.processed_jobs AS p
                WHERE p.expires_at >= %(cursor)s::timestamptz
                  AND {deletable}
                ORDER BY p.expires_at
                LIMIT %(batch_size)s))
       AND {time_guards}
    RETURNING p.expires_at
)
SELECT count(*), max(expires_at) FROM deleted"""

# sweep: one batch. A TID range scan reads the blocks [:from_block, :to_block) in physical
# order and deletes the deletable rows among them; nothing else is read.
SWEEP_BATCH = """
WITH deleted AS (
    DELETE FROM core.processed_jobs AS p
     WHERE p.ctid >= format('(%%s,0)', %(from_block)s::bigint)::tid
       AND p.ctid < format('(%%s,0)', %(to_block)s::bigint)::tid
       AND {deletable}
    RETURNING 1
)
SELECT count(*), NULL FROM deleted"""

# How many deletable rows remain past a walk's position, stopping at :cap so a huge backlog
# stays cheap. {position} is the walk's "not passed yet" predicate.
COUNT_ROWS_LEFT = """
SELECT count(*) FROM (
    SELECT 1 FROM core.processed_jobs AS p
     WHERE {position}
       AND {deletable}
     LIMIT %(cap)s
) AS left_over"""

# The table's size in blocks now, and the planner's rows and pages as of the last VACUUM/ANALYZE.
TABLE_SIZE = """
SELECT pg_relation_size('core.processed_jobs') / current_setting('block_size')::bigint,
       c.reltuples, c.relpages
  FROM pg_class AS c
 WHERE c.oid = 'core.processed_jobs'::regclass"""

# auto's estimate of the deletable fraction: the time guards counted over a random sample of
# whole pages (SYSTEM sampling reads only the chosen pages). The replay guard is left out: the
# pending dead letters are too few to change the choice.
SAMPLE_EXPIRED = f"""
SELECT count(*), count(*) FILTER (WHERE {TIME_GUARDS})
  FROM core.processed_jobs AS p TABLESAMPLE SYSTEM (%(percent)s::real)"""

# auto's estimate of the physical order: +-1 when the heap is in expires_at order, ~0 when random.
EXPIRES_AT_CORRELATION = """
SELECT correlation FROM pg_stats
 WHERE schemaname = 'core' AND tablename = 'processed_jobs' AND attname = 'expires_at'"""

# Every guard, in the spelling that holds for any number of pending dead letters.
DELETABLE = TIME_GUARDS + REPLAY_GUARD["probed"]

INDEX_POSITION = "p.expires_at >= %(cursor)s::timestamptz"

SWEEP_POSITION = "p.ctid >= format('(%%s,0)', %(from_block)s::bigint)::tid"
