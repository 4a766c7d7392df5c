"""The purge's SQL: every statement written out whole under a name, with what it does and why.

Each can be read, and EXPLAINed, exactly as it is sent (tests/migrations/test_named_sql.py prepares every
one against the migrated schema). Parameters: ``cutoff`` is PostgreSQL's ``now()`` read once per
run; ``protected_from`` is ``cutoff - TTL_MARGIN x max retry window``.

The rule "a dead letter keeps this fence" is written once, in the database: the predicate
``core.holds_fence(dead_letter, protected_from)`` (migration 0008_fence_rule) — true for a dead
letter pending review (it may be replayed), or replayed with its republished delivery
outstanding or handled at or after ``protected_from``. PostgreSQL inlines it, so the plans are
those of the rule spelled out (bench/purge_guard.py measures both). The statements read it in
one of two spellings, chosen per run from how many dead letters hold a fence (``COUNT_HOLDING``
against ``HASHED_PENDING_LIMIT``):

- **hashed** (``NOT IN``): the holders are read once per batch into a hash table that each row
  probes (15 ms against 24 ms per 10 000-row batch with ~600 holders). Exact here: job_id is
  NOT NULL. With more holders than work_mem holds, the plan would degrade to a scan per row, so:
- **probed** (``NOT EXISTS``): an anti-join the planner may run as one index probe per row, for
  any number of holders.

A fence is also kept while its ``(job_id, consumer)`` has a durable execution in any
state but ``FAILED`` — pending, running, waiting for a retry, or RECONCILIATION_REQUIRED: its
work is not finished, and a redelivery must meet that execution, never a missing fence. It is
spelt the same two ways: hashed, ``(job_id, consumer) NOT IN`` the unfinished executions, or
probed, ``NOT EXISTS`` on ``executions_job_consumer_key``. Measured with bench/purge_executions.py
(one 10 000-row batch SELECT, 1 M shuffled fences, held ones at random): 22.7 ms without the rule,
27.3 hashed / 39.1 probed with 1 000 unfinished executions; 26.7, 41.0 / 52.5 with 20 000. The run takes the
hashed spelling only when both the dead letters holding a fence and the unfinished executions
are within ``HASHED_PENDING_LIMIT`` (``COUNT_HOLDING``). Exact: both columns are NOT NULL. A ``FAILED`` execution's future is its dead letter's, which ``core.holds_fence`` already
guards (a replay needs the fence while it is pending, outstanding, or handled just now).
``DELETE_FAILED_EXECUTIONS`` removes the FAILED executions nothing needs any more.
"""

from __future__ import annotations

# Dead letters holding a fence now, and unfinished executions (each holds its fence); decides
# hashed or probed for the run (the larger of the two against HASHED_PENDING_LIMIT).
COUNT_HOLDING = """
SELECT (SELECT count(*) FROM core.dead_letters AS d WHERE core.holds_fence(d, %(protected_from)s)),
       (SELECT count(*) FROM core.executions AS e WHERE e.status <> 'FAILED')"""

# Per batch transaction, sent in the same message as the batch's statement (paths.fetch_limited):
# PostgreSQL runs one message's statements as one implicit transaction, so these ``set_config(…,
# true)`` last exactly as long as the batch's transaction, and the batch costs one round trip.
# The statement timeout; and no wait for the WAL flush at commit: a purge deletion lost in a
# server crash only keeps an expired fence a run longer, which the next run deletes again (a
# fence is never *needed* by its deletion), while a flush per batch cost 1.5-2x the commit
# time in bench/purge_profile.py (thousands of short transactions per large run).
# And no sort: a batch takes the first :batch_size rows in an index's order (expires_at; FAILED
# executions by status_changed_at, id), and the only other plan, a bitmap scan of *every* row in
# the range then a sort, is what the planner picks when it thinks the range holds few rows — on a
# table never analyzed (after a restore or a bulk load: default selectivity 0.5 %) or analyzed
# before a bulk load. Each batch then read all the expired rows: 300 000 fences took 210 s in
# batches shrunk to 100 rows, against under a second analyzed. With sorting disabled the index
# walk is the plan whatever the statistics say, and it stops after :batch_size rows (a statement
# that has no index order to use still sorts: the setting only makes a sort the last resort).
# And no JIT: a disabled sort costs 1e10 in the plan, far above jit_above_cost, so a statement
# that still sorts (auto's sample ranks its rows) was JIT-compiled each time: 80-90 ms of
# compiling for a 14 ms statement (the batches are meant to take ~10 ms; JIT never pays there).
SET_BATCH_LIMITS = """
SELECT set_config('statement_timeout', %(statement_timeout)s, true), set_config('synchronous_commit', 'off', true),
       set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"""

