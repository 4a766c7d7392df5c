"""The purge: deletes expired ``core.processed_jobs`` fences in short batches.

Run it with ``core-jobs run-once purge`` (or on the scheduler). A fence is deleted only when
all four hold, with ``cutoff`` = PostgreSQL's ``now()`` read once at the start of the run:

1. ``expires_at < cutoff`` — its TTL has passed;
2. ``processed_at < cutoff - TTL_MARGIN x max retry window`` — no retry or broker redelivery
   can still arrive for it, even if a misconfigured consumer wrote a too-short ``expires_at``
   (J-AC6);
3. no dead letter of the same ``job_id`` holds it — the predicate ``core.holds_fence`` (migration
   0008_fence_rule), the rule written once (index ``dead_letters_pending_job_idx``, and
   ``dead_letters_replay_hold_idx``):

   - ``pending_review``: a replay needs the fence, or it would apply the work twice;
   - replayed and *outstanding* (``replay_outcome`` NULL): the republished delivery has not been
     handled yet — it may wait in a backlog for any time, and be retried; the fence is kept
     until the harness marks it processed, duplicate or dead-lettered again, which it does in
     that outcome's own transaction, whatever the broker (harness/queue/port.py, "Replays");
   - replayed and handled less than ``TTL_MARGIN x max retry window`` before ``cutoff``
     (``replay_handled_at``, stamped by the database): as after any processing, a lost ack or a
     broker redelivery may bring the delivery back that long.

   Discarded dead letters, and replays handled (or released by an operator) longer ago than
   that, do not hold a fence. A replay whose message is lost for good (a broker that dropped it)
   stays outstanding and keeps its fences until an operator releases it (``core-jobs
   dead-letters release ID --reason``).
4. no durable execution of the same ``(job_id, consumer)`` is unfinished (any state but
   ``FAILED``: PENDING, RUNNING, RETRY_WAIT, RECONCILIATION_REQUIRED) — a redelivery must meet
   it, never a missing fence. A FAILED execution's future is its dead letter's, which rule 3
   already guards; a discarded one needs no fence to stay failed.

FAILED executions nothing needs any more are deleted by the same run, after the fences
(``executions_deleted``, sql.DELETE_FAILED_EXECUTIONS): failed more than
``CORE_JOBS_PROCESSED_JOBS_TTL`` before ``cutoff`` (as long as a fence written at the failure
would live) and no dead letter of the job holding a fence by rule 3. RECONCILIATION_REQUIRED
executions are never deleted (the database refuses it too). docs/purge.md says why.

Races with a batch: each batch decides in one statement, on one snapshot. Every change that
ends a hold commits together with the state that takes over: a replay commits the message and
``replayed`` together, a handled delivery its outcome and the mark (a dead letter written again
is itself pending). So a batch whose snapshot predates the change sees the old holder (pending,
or outstanding), and one after it the new (outstanding, or handled just now — inside the
window); a replay committing while the batch runs is seen as still pending and holds the fence
too. No fence is deleted while any holder exists.

Before touching anything, the job refuses to run (exit 2, nothing deleted) when
``CORE_JOBS_PROCESSED_JOBS_TTL`` is shorter than ``CORE_JOBS_TTL_MARGIN`` x the maximum retry
window of every configured retry policy plus ``CORE_JOBS_BROKER_REDELIVERY_HORIZON`` (J-B7);
the message shows TTL, window and margin and what to change (``core-jobs check-config``
shows the same computation).

How it deletes
--------------
Each batch is its own transaction with ``SET LOCAL statement_timeout`` and asynchronous commit;
a crash leaves only whole batches deleted and the next run continues. Once per run, before the
first batch, the run picks one of two access paths (``maintenance/jobs/purge/paths.py``; both apply
the same guards, so they delete the same rows):

- ``index``: walks the ``expires_at`` index in order and deletes each batch by ``ctid``,
  carrying a cursor on ``expires_at``, so no batch rescans what an earlier one passed. It reads
  only expired rows; the run ends when a batch comes back short. When the rows lie in random
  physical order each batch touches thousands of scattered pages (slow, long transactions).
- ``sweep``: walks the heap in ranges of whole blocks (a TID range scan), each about
  ``batch size`` rows (blocks = batch size / rows per page from ``pg_class``, at least 1),
  carrying the next block number; the run ends when it passes the table's size read at the
  start (rows inserted later are not expired). It reads every page once, whatever the layout.

With ``CORE_JOBS_PURGE_STRATEGY=auto`` (the default) the run samples ~1 % of the pages
(``TABLESAMPLE SYSTEM``, at least 200, at most 2 000) for the fraction of deletable rows and the
physical correlation of ``expires_at`` (the sampled rows ranked in physical and in expiry order,
as ANALYZE computes it; never ``pg_stats``, which may be missing or stale), estimates each path's time from
per-row costs measured with ``bench/purge.py``, and takes the sweep only when it is estimated at
least 10 % faster: when many rows have expired and they lie scattered (in random order from ~3 %
expired; in expiry order only past ~64 %). The decision is logged as
``maintenance.purge.strategy_chosen``.

Without current statistics — none (a restore, a bulk load before autovacuum) or stale (analyzed
before a bulk load) — the plans stay the same: each batch runs with ``enable_sort`` off and
writes its time guards ``(...) IS TRUE`` wherever an index could serve them, so the index walk
follows the expires_at index, stops after its rows and deletes by ``ctid``, and the sweep reads
only its block range (sql.SET_BATCH_LIMITS, sql.SWEEP_BATCH_HASHED say why; before, 300 000
fences took 210 s never analyzed, 25 s with stale statistics). The purge does not ANALYZE: only
the owner may.

Batch size
----------
Each batch aims at ``CORE_JOBS_PURGE_TARGET_BATCH_DURATION`` of wall time, because the same
number of rows can take 1 ms or 100 ms: in expiry order a 10 000-row batch reads a few hundred
pages, scattered it reads 10 000. A run starts slow, with min(batch size, 1 000) rows
(``SLOW_START_BATCH_SIZE``), and after each batch steers: a batch slower than the target
shrinks the next in proportion (target / took), one faster than half the target doubles it;
never above ``CORE_JOBS_PURGE_BATCH_SIZE`` (the largest batch) nor below
``CORE_JOBS_PURGE_MIN_BATCH_SIZE``. The sweep's block range follows the batch size. Statement
timeouts are the emergency brake on top: they halve the batch and cap it there for the rest of
the run. Whatever the size, the index walk ends on a batch that deleted fewer rows than that
batch's own limit.

The dead letters holding a fence are checked through a hash of their job_ids when there are at most
50 000 of them (the common case; 15 ms instead of 24 ms per 10 000-row batch), else by one
index probe per row. Only one run works at a time: it holds the advisory lock
``core_jobs.purge`` on its own connection; a second run logs ``maintenance.purge.skipped`` and
exits 0.

Options (environment variables; durations are ISO-8601 or seconds)
-----------------------------------------------------------------
- ``CORE_JOBS_PURGE_BATCH_SIZE``            rows, default 10000: the largest batch.
- ``CORE_JOBS_PURGE_MIN_BATCH_SIZE``        rows, default 100: the batch size never shrinks below
  this (nor shrinks at all when the batch size is already smaller).
- ``CORE_JOBS_PURGE_TARGET_BATCH_DURATION`` duration, default PT0.01S: the wall time each batch
  transaction aims at (above). Batches then take 5-10 ms; single batches were measured at up
  to twice their neighbours (I/O, checkpoints), so the longest stays under NF-6's 25 ms
  (at PT0.02S it reached 28-35 ms).
- ``CORE_JOBS_PURGE_TIMEOUTS_BEFORE_SHRINK`` count, default 2: consecutive statement timeouts
  after which the batch size is halved and capped there for the run (as River's JobCleaner does). At the minimum size,
  that many more timeouts stop the run with ok=false (exit 1); the next run starts afresh.
- ``CORE_JOBS_PURGE_STATEMENT_TIMEOUT``     duration, default PT5S: statement_timeout of a batch.
- ``CORE_JOBS_PURGE_BATCH_PAUSE``           duration, default PT0S: pause between batches.
- ``CORE_JOBS_PURGE_MAX_RUNTIME``           duration, default PT5M: time budget; no batch starts
  after it, the run stops cleanly with ``stopped_on_budget=1`` and reports ``rows_left``.
- ``CORE_JOBS_PURGE_STRATEGY``              ``auto`` | ``index`` | ``sweep``, default auto: the
  access path (above); ``index`` or ``sweep`` forces one and skips auto's sample.
- ``CORE_JOBS_PURGE_PROGRESS_INTERVAL``     duration, default PT5S: a long run logs
  ``maintenance.purge.progress`` at info this often (on the run's monotonic clock).
- ``CORE_JOBS_IDEMPOTENCY_KEY_RETENTION``   duration, default P30D, at least P1D: the operations
  API's idempotency keys (``core.api_idempotency_keys``) recorded longer than this before
  ``cutoff`` are deleted, last, in batches of the batch size (a shorter retention would let a
  client's retry run its action again). Resolution keys (append-only
  ``core.execution_resolutions``) are never deleted.
- ``CORE_JOBS_PROCESSED_JOBS_TTL``, ``CORE_JOBS_TTL_MARGIN``, ``CORE_JOBS_RETRY_*``,
  ``CORE_JOBS_BROKER_REDELIVERY_HORIZON``: the guard above.

Events and metrics
------------------
``maintenance.purge.start`` / ``.stop`` / ``.error`` (from the runner) carry these fixed
numeric keys, all 0 on error; the metrics job exports them:

- ``num_deleted``        fences deleted by this run;
- ``num_batches``        batches committed (a batch that deleted nothing counts too);
- ``num_timeouts``       batches cancelled by the statement timeout (rolled back, retried);
- ``rows_left``          deletable fences left when the run stopped early (budget, SIGTERM
                         or gave_up) past the walk's position (expires_at cursor, or next
                         block), counted exactly up to ``ROWS_LEFT_CAP`` (100 000; the
                         value then means "at least"); 0 when the run finished; -1 when the
                         count itself hit the statement timeout;
- ``stopped_on_budget``  1 when the time budget ended the run;
- ``stopped_on_signal``  1 when a SIGTERM (``serve`` or ``run-once`` being stopped) ended the
                         run after the batch in hand; the next run carries on;
- ``skipped``            1 when another run held the lock (nothing was done);
- ``gave_up``            1 when timeouts persisted at the minimum batch size (ok=false);
- ``longest_batch_ms``   wall time of the longest batch transaction, commit included;
- ``batch_size``         the batch size at the end of the run, as steered after its last
                         batch (toward the target duration; halved by timeouts);
- ``used_sweep``         1 when the run swept block ranges, 0 when it walked the index;
- ``executions_deleted`` FAILED executions deleted (nothing needed them any more);
- ``idempotency_keys_deleted`` operations-API idempotency keys older than the retention, deleted.

Per run, info: ``maintenance.purge.strategy_chosen`` (``strategy``, ``setting``, ``reason``,
``expired_fraction``, ``sampled_rows``, ``correlation`` — null when not measured —,
``table_blocks``, ``rows_per_page``, ``estimated_index_s``, ``estimated_sweep_s``,
``pending_dead_letters`` — those holding a fence: pending, outstanding replays, replays handled
within the window —, ``unfinished_executions`` — executions not FAILED, each holding its
fence —, ``estimate_ms``). Every ``CORE_JOBS_PURGE_PROGRESS_INTERVAL`` of a long run, info:
``maintenance.purge.progress`` (``rows_deleted``, ``rate`` rows/s, ``rows_left_estimate`` and
``estimate_left_s`` — index walk: auto's sampled estimate less the deleted, null when forced;
sweep: rows per block so far over the blocks left —, ``elapsed_s``, ``num_batches``,
``batch_size``, ``strategy``). Per batch:
``maintenance.purge.batch_deleted`` (debug; ``num_deleted``, ``batch_ms``, ``batch_size``,
``strategy``, and for the sweep ``from_block``, ``to_block``). Warnings:
``maintenance.purge.statement_timeout``, ``maintenance.purge.batch_shrunk``,
``maintenance.purge.stopped_on_budget``, ``maintenance.purge.stopped_on_signal``,
``maintenance.purge.rows_left_timeout``,
``maintenance.purge.estimates_timeout`` (the table was locked while auto estimated: index);
error: ``maintenance.purge.gave_up``; info: ``maintenance.purge.skipped``.
"""

# The parts, the same in every job: config.py (defaults, PurgeConfig), sql.py (the named SQL),
# paths.py (the two access paths), job.py (Purger.run_once -> PurgeResult, and SPEC).
