"""The purge job: :class:`Purger` (``Purger(PurgeFields(...), env)``; ``run_once(now) -> PurgeResult``) and its SPEC.

The operator's manual is docs/purge.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

import psycopg
from psycopg import errors

from harness.pg import advisory_lock
from maintenance.errors import ConfigError
from maintenance.fields.durations import format_duration
from maintenance.jobs.base import JobEnv, JobSpec, ResultMetric
from maintenance.jobs.purge.paths import (
    BlockSweep,
    IndexWalk,
    choose,
    fetch_limited,
    read_estimates,
)
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.jobs.purge.sql import (
    COUNT_HOLDING,
    DELETE_EXPIRED_IDEMPOTENCY_KEYS,
    DELETE_FAILED_EXECUTIONS,
    SET_ROW_BATCH_LIMITS,
)
from maintenance.runtime.logs import get_logger

LOCK_NAME = "core_jobs.purge"
EVENTS = "maintenance.purge"
# rows_left is an exact count up to this many rows; at the cap it means "at least this many".
ROWS_LEFT_CAP = 100_000
# Slow start: each run's first batch is at most this many rows; the size then steers toward
# the target batch duration (docs/purge.md).
SLOW_START_BATCH_SIZE = 1_000  # rows
# Up to this many dead letters holding a fence the replay guard is a hash (paths.py).
HASHED_PENDING_LIMIT = 50_000  # dead letters


# --- result ---------------------------------------------------------------------------------
@dataclass
class PurgeResult:
    """One run's outcome. ``fields()`` are the fixed numeric keys of the stop event, named in EVENT_FIELDS."""

    EVENT_FIELDS: ClassVar[tuple[str, ...]] = (
        "num_deleted",
        "num_batches",
        "num_timeouts",
        "rows_left",
        "stopped_on_budget",
        "stopped_on_signal",
        "skipped",
        "gave_up",
        "longest_batch_ms",
        "batch_size",
        "used_sweep",
        "executions_deleted",
        "idempotency_keys_deleted",
    )

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
    executions_deleted: int = 0
    idempotency_keys_deleted: int = 0
    # Not event fields: the cutoffs this run used (cutoff - protected_from = margin x retry window).
    cutoff: datetime | None = None
    protected_from: datetime | None = None

    @property
    def ok(self) -> bool:
        return not self.gave_up

    def fields(self) -> dict[str, Any]:
        shown = {name: getattr(self, name) for name in self.EVENT_FIELDS}
        shown["longest_batch_ms"] = round(self.longest_batch_ms, 1)
        return shown


def zero_fields() -> dict[str, Any]:
    return PurgeResult().fields()


def on_the_server(batch: dict[str, Any], wall_ms: float) -> float:
    """A batch's duration, for the steering and longest_batch_ms: its transaction as the server timed it (sql.py).

    Not the client's wall time: that adds the round trip and, on a loaded machine, the wait to be
    scheduled — milliseconds no batch size changes, which made the steering shrink batches far
    below what the target allows (docs/performance.md, "Purge").
    """
    return float(batch["transaction_ms"])


def on_the_batch_clock(batch: dict[str, Any], wall_ms: float) -> float:
    """A batch's duration as the Purger's batch clock timed it around the round trip (tests inject that clock)."""
    return wall_ms