# The row batches (DELETE_FAILED_EXECUTIONS, DELETE_EXPIRED_IDEMPOTENCY_KEYS) add: no sequential
# scan. Their DELETE fetches the rows the inner SELECT chose by ``ctid = ANY (ARRAY(…))``, and the
# planner prices that TID scan at a fixed 10 tuples x random_page_cost (~40: it cannot know the
# array's length), against a sequential scan priced by the table's blocks now. A table of fewer
# than ~25 blocks — as compact as a restore or a bulk load leaves it, or one whose dead versions
# pruning happened to reclaim — made the sequential scan cheaper on paper: the batch read every
# row of the table to delete its 10 (300 FAILED executions: 310 rows read; whether it happened
# depended on the transactions open on the whole server while the rows were written, which decide
# what pruning may reclaim). Disabled, the TID scan is the only path left for the DELETE, and the
# inner SELECT reads only indexes already (its order, its anti-join probe). Not for the fence
# batches: the hashed spelling's NOT IN reads its holders by a sequential scan on purpose.
SET_ROW_BATCH_LIMITS = """
SELECT set_config('statement_timeout', %(statement_timeout)s, true), set_config('synchronous_commit', 'off', true),
       set_config('enable_sort', 'off', true), set_config('jit', 'off', true),
       set_config('enable_seqscan', 'off', true)"""

# Every fence batch is a plain DELETE, its count the command tag's: no ``RETURNING`` into a CTE.
# That spelling (``WITH deleted AS (DELETE … RETURNING …) SELECT count(*) …``) fetched every
# deleted row back for the RETURNING list and stored it in the CTE's tuplestore to count it: on
# 1.2 M deletions the guarded DELETE took 0.61 s plain and 0.87 s through such a CTE, the sweep's
# statement 0.65 s against 0.93 s (bench/purge.py's data, one statement over the whole table).
#
# The batch's transaction time, as the server's clock measured it, is this statement's, sent after
# the DELETE in the same message (paths.delete_limited): from the start of the implicit transaction
# (the limits) to the end of the DELETE. The steering aims it at the target (job.on_the_server):
# the wall time seen by the client adds the round trip and, on a loaded machine, several
# milliseconds of waiting to be scheduled, which no batch size changes — steered on it, batches
# shrank to ~1 300 rows under load and the run took 10x the single DELETE.
TRANSACTION_MS = """
SELECT (extract(epoch FROM clock_timestamp() - transaction_timestamp()) * 1000)::float8"""

# index walk, the end of one batch: the expires_at of the (:batch_size + 1)-th fence from the
# cursor in expiry order (held ones included), or the cutoff when fewer are left — so the range
# [cursor, end) holds at most :batch_size fences. Read along processed_jobs_expires_at_idx alone
# (an index-only scan where the pages are all-visible: ahead of the cursor they usually are), in
# its own statement before the batch's transaction, so that the batch's DELETE is planned with
# both ends of its range as constants. ``end = cursor`` means more than :batch_size fences share
# the cursor's expires_at (one transaction's fences share their ``now()``): INDEX_TIED_BATCH.
INDEX_BATCH_END = """
SELECT coalesce((SELECT p.expires_at FROM core.processed_jobs AS p
                  WHERE p.expires_at >= %(cursor)s::timestamptz
                    AND p.expires_at < %(cutoff)s
                  ORDER BY p.expires_at
                 OFFSET %(batch_size)s LIMIT 1),
                %(cutoff)s::timestamptz)"""

