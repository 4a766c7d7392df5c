"""The purge: deletes expired ``core.processed_jobs`` fences in short batches (issue 3).

Run it with ``core-jobs run-once purge`` (or on the scheduler). A fence is deleted only when
all three hold, with ``cutoff`` = PostgreSQL's ``now()`` read once at the start of the run:

1. ``expires_at < cutoff`` — its TTL has passed;
2. ``processed_at < cutoff - TTL_MARGIN x max retry window`` — no retry or broker redelivery
   can still arrive for it, even if a misconfigured consumer wrote a too-short ``expires_at``
   (J-AC6);
3. no dead letter of the same ``job_id`` holds it (index ``dead_letters_pending_job_idx``, and
   ``dead_letters_replay_hold_idx``):

   - ``pending_review``: a replay needs the fence, or it would apply the work twice;
   - replayed and *outstanding* (``replay_outcome`` NULL): the republished delivery has not been
     handled yet — it may wait in a backlog for any time, and be retried; the fence is kept
     until the harness marks it processed, duplicate or dead-lettered again, which it does in
     that outcome's own transaction, whatever the broker (harness/queue.py, "Replays");
   - replayed and handled less than ``TTL_MARGIN x max retry window`` before ``cutoff``
     (``replay_handled_at``, stamped by the database): as after any processing, a lost ack or a
     broker redelivery may bring the delivery back that long.

   Discarded dead letters, and replays handled (or released by an operator) longer ago than
   that, do not hold a fence. A replay whose message is lost for good (a broker that dropped it)
   stays outstanding and keeps its fences until an operator releases it (``core-jobs
   dead-letters release ID --reason``).

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
(``TABLESAMPLE SYSTEM``, at least 200, at most 2 000) for the fraction of deletable rows and reads the
physical correlation of ``expires_at`` from ``pg_stats``, estimates each path's time from
per-row costs measured with ``bench/purge.py``, and takes the sweep only when it is estimated at
least 10 % faster: when many rows have expired and they lie scattered (in random order from ~3 %
expired; in expiry order only past ~64 %). It walks the index when the table has never been
analyzed. The decision is logged as ``maintenance.purge.strategy_chosen``.

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
  to twice their neighbours (I/O, checkpoints), so the longest stays under the issue's 25 ms
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
- ``CORE_JOBS_PROCESSED_JOBS_TTL``, ``CORE_JOBS_TTL_MARGIN``, ``CORE_JOBS_RETRY_*``,
  ``CORE_JOBS_BROKER_REDELIVERY_HORIZON``: the guard above.

Events and metrics
------------------
``maintenance.purge.start`` / ``.stop`` / ``.error`` (from the runner) carry these fixed
numeric keys, all 0 on error; the metrics issue exports them:

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
- ``used_sweep``         1 when the run swept block ranges, 0 when it walked the index.

Per run, info: ``maintenance.purge.strategy_chosen`` (``strategy``, ``setting``, ``reason``,
``expired_fraction``, ``sampled_rows``, ``correlation`` — null when not measured —,
``table_blocks``, ``rows_per_page``, ``estimated_index_s``, ``estimated_sweep_s``,
``pending_dead_letters`` — those holding a fence: pending, outstanding replays, replays handled
within the window —, ``estimate_ms``). Per batch:
``maintenance.purge.batch_deleted`` (debug; ``num_deleted``, ``batch_ms``, ``batch_size``,
``strategy``, and for the sweep ``from_block``, ``to_block``). Warnings:
``maintenance.purge.statement_timeout``, ``maintenance.purge.batch_shrunk``,
``maintenance.purge.stopped_on_budget``, ``maintenance.purge.stopped_on_signal``,
``maintenance.purge.rows_left_timeout``,
``maintenance.purge.estimates_timeout`` (the table was locked while auto estimated: index);
error: ``maintenance.purge.gave_up``; info: ``maintenance.purge.skipped``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors

from harness.pg import advisory_lock
from maintenance.jobs.base import JobSpec
from maintenance.jobs.purge.paths import (
    COUNT_HOLDING,
    HASHED_PENDING_LIMIT,
    STRATEGIES,
    BlockSweep,
    IndexWalk,
    choose,
    fetch_limited,
    read_estimates,
)
from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger
from maintenance.runtime.signals import stop_requested
from maintenance.settings import ConfigError, Settings, TtlGuard, format_duration

LOCK_NAME = "core_jobs.purge"
EVENTS = "maintenance.purge"
# rows_left is an exact count up to this many rows; at the cap it means "at least this many".
ROWS_LEFT_CAP = 100_000
# Slow start: each run's first batch is at most this many rows; the size then steers toward
# the target batch duration (see "Batch size").
SLOW_START_BATCH_SIZE = 1_000

# The demo's account of the fences a run kept, by the rule that kept them.
COUNT_KEPT = """
SELECT count(*) FILTER (WHERE p.expires_at >= %(cutoff)s)                                AS not_expired,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at >= %(protected_from)s) AS inside_window,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s
                          AND EXISTS (SELECT 1 FROM core.dead_letters d
                                       WHERE d.job_id = p.job_id
                                         AND (d.status = 'pending_review'
                                              OR (d.status = 'replayed' AND (d.replay_handled_at IS NULL
                                                                             OR d.replay_handled_at >= %(protected_from)s)))))
                                                                                             AS pending_dead_letter
  FROM core.processed_jobs AS p"""


def _setting_default(name: str) -> Any:
    return Settings.model_fields[name].default


# --- 1. config ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PurgeConfig:
    """What one purge run does; defaults are the settings' (see the module docstring)."""

    guard: TtlGuard  # TTL, margin and the max retry window (J-B7)
    batch_size: int = _setting_default("purge_batch_size")  # rows, 10 000: the largest batch
    min_batch_size: int = _setting_default("purge_min_batch_size")  # rows, 100
    target_batch_duration: timedelta = _setting_default("purge_target_batch_duration")  # PT0.01S
    slow_start_batch_size: int = SLOW_START_BATCH_SIZE  # rows: the first batch is min(this, batch_size)
    timeouts_before_shrink: int = _setting_default("purge_timeouts_before_shrink")  # count, 2
    statement_timeout: timedelta = _setting_default("purge_statement_timeout")  # PT5S
    batch_pause: timedelta = _setting_default("purge_batch_pause")  # PT0S
    max_runtime: timedelta = _setting_default("purge_max_runtime")  # PT5M
    strategy: str = _setting_default("purge_strategy")  # auto | index | sweep
    # Pending dead letters up to which the replay guard is a hash (see HASHED_PENDING_LIMIT).
    hashed_pending_limit: int = HASHED_PENDING_LIMIT

    @classmethod
    def from_settings(cls, settings: Settings) -> PurgeConfig:
        return cls(
            guard=settings.ttl_guard(),
            batch_size=settings.purge_batch_size,
            min_batch_size=settings.purge_min_batch_size,
            target_batch_duration=settings.purge_target_batch_duration,
            timeouts_before_shrink=settings.purge_timeouts_before_shrink,
            statement_timeout=settings.purge_statement_timeout,
            batch_pause=settings.purge_batch_pause,
            max_runtime=settings.purge_max_runtime,
            strategy=settings.purge_strategy,
        )