# --- 2. constructor; 3. run_once -----------------------------------------------------------------
class Purger:
    """Deletes expired fences in batches; see the module docstring."""

    def __init__(
        self,
        settings: PurgeFields,
        env: JobEnv,
        *,
        batch_clock: Callable[[], float] = time.perf_counter,
        timed_by: Callable[[dict[str, Any], float], float] = on_the_server,
        slow_start_batch_size: int = SLOW_START_BATCH_SIZE,
        hashed_pending_limit: int = HASHED_PENDING_LIMIT,
    ) -> None:
        """``settings`` were validated by pydantic (from the environment, or ``PurgeFields(purge_batch_size=10)``
        in code); the one check left is the TTL guard's, which no single setting can make (J-B7)."""
        if not env.ttl_guard.ok:
            raise ConfigError(f"purge refused, nothing deleted: {env.ttl_guard.explain()}")
        self.settings = settings
        self.guard = env.ttl_guard  # TTL, margin and the max retry window (J-B7)
        self.db = env.db
        self._monotonic = env.monotonic
        self._sleep = env.sleep
        self._stop = env.stop  # the command's (SIGTERM)
        self._batch_clock = batch_clock
        self._timed_by = timed_by
        self._slow_start_batch_size = slow_start_batch_size
        self._hashed_pending_limit = hashed_pending_limit
        self._log = get_logger(job="purge")

    def run_once(self, now: datetime) -> PurgeResult:
        """Delete what may be deleted at ``now`` (PostgreSQL's clock), within the time budget."""
        cfg = self.settings
        deadline = self._monotonic() + cfg.purge_max_runtime.total_seconds()
        result = PurgeResult(
            batch_size=min(cfg.purge_batch_size, max(cfg.purge_min_batch_size, self._slow_start_batch_size)),
            cutoff=now,
            protected_from=now - self.guard.required,
        )
        with self.db.connect(autocommit=True) as lock_conn, advisory_lock(lock_conn, LOCK_NAME) as acquired:
            if not acquired:
                result.skipped = 1
                self._log.info(f"{EVENTS}.skipped", reason="another purge run holds the lock", lock=LOCK_NAME)
                return result
            with self.db.connect(autocommit=True) as conn:
                self._delete_batches(conn, result, deadline)
                if not (result.stopped_on_budget or result.stopped_on_signal or result.gave_up):
                    self._delete_failed_executions(conn, result, deadline)
                    self._delete_expired_idempotency_keys(conn, result, deadline)
        return result

    def _statement_timeout(self) -> str:
        """Each batch's statement_timeout, in milliseconds (at least 1)."""
        return f"{max(1, round(self.settings.purge_statement_timeout.total_seconds() * 1000))}ms"

    def _delete_failed_executions(self, conn: psycopg.Connection, result: PurgeResult, deadline: float) -> None:
        """Delete the FAILED executions nothing needs any more (sql.DELETE_FAILED_EXECUTIONS)."""
        assert result.cutoff is not None and result.protected_from is not None  # set by run_once
        params = {"failed_before": result.cutoff - self.guard.ttl, "protected_from": result.protected_from}
        result.executions_deleted = self._delete_all(
            conn, result, deadline, DELETE_FAILED_EXECUTIONS, params, "executions"
        )
        if result.executions_deleted:
            self._log.info(f"{EVENTS}.executions_deleted", num_deleted=result.executions_deleted)

    def _delete_expired_idempotency_keys(self, conn: psycopg.Connection, result: PurgeResult, deadline: float) -> None:
        """Delete the operations API's idempotency keys older than the retention (sql.DELETE_EXPIRED_IDEMPOTENCY_KEYS)."""
        assert result.cutoff is not None  # set by run_once: PostgreSQL's clock
        params = {"kept_from": result.cutoff - self.settings.idempotency_key_retention}
        result.idempotency_keys_deleted = self._delete_all(
            conn, result, deadline, DELETE_EXPIRED_IDEMPOTENCY_KEYS, params, "idempotency_keys"
        )

    def _delete_all(
        self,
        conn: psycopg.Connection,
        result: PurgeResult,
        deadline: float,
        statement: str,
        params: dict[str, Any],
        part: str,
    ) -> int:
        """Run ``statement`` in batches of the batch size until one comes back short; the rows deleted.

        Its rows are few (failures, operator actions), so the batch size is the configured one,
        without steering; a statement timeout ends this part of the run, and the next run carries on.
        """
        batch_size = self.settings.purge_batch_size
        timeout = self._statement_timeout()
        total = 0
        while self._monotonic() < deadline and not self._stop.is_set():
            try:
                (deleted,) = fetch_limited(
                    conn, timeout, statement, params | {"batch_size": batch_size}, SET_ROW_BATCH_LIMITS
                )
            except errors.QueryCanceled:
                result.num_timeouts += 1
                self._log.warning(f"{EVENTS}.statement_timeout", batch_size=batch_size, part=part)
                break
            total += deleted
            if deleted < batch_size:
                break
        return total

    def _delete_batches(self, conn: psycopg.Connection, result: PurgeResult, deadline: float) -> None:
        cfg = self.settings
        params: dict[str, Any] = {"cutoff": result.cutoff, "protected_from": result.protected_from}
        timeout = self._statement_timeout()
        walk, _reason = self._choose_walk(conn, params, timeout)  # the reason is logged (strategy_chosen)
        result.used_sweep = int(walk.name == "sweep")
        timeouts_in_a_row = 0
        # The largest batch of this run: CORE_JOBS_PURGE_BATCH_SIZE until timeouts shrink it.
        ceiling = cfg.purge_batch_size
        # Progress on the budget's clock, read once per batch with the deadline (no extra reading).
        began = last_progress = deadline - cfg.purge_max_runtime.total_seconds()
        while True:
            clock = self._monotonic()
            if result.num_batches and clock - last_progress >= cfg.purge_progress_interval.total_seconds():
                last_progress = clock
                self._progress(walk, result, clock - began)
            if clock >= deadline:
                result.stopped_on_budget = 1
                result.rows_left = self._rows_left(conn, walk, params, timeout)
                self._log.warning(
                    f"{EVENTS}.stopped_on_budget",
                    rows_left=result.rows_left,
                    max_runtime=format_duration(cfg.purge_max_runtime),
                )
                return
            if self._stop.is_set():  # SIGTERM: the batch in hand is done, start no other
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
                if timeouts_in_a_row < cfg.purge_timeouts_before_shrink:
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
            wall_ms = (self._batch_clock() - started) * 1000
            batch_ms = self._timed_by(batch, wall_ms)
            timeouts_in_a_row = 0
            result.num_batches += 1
            result.num_deleted += batch["num_deleted"]
            result.longest_batch_ms = max(result.longest_batch_ms, batch_ms)
            self._log.debug(
                f"{EVENTS}.batch_deleted",
                **batch,
                batch_ms=round(batch_ms, 1),
                wall_ms=round(wall_ms, 1),
                batch_size=result.batch_size,
                strategy=walk.name,
            )
            result.batch_size = self._steer(result.batch_size, batch_ms, ceiling)
            if walk.done:
                return
            if cfg.purge_batch_pause > timedelta(0):
                self._sleep(cfg.purge_batch_pause.total_seconds())

    def _progress(self, walk: IndexWalk | BlockSweep, result: PurgeResult, elapsed_s: float) -> None:
        """Log how far a long run is: rows deleted, their rate, and an estimate of what is left."""
        rate = result.num_deleted / elapsed_s if elapsed_s > 0 else 0.0
        left = walk.rows_left_estimate(result.num_deleted)
        self._log.info(
            f"{EVENTS}.progress",
            strategy=walk.name,
            rows_deleted=result.num_deleted,
            num_batches=result.num_batches,
            batch_size=result.batch_size,
            elapsed_s=round(elapsed_s, 1),
            rate=round(rate, 1),
            rows_left_estimate=left,
            estimate_left_s=None if left is None or rate <= 0 else round(left / round(rate, 1), 1),
        )

    def _choose_walk(
        self, conn: psycopg.Connection, params: dict[str, Any], timeout: str
    ) -> tuple[IndexWalk | BlockSweep, str]:
        """The access path of this run and why, decided once before the first batch, and logged."""
        pending, unfinished = fetch_limited(conn, timeout, COUNT_HOLDING, params)
        guard = "hashed" if max(pending, unfinished) <= self._hashed_pending_limit else "probed"
        started = time.perf_counter()
        try:
            estimates = read_estimates(conn, timeout, params, sample=self.settings.purge_strategy == "auto")
        except errors.QueryCanceled:  # the table is locked: the batches will tell (timeouts, gave_up)
            self._log.warning(f"{EVENTS}.estimates_timeout", strategy="index")
            return IndexWalk(guard, None), "the table was locked while estimating"
        strategy, reason = choose(self.settings.purge_strategy, estimates)
        measured = estimates.expired_fraction is not None and estimates.correlation is not None
        index_s, sweep_s = estimates.seconds() if measured else (None, None)
        self._log.info(
            f"{EVENTS}.strategy_chosen",
            strategy=strategy,
            setting=self.settings.purge_strategy,
            reason=reason,
            expired_fraction=_rounded(estimates.expired_fraction, 4),
            sampled_rows=estimates.sampled_rows,
            expired_rows=estimates.expired_rows,
            correlation=_rounded(estimates.correlation, 4),
            table_blocks=estimates.table_blocks,
            rows_per_page=round(estimates.rows_per_page, 1),
            estimated_index_s=_rounded(index_s, 3),
            estimated_sweep_s=_rounded(sweep_s, 3),
            pending_dead_letters=pending,
            unfinished_executions=unfinished,
            estimate_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        walk = BlockSweep(guard, estimates) if strategy == "sweep" else IndexWalk(guard, estimates.deletable_rows())
        return walk, reason

    def _steer(self, batch_size: int, batch_ms: float, ceiling: int) -> int:
        """The next batch's size: toward the target duration, within [min batch size, ceiling].

        Slower than the target: shrink in proportion (the batch's time grows with its rows, or
        with its blocks for the sweep). Under half the target: double. In between: keep.
        """
        target_ms = self.settings.purge_target_batch_duration.total_seconds() * 1000
        floor = min(self.settings.purge_min_batch_size, ceiling)
        if batch_ms > target_ms:
            wanted = int(batch_size * target_ms / batch_ms)
        elif batch_ms < target_ms / 2:
            wanted = batch_size * 2
        else:
            return batch_size
        return max(floor, min(ceiling, wanted))

    def _shrink(self, result: PurgeResult) -> bool:
        """Halve the batch size down to the floor; False when it is already there."""
        floor = min(self.settings.purge_min_batch_size, self.settings.purge_batch_size)
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


# --- 4. registration ---------------------------------------------------------------------------
SPEC = JobSpec[PurgeFields](
    name="purge",
    summary="delete expired processed_jobs fences in short batches, behind the TTL-vs-retry-window guard",
    settings=PurgeFields,
    build=Purger,  # the scheduler entry; env.stop ends the batch loop
    zero_fields=zero_fields,
    event_prefix=EVENTS,
    result_metrics=(
        ResultMetric("core_jobs_purge_rows_deleted", "num_deleted", "Fences the last purge run deleted."),
        ResultMetric(
            "core_jobs_purge_rows_left",
            "rows_left",
            f"Expired fences still there after the last purge run (capped at {ROWS_LEFT_CAP}; -1: not counted).",
        ),
        ResultMetric(
            "core_jobs_purge_longest_batch_seconds",
            "longest_batch_ms",
            "Duration of the longest delete batch of the last purge run.",
            scale=0.001,
        ),
        ResultMetric("core_jobs_purge_batches", "num_batches", "Delete batches the last purge run made."),
    ),
)