# index walk, one batch (hashed / probed): the deletable fences of [cursor, end), along the
# expires_at index. The range is the only index condition: ``processed_at`` is re-checked
# ``(…) IS TRUE`` (the same filter, NULL being false either way) so that stale statistics can
# never make processed_jobs_processed_at_idx look cheaper and read every old fence. The next
# batch starts at ``end`` (fences tied with it were not in this range).
INDEX_BATCH_HASHED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.expires_at >= %(cursor)s::timestamptz
   AND p.expires_at < %(end)s::timestamptz
   AND p.expires_at < %(cutoff)s
   AND (p.processed_at < %(protected_from)s) IS TRUE
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d
                         WHERE core.holds_fence(d, %(protected_from)s))
   AND (p.job_id, p.consumer) NOT IN (SELECT e.job_id, e.consumer FROM core.executions AS e
                                       WHERE e.status <> 'FAILED')"""

INDEX_BATCH_PROBED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.expires_at >= %(cursor)s::timestamptz
   AND p.expires_at < %(end)s::timestamptz
   AND p.expires_at < %(cutoff)s
   AND (p.processed_at < %(protected_from)s) IS TRUE
   AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))
   AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')"""

# index walk, a batch inside a tie (hashed / probed): more than :batch_size fences expire at the
# cursor's very instant (a bulk load, or one large transaction), so no range ends inside them. Up
# to :batch_size deletable ones of them, chosen by an inner SELECT along the index and deleted by
# ``ctid`` (a TID scan); the walk repeats it until one comes back short, then moves past the
# instant. The DELETE runs in the SELECT's snapshot; a fence updated in between changed its ctid
# and is skipped (the time guards are repeated for such a row, ``IS TRUE`` as above).
INDEX_TIED_BATCH_HASHED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.ctid = ANY (ARRAY(
           SELECT p.ctid
             FROM core.processed_jobs AS p
            WHERE p.expires_at = %(cursor)s::timestamptz
              AND p.expires_at < %(cutoff)s
              AND (p.processed_at < %(protected_from)s) IS TRUE
              AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d
                                    WHERE core.holds_fence(d, %(protected_from)s))
              AND (p.job_id, p.consumer) NOT IN (SELECT e.job_id, e.consumer FROM core.executions AS e
                                                  WHERE e.status <> 'FAILED')
            LIMIT %(batch_size)s))
   AND (p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s) IS TRUE"""

INDEX_TIED_BATCH_PROBED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.ctid = ANY (ARRAY(
           SELECT p.ctid
             FROM core.processed_jobs AS p
            WHERE p.expires_at = %(cursor)s::timestamptz
              AND p.expires_at < %(cutoff)s
              AND (p.processed_at < %(protected_from)s) IS TRUE
              AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))
              AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')
            LIMIT %(batch_size)s))
   AND (p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s) IS TRUE"""