# --- result ---------------------------------------------------------------------------------
@dataclass
class PurgeResult:
    """One run's outcome. ``fields()`` are the fixed numeric keys of the stop event."""

    num_deleted: int = 0
    num_batches: int = 0
    num_timeouts: int = 0
    rows_left: int = 0
    stopped_on_budget: int = 0
    stopped_on_signal: int = 0
    skipped: int = 0
    gave_up: int = 0
    longest_batch_ms: float = 0.0
    batch_size: int = 0
    used_sweep: int = 0
    # Not event fields: the cutoffs this run used and why it took its path, for the demo's account.
    cutoff: datetime | None = field(default=None, repr=False)
    protected_from: datetime | None = field(default=None, repr=False)
    strategy_reason: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return not self.gave_up

    def fields(self) -> dict[str, Any]:
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["longest_batch_ms"] = round(self.longest_batch_ms, 1)
        return shown


def zero_fields() -> dict[str, Any]:
    return PurgeResult().fields()


# --- 2. constructor that validates; 3. run_once -------------------------------------------------
class Purger:
    """Deletes expired fences in batches; see the module docstring."""

    def __init__(
        self,
        config: PurgeConfig,
        db: Database,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        should_stop: Callable[[], bool] = stop_requested,
        batch_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        guard = config.guard
        if not guard.ok:
            raise ConfigError(f"purge refused, nothing deleted: {guard.explain()}")
        # The settings enforce these too; a PurgeConfig built in code gets the same names.
        checks = (
            (config.batch_size >= 1, "CORE_JOBS_PURGE_BATCH_SIZE must be at least 1"),
            (config.min_batch_size >= 1, "CORE_JOBS_PURGE_MIN_BATCH_SIZE must be at least 1"),
            (config.slow_start_batch_size >= 1, "the slow start batch size must be at least 1"),
            (config.target_batch_duration > timedelta(0), "CORE_JOBS_PURGE_TARGET_BATCH_DURATION must be positive"),
            (config.timeouts_before_shrink >= 1, "CORE_JOBS_PURGE_TIMEOUTS_BEFORE_SHRINK must be at least 1"),
            (config.statement_timeout > timedelta(0), "CORE_JOBS_PURGE_STATEMENT_TIMEOUT must be positive"),
            (config.batch_pause >= timedelta(0), "CORE_JOBS_PURGE_BATCH_PAUSE must not be negative"),
            (config.max_runtime > timedelta(0), "CORE_JOBS_PURGE_MAX_RUNTIME must be positive"),
            (config.strategy in STRATEGIES, f"CORE_JOBS_PURGE_STRATEGY must be one of {', '.join(STRATEGIES)}"),
        )
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))
        self.config = config
        self.db = db
        self._monotonic = monotonic
        self._sleep = sleep
        self._should_stop = should_stop
        self._batch_clock = batch_clock
        self._log = get_logger(job="purge")

    def run_once(self, now: datetime) -> PurgeResult:
        """Delete what may be deleted at ``now`` (PostgreSQL's clock), within the time budget."""
        cfg = self.config
        deadline = self._monotonic() + cfg.max_runtime.total_seconds()
        result = PurgeResult(
            batch_size=min(cfg.batch_size, max(cfg.min_batch_size, cfg.slow_start_batch_size)),
            cutoff=now,
            protected_from=now - cfg.guard.required,
        )
        with self.db.connect(autocommit=True) as lock_conn, advisory_lock(lock_conn, LOCK_NAME) as acquired:
            if not acquired:
                result.skipped = 1
                self._log.info(f"{EVENTS}.skipped", reason="another purge run holds the lock", lock=LOCK_NAME)
                return result
            with self.db.connect(autocommit=True) as conn:
                self._delete_batches(conn, result, deadline)
        return result

    def _delete_batches(self, conn: psycopg.Connection, result: PurgeResult, deadline: float) -> None:
        cfg = self.config
        params: dict[str, Any] = {"cutoff": result.cutoff, "protected_from": result.protected_from}
        timeout = f"{max(1, round(cfg.statement_timeout.total_seconds() * 1000))}ms"
        walk, result.strategy_reason = self._choose_walk(conn, params, timeout)
        result.used_sweep = int(walk.name == "sweep")
        timeouts_in_a_row = 0
        # The largest batch of this run: CORE_JOBS_PURGE_BATCH_SIZE until timeouts shrink it.
        ceiling = cfg.batch_size
        while True:
            if self._monotonic() >= deadline:
                result.stopped_on_budget = 1
                result.rows_left = self._rows_left(conn, walk, params, timeout)
                self._log.warning(
                    f"{EVENTS}.stopped_on_budget",
                    rows_left=result.rows_left,
                    max_runtime=format_duration(cfg.max_runtime),
                )
                return
            if self._should_stop():  # SIGTERM: the batch in hand is done, start no other
                result.stopped_on_signal = 1
                result.rows_left = self._rows_left(conn, walk, params, timeout)
                self._log.warning(f"{EVENTS}.stopped_on_signal", rows_left=result.rows_left)
                return
            started = self._batch_clock()
            try:
                batch = walk.batch(conn, timeout, params, result.batch_size)
            except errors.QueryCanceled:
                result.num_timeouts += 1
                timeouts_in_a_row += 1
                self._log.warning(
                    f"{EVENTS}.statement_timeout", batch_size=result.batch_size, timeouts_in_a_row=timeouts_in_a_row
                )
                if timeouts_in_a_row < cfg.timeouts_before_shrink:
                    continue
                if not self._shrink(result):
                    result.gave_up = 1
                    result.rows_left = self._rows_left(conn, walk, params, timeout)
                    self._log.error(
                        f"{EVENTS}.gave_up",
                        batch_size=result.batch_size,
                        num_timeouts=result.num_timeouts,
                        rows_left=result.rows_left,
                    )
                    return
                timeouts_in_a_row = 0
                ceiling = result.batch_size  # no growing back into the size that timed out
                continue
            batch_ms = (self._batch_clock() - started) * 1000
            timeouts_in_a_row = 0
            result.num_batches += 1
            result.num_deleted += batch["num_deleted"]
            result.longest_batch_ms = max(result.longest_batch_ms, batch_ms)
            self._log.debug(
                f"{EVENTS}.batch_deleted",
                **batch,
                batch_ms=round(batch_ms, 1),
                batch_size=result.batch_size,
                strategy=walk.name,
            )
            result.batch_size = self._steer(result.batch_size, batch_ms, ceiling)
            if walk.done:
                return
            if cfg.batch_pause > timedelta(0):
                self._sleep(cfg.batch_pause.total_seconds())

    def _choose_walk(
        self, conn: psycopg.Connection, params: dict[str, Any], timeout: str
    ) -> tuple[IndexWalk | BlockSweep, str]:
        """The access path of this run and why, decided once before the first batch, and logged."""
        pending = fetch_limited(conn, timeout, COUNT_HOLDING, params)[0]
        guard = "hashed" if pending <= self.config.hashed_pending_limit else "probed"
        started = time.perf_counter()
        try:
            estimates = read_estimates(conn, timeout, params, sample=self.config.strategy == "auto")
        except errors.QueryCanceled:  # the table is locked: the batches will tell (timeouts, gave_up)
            self._log.warning(f"{EVENTS}.estimates_timeout", strategy="index")
            return IndexWalk(guard), "the table was locked while estimating"
        strategy, reason = choose(self.config.strategy, estimates)
        measured = estimates.expired_fraction is not None and estimates.correlation is not None
        index_s, sweep_s = estimates.seconds() if measured else (None, None)
        self._log.info(
            f"{EVENTS}.strategy_chosen",
            strategy=strategy,
            setting=self.config.strategy,
            reason=reason,
            expired_fraction=_rounded(estimates.expired_fraction, 4),
            sampled_rows=estimates.sampled_rows,
            correlation=_rounded(estimates.correlation, 4),
            table_blocks=estimates.table_blocks,
            rows_per_page=round(estimates.rows_per_page, 1),
            estimated_index_s=_rounded(index_s, 3),
            estimated_sweep_s=_rounded(sweep_s, 3),
            pending_dead_letters=pending,
            estimate_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return (BlockSweep(guard, estimates) if strategy == "sweep" else IndexWalk(guard)), reason

    def _steer(self, batch_size: int, batch_ms: float, ceiling: int) -> int:
        """The next batch's size: toward the target duration, within [min batch size, ceiling].

        Slower than the target: shrink in proportion (the batch's time grows with its rows, or
        with its blocks for the sweep). Under half the target: double. In between: keep.
        """
        target_ms = self.config.target_batch_duration.total_seconds() * 1000
        floor = min(self.config.min_batch_size, ceiling)
        if batch_ms > target_ms:
            wanted = int(batch_size * target_ms / batch_ms)
        elif batch_ms < target_ms / 2:
            wanted = batch_size * 2
        else:
            return batch_size
        return max(floor, min(ceiling, wanted))

    def _shrink(self, result: PurgeResult) -> bool:
        """Halve the batch size down to the floor; False when it is already there."""
        floor = min(self.config.min_batch_size, self.config.batch_size)
        if result.batch_size <= floor:
            return False
        previous, result.batch_size = result.batch_size, max(floor, result.batch_size // 2)
        self._log.warning(f"{EVENTS}.batch_shrunk", from_batch_size=previous, batch_size=result.batch_size)
        return True

    def _rows_left(
        self, conn: psycopg.Connection, walk: IndexWalk | BlockSweep, params: dict[str, Any], timeout: str
    ) -> int:
        """Deletable rows the walk has not passed, up to ROWS_LEFT_CAP; -1 if even counting timed out."""
        try:
            return walk.count_left(conn, timeout, params, ROWS_LEFT_CAP)
        except errors.QueryCanceled:
            self._log.warning(f"{EVENTS}.rows_left_timeout", cap=ROWS_LEFT_CAP)
            return -1


def _rounded(value: float | None, digits: int) -> float | None:
    """A log field's value: rounded, or None when it was not measured."""
    return None if value is None else round(value, digits)


# --- demo -----------------------------------------------------------------------------------
def demo_lines(db: Database, result: PurgeResult) -> list[str]:
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
        f" ({result.strategy_reason})",
    ]


# --- 4. scheduler entry point -------------------------------------------------------------------
def build(settings: Settings, db: Database) -> Purger:
    return Purger(PurgeConfig.from_settings(settings), db)


SPEC = JobSpec(
    name="purge",
    summary="delete expired processed_jobs fences in short batches, behind the TTL-vs-retry-window guard",
    build=build,
    zero_fields=zero_fields,
    event_prefix=EVENTS,
    demo_lines=demo_lines,
)