# block sweep, one batch (hashed / probed). A TID range scan reads the blocks
# [:from_block, :to_block) in physical order and deletes the deletable rows among them. The time
# guards are written ``(…) IS TRUE`` (the same filter, NULL being false either way) so that no
# index can serve them: the block range is the only condition an access path can use, whatever
# the statistics. Written plainly, they let statistics that say no row is old enough (analyzed
# before a bulk load of expired fences) make processed_jobs_processed_at_idx look free: each batch
# bitmap-scanned every expired row and kept its block range only as a filter (300 000 fences:
# 25 s in 1 085 batches, against 0.28 s analyzed).
SWEEP_BATCH_HASHED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.ctid >= format('(%%s,0)', %(from_block)s::bigint)::tid
   AND p.ctid < format('(%%s,0)', %(to_block)s::bigint)::tid
   AND (p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s) IS TRUE
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d
                         WHERE core.holds_fence(d, %(protected_from)s))
   AND (p.job_id, p.consumer) NOT IN (SELECT e.job_id, e.consumer FROM core.executions AS e
                                       WHERE e.status <> 'FAILED')"""

SWEEP_BATCH_PROBED = """
DELETE FROM core.processed_jobs AS p
 WHERE p.ctid >= format('(%%s,0)', %(from_block)s::bigint)::tid
   AND p.ctid < format('(%%s,0)', %(to_block)s::bigint)::tid
   AND (p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s) IS TRUE
   AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))
   AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')"""

# Deletable rows the index walk has not passed yet, stopping at :cap so a huge backlog stays cheap:
# along the expires_at index from the cursor (processed_at ``IS TRUE``: never an index condition,
# so stale statistics cannot turn it into a bitmap scan of every old row).
INDEX_ROWS_LEFT = """
SELECT count(*) FROM (
    SELECT 1 FROM core.processed_jobs AS p
     WHERE p.expires_at >= %(cursor)s::timestamptz
       AND p.expires_at < %(cutoff)s
       AND (p.processed_at < %(protected_from)s) IS TRUE
       AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                    WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))
       AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                    WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')
     LIMIT %(cap)s
) AS left_over"""

# Deletable rows in the blocks the sweep has not reached yet, stopping at :cap; from :from_block
# in physical order (the guards ``IS TRUE``, as in the sweep, whatever the statistics).
SWEEP_ROWS_LEFT = """
SELECT count(*) FROM (
    SELECT 1 FROM core.processed_jobs AS p
     WHERE p.ctid >= format('(%%s,0)', %(from_block)s::bigint)::tid
       AND (p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s) IS TRUE
       AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                    WHERE d.job_id = p.job_id AND core.holds_fence(d, %(protected_from)s))
       AND NOT EXISTS (SELECT 1 FROM core.executions AS e
                    WHERE e.job_id = p.job_id AND e.consumer = p.consumer AND e.status <> 'FAILED')
     LIMIT %(cap)s
) AS left_over"""

# The table's size in blocks now, and the planner's rows and pages as of the last VACUUM/ANALYZE.
TABLE_SIZE = """
SELECT pg_relation_size('core.processed_jobs') / current_setting('block_size')::bigint,
       c.reltuples, c.relpages
  FROM pg_class AS c
 WHERE c.oid = 'core.processed_jobs'::regclass"""

# auto's first look, before any sample: the fences expired before the cutoff, counted along the
# expires_at index (an index-only read where the pages are all-visible) and never more than
# :cap of them — the fewest at which the sweep could be estimated cheaper in any layout
# (paths.sweep_floor). Below that the run walks the index and the sample is not read: the steady
# state (~1 % expired) spent ~12 % of its run on the sample (docs/performance.md). Held fences are
# counted too: an upper bound of the deletable ones, so it can only send a run on to the sample.
EXPIRED_UP_TO = """
SELECT count(*) FROM (
    SELECT 1 FROM core.processed_jobs AS p
     WHERE p.expires_at < %(cutoff)s
     LIMIT %(cap)s
) AS expired"""

# auto's estimates, read from a random sample of whole pages (SYSTEM sampling reads only the chosen
# pages), in one pass: the rows sampled, the deletable ones among them (the time guards; the fence
# holders are left out, too few to change the choice), and the physical order of expires_at —
# computed like ANALYZE's correlation, the correlation of the rows' ranks in physical order with
# their ranks in expires_at order (a rank correlation, so a gap in the values, such as a backlog
# expired days ago beside fresh rows, does not read as disorder); NULL for fewer than two rows.
# Always from the sample, never from pg_stats: statistics may be missing (never analyzed) or
# describe another table (analyzed before a bulk load, a reshuffle, a mass delete), and a stale
# correlation picked the wrong path (0.01 from pg_stats for a table whose sample gives 0.95).
SAMPLE_ESTIMATES = """
SELECT count(*), count(*) FILTER (WHERE deletable), corr(physical, logical) FROM (
    SELECT p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s AS deletable,
           row_number() OVER (ORDER BY p.ctid) AS physical, row_number() OVER (ORDER BY p.expires_at) AS logical
      FROM core.processed_jobs AS p TABLESAMPLE SYSTEM (%(percent)s::real)
) AS ranked"""

# FAILED executions nothing needs any more, up to :batch_size per call (oldest first, along
# executions_status_idx): failed before :failed_before (cutoff - PROCESSED_JOBS_TTL, the time a
# fence written at the failure would have lived, which the guard holds >= margin x retry window),
# and no dead letter of the job (for this consumer, or naming none) holds a fence — none pending
# review, no replay outstanding or handled within the window. The DELETE re-checks the state and
# the age: a replay that moved the execution to PENDING meanwhile is skipped (and the database
# refuses to delete anything but a FAILED or RUNNING execution). Checkpoints and history go with it.
# By ctid, like the index walk, with the re-check ``IS TRUE`` (never an index condition): a TID
# scan fetches exactly the chosen rows, where ``id = ANY`` and a plain re-check let a planner
# without statistics re-read every FAILED execution along executions_status_idx for each batch.
# Sent under SET_ROW_BATCH_LIMITS (no sequential scan: the TID scan is the DELETE's only path).
DELETE_FAILED_EXECUTIONS = """
WITH deleted AS (
    DELETE FROM core.executions AS e
     WHERE e.ctid = ANY (ARRAY(
               SELECT e.ctid
                 FROM core.executions AS e
                WHERE e.status = 'FAILED'
                  AND e.status_changed_at < %(failed_before)s
                  AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                    WHERE d.job_id = e.job_id AND (d.consumer IS NULL OR d.consumer = e.consumer)
                      AND core.holds_fence(d, %(protected_from)s))
                ORDER BY e.status_changed_at, e.id
                LIMIT %(batch_size)s))
       AND (e.status = 'FAILED' AND e.status_changed_at < %(failed_before)s) IS TRUE
    RETURNING 1
)
SELECT count(*) FROM deleted"""

# The operations API's idempotency keys recorded before :kept_from (cutoff - retention), up to
# :batch_size per call, oldest first along api_idempotency_keys_created_idx; by ctid with the
# re-check ``IS TRUE``, like the other batches, whatever the statistics; under SET_ROW_BATCH_LIMITS,
# whatever the table's size. Only this ledger: the
# resolution keys live in the append-only core.execution_resolutions and stay.
DELETE_EXPIRED_IDEMPOTENCY_KEYS = """
WITH deleted AS (
    DELETE FROM core.api_idempotency_keys AS k
     WHERE k.ctid = ANY (ARRAY(
               SELECT k.ctid
                 FROM core.api_idempotency_keys AS k
                WHERE k.created_at < %(kept_from)s
                ORDER BY k.created_at
                LIMIT %(batch_size)s))
       AND (k.created_at < %(kept_from)s) IS TRUE
    RETURNING 1
)
SELECT count(*) FROM deleted"""

# The batch statement of each walk, by spelling of the fence-hold rule.
INDEX_BATCH = {"hashed": INDEX_BATCH_HASHED, "probed": INDEX_BATCH_PROBED}
INDEX_TIED_BATCH = {"hashed": INDEX_TIED_BATCH_HASHED, "probed": INDEX_TIED_BATCH_PROBED}
SWEEP_BATCH = {"hashed": SWEEP_BATCH_HASHED, "probed": SWEEP_BATCH_PROBED}
