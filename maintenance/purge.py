"""The purge: deletes expired ``core.processed_jobs`` fences in short batches (issue 3).

Run it with ``core-jobs run-once purge`` (or on the scheduler). A fence is deleted only when
all three hold, with ``cutoff`` = PostgreSQL's ``now()`` read once at the start of the run:

1. ``expires_at < cutoff`` — its TTL has passed;
2. ``processed_at < cutoff - TTL_MARGIN x max retry window`` — no retry or broker redelivery
   can still arrive for it, even if a misconfigured consumer wrote a too-short ``expires_at``
   (J-AC6);
3. no dead letter of the same ``job_id`` is ``pending_review`` — a replay needs the fence, or
   it would apply the work twice (checked through the partial index
   ``dead_letters_pending_job_idx``). Replayed or discarded dead letters do not hold a fence.

Before touching anything, the job refuses to run (exit 2, nothing deleted) when
``CORE_JOBS_PROCESSED_JOBS_TTL`` is shorter than ``CORE_JOBS_TTL_MARGIN`` x the maximum retry
window of every configured retry policy plus ``CORE_JOBS_BROKER_REDELIVERY_HORIZON`` (J-B7);
the message shows TTL, window and margin and what to change (``core-jobs check-config``
shows the same computation).

How it deletes
--------------
It walks the ``expires_at`` index in order and deletes each batch by ``ctid``, carrying a
cursor on ``expires_at`` from batch to batch, so no batch rescans what an earlier one passed.
Each batch is its own transaction with ``SET LOCAL statement_timeout`` and asynchronous
commit; a crash leaves only whole batches deleted and the next run continues. The pending
dead letters are checked through a hash of their job_ids when there are at most 50 000 of
them (the common case; 15 ms instead of 24 ms per 10 000-row batch), else by one index probe
per row. The run ends when a batch comes back short. Only one run works at a time: it holds the advisory lock ``core_jobs.purge`` on its own
connection; a second run logs ``maintenance.purge.skipped`` and exits 0.

Options (environment variables; durations are ISO-8601 or seconds)
-----------------------------------------------------------------
- ``CORE_JOBS_PURGE_BATCH_SIZE``            rows, default 10000: fences per batch.
- ``CORE_JOBS_PURGE_MIN_BATCH_SIZE``        rows, default 100: the batch size never shrinks below
  this (nor shrinks at all when the batch size is already smaller).
- ``CORE_JOBS_PURGE_TIMEOUTS_BEFORE_SHRINK`` count, default 2: consecutive statement timeouts
  after which the batch size is halved (as River's JobCleaner does). At the minimum size,
  that many more timeouts stop the run with ok=false (exit 1); the next run starts afresh.
- ``CORE_JOBS_PURGE_STATEMENT_TIMEOUT``     duration, default PT5S: statement_timeout of a batch.
- ``CORE_JOBS_PURGE_BATCH_PAUSE``           duration, default PT0S: pause between batches.
- ``CORE_JOBS_PURGE_MAX_RUNTIME``           duration, default PT5M: time budget; no batch starts
  after it, the run stops cleanly with ``stopped_on_budget=1`` and reports ``rows_left``.
- ``CORE_JOBS_PROCESSED_JOBS_TTL``, ``CORE_JOBS_TTL_MARGIN``, ``CORE_JOBS_RETRY_*``,
  ``CORE_JOBS_BROKER_REDELIVERY_HORIZON``: the guard above.

Events and metrics
------------------
``maintenance.purge.start`` / ``.stop`` / ``.error`` (from the runner) carry these fixed
numeric keys, all 0 on error; the metrics issue exports them:

- ``num_deleted``        fences deleted by this run;
- ``num_batches``        batches committed (a batch that deleted nothing counts too);
- ``num_timeouts``       batches cancelled by the statement timeout (rolled back, retried);
- ``rows_left``          deletable fences left when the run stopped early (budget or
                         gave_up), counted exactly up to ``ROWS_LEFT_CAP`` (100 000; the
                         value then means "at least"); 0 when the run finished; -1 when the
                         count itself hit the statement timeout;
- ``stopped_on_budget``  1 when the time budget ended the run;
- ``skipped``            1 when another run held the lock (nothing was done);
- ``gave_up``            1 when timeouts persisted at the minimum batch size (ok=false);
- ``longest_batch_ms``   wall time of the longest batch transaction, commit included;
- ``batch_size``         the batch size at the end of the run (smaller after timeouts).

Per batch: ``maintenance.purge.batch_deleted`` (debug; ``num_deleted``, ``batch_ms``,
``batch_size``). Warnings: ``maintenance.purge.statement_timeout``,
``maintenance.purge.batch_shrunk``, ``maintenance.purge.stopped_on_budget``,
``maintenance.purge.rows_left_timeout``; error:
``maintenance.purge.gave_up``; info: ``maintenance.purge.skipped``.
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
from maintenance.db import Database
from maintenance.logs import get_logger
from maintenance.registry import JobSpec, register
from maintenance.settings import ConfigError, Settings, TtlGuard, format_duration

LOCK_NAME = "core_jobs.purge"
EVENTS = "maintenance.purge"
# rows_left is an exact count up to this many rows; at the cap it means "at least this many".
ROWS_LEFT_CAP = 100_000

# The time guards. :cutoff is PostgreSQL's now() read once per run; :protected_from is
# cutoff - margin x retry window, so a fence written with a too-short expires_at survives.
_EXPIRED_AND_OUTSIDE_WINDOW = """
       p.expires_at < %(cutoff)s
   AND p.processed_at < %(protected_from)s"""

# The replay guard: a pending dead letter may still be replayed, so its fence must stay. Two
# equivalent spellings; the run picks one from the number of pending dead letters:
# - hashed: PostgreSQL reads the pending job_ids once per batch (index-only scan of the partial
#   index dead_letters_pending_job_idx) into a hash table and probes it per row. Measured 15 ms
#   vs 24 ms per 10 000-row batch with ~600 pending. NOT IN is exact here: job_id is NOT NULL.
#   With too many pending rows for work_mem the plan would turn into a scan per row, hence:
# - probed: one index probe of dead_letters_pending_job_idx per row, for any number pending.
_NOT_PENDING_HASHED = """
   AND p.job_id NOT IN (SELECT d.job_id FROM core.dead_letters AS d WHERE d.status = 'pending_review')"""
_NOT_PENDING_PROBED = """
   AND NOT EXISTS (SELECT 1 FROM core.dead_letters AS d
                    WHERE d.job_id = p.job_id AND d.status = 'pending_review')"""
# Up to this many pending dead letters the hashed spelling is used.
HASHED_PENDING_LIMIT = 50_000

COUNT_PENDING = "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'"

# Per batch transaction: the statement timeout, and no wait for the WAL flush at commit — a
# server crash may undo the last few batches, which the next run simply deletes again.
SET_BATCH_LIMITS = """
SELECT set_config('statement_timeout', %s, true), set_config('synchronous_commit', 'off', true)"""

# One batch. The inner SELECT walks processed_jobs_expires_at_idx from the cursor in expiry
# order and picks the physical addresses (ctid) of up to :batch_size deletable rows; the DELETE
# fetches exactly those tuples (a TID scan). It runs in the same snapshot as the SELECT, so the
# guards need no second check; the time guards are repeated only because a row updated
# concurrently is re-checked against them (and then skipped: its ctid changed). The largest
# expires_at deleted is the next batch's cursor (">=": rows tied with it may not all have fit).
_DELETE_BATCH = """
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
DELETE_BATCH = {
    name: _DELETE_BATCH.format(deletable=_EXPIRED_AND_OUTSIDE_WINDOW + guard, time_guards=_EXPIRED_AND_OUTSIDE_WINDOW)
    for name, guard in (("hashed", _NOT_PENDING_HASHED), ("probed", _NOT_PENDING_PROBED))
}
_DELETABLE = _EXPIRED_AND_OUTSIDE_WINDOW + _NOT_PENDING_PROBED

# How many deletable rows remain past the cursor, stopping at :cap so a huge backlog stays cheap.
COUNT_ROWS_LEFT = f"""
SELECT count(*) FROM (
    SELECT 1 FROM core.processed_jobs AS p
     WHERE p.expires_at >= %(cursor)s::timestamptz
       AND {_DELETABLE}
     LIMIT %(cap)s
) AS left_over"""

# The demo's account of the fences a run kept, by the rule that kept them.
COUNT_KEPT = """
SELECT count(*) FILTER (WHERE p.expires_at >= %(cutoff)s)                                AS not_expired,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at >= %(protected_from)s) AS inside_window,
       count(*) FILTER (WHERE p.expires_at < %(cutoff)s AND p.processed_at < %(protected_from)s
                          AND EXISTS (SELECT 1 FROM core.dead_letters d
                                       WHERE d.job_id = p.job_id AND d.status = 'pending_review')) AS pending_dead_letter
  FROM core.processed_jobs AS p"""

_BEGINNING = "-infinity"  # the cursor before the first batch


def _setting_default(name: str) -> Any:
    return Settings.model_fields[name].default


# --- 1. config ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PurgeConfig:
    """What one purge run does; defaults are the settings' (see the module docstring)."""

    guard: TtlGuard  # TTL, margin and the max retry window (J-B7)
    batch_size: int = _setting_default("purge_batch_size")  # rows, 10 000
    min_batch_size: int = _setting_default("purge_min_batch_size")  # rows, 100
    timeouts_before_shrink: int = _setting_default("purge_timeouts_before_shrink")  # count, 2
    statement_timeout: timedelta = _setting_default("purge_statement_timeout")  # PT5S
    batch_pause: timedelta = _setting_default("purge_batch_pause")  # PT0S
    max_runtime: timedelta = _setting_default("purge_max_runtime")  # PT5M
    # Pending dead letters up to which the replay guard is a hash (see HASHED_PENDING_LIMIT).
    hashed_pending_limit: int = HASHED_PENDING_LIMIT

    @classmethod
    def from_settings(cls, settings: Settings) -> PurgeConfig:
        return cls(
            guard=settings.ttl_guard(),
            batch_size=settings.purge_batch_size,
            min_batch_size=settings.purge_min_batch_size,
            timeouts_before_shrink=settings.purge_timeouts_before_shrink,
            statement_timeout=settings.purge_statement_timeout,
            batch_pause=settings.purge_batch_pause,
            max_runtime=settings.purge_max_runtime,
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
    skipped: int = 0
    gave_up: int = 0
    longest_batch_ms: float = 0.0
    batch_size: int = 0
    # Not event fields: the cutoffs this run used, for the demo's account.
    cutoff: datetime | None = field(default=None, repr=False)
    protected_from: datetime | None = field(default=None, repr=False)

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
    ) -> None:
        guard = config.guard
        if not guard.ok:
            raise ConfigError(f"purge refused, nothing deleted: {guard.explain()}")
        # The settings enforce these too; a PurgeConfig built in code gets the same names.
        checks = (
            (config.batch_size >= 1, "CORE_JOBS_PURGE_BATCH_SIZE must be at least 1"),
            (config.min_batch_size >= 1, "CORE_JOBS_PURGE_MIN_BATCH_SIZE must be at least 1"),
            (config.timeouts_before_shrink >= 1, "CORE_JOBS_PURGE_TIMEOUTS_BEFORE_SHRINK must be at least 1"),
            (config.statement_timeout > timedelta(0), "CORE_JOBS_PURGE_STATEMENT_TIMEOUT must be positive"),
            (config.batch_pause >= timedelta(0), "CORE_JOBS_PURGE_BATCH_PAUSE must not be negative"),
            (config.max_runtime > timedelta(0), "CORE_JOBS_PURGE_MAX_RUNTIME must be positive"),
        )
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))
        self.config = config
        self.db = db
        self._monotonic = monotonic
        self._sleep = sleep
        self._log = get_logger(job="purge")

    def run_once(self, now: datetime) -> PurgeResult:
        """Delete what may be deleted at ``now`` (PostgreSQL's clock), within the time budget."""
        cfg = self.config
        deadline = self._monotonic() + cfg.max_runtime.total_seconds()
        result = PurgeResult(
            batch_size=cfg.batch_size, cutoff=now, protected_from=now - cfg.guard.required
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
        params: dict[str, Any] = {
            "cutoff": result.cutoff,
            "protected_from": result.protected_from,
            "cursor": _BEGINNING,
        }
        timeout = f"{max(1, round(cfg.statement_timeout.total_seconds() * 1000))}ms"
        pending = _fetch_limited(conn, timeout, COUNT_PENDING, {})[0]
        delete_batch = DELETE_BATCH["hashed" if pending <= cfg.hashed_pending_limit else "probed"]
        timeouts_in_a_row = 0
        while True:
            if self._monotonic() >= deadline:
                result.stopped_on_budget = 1
                result.rows_left = self._rows_left(conn, params, timeout)
                self._log.warning(
                    f"{EVENTS}.stopped_on_budget", rows_left=result.rows_left,
                    max_runtime=format_duration(cfg.max_runtime),
                )
                return
            params["batch_size"] = result.batch_size
            started = time.perf_counter()
            try:
                deleted, last_expires_at = _fetch_limited(conn, timeout, delete_batch, params)
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
                    result.rows_left = self._rows_left(conn, params, timeout)
                    self._log.error(
                        f"{EVENTS}.gave_up", batch_size=result.batch_size, num_timeouts=result.num_timeouts,
                        rows_left=result.rows_left,
                    )
                    return
                timeouts_in_a_row = 0
                continue
            batch_ms = (time.perf_counter() - started) * 1000
            timeouts_in_a_row = 0
            result.num_batches += 1
            result.num_deleted += deleted
            result.longest_batch_ms = max(result.longest_batch_ms, batch_ms)
            self._log.debug(
                f"{EVENTS}.batch_deleted", num_deleted=deleted, batch_ms=round(batch_ms, 1), batch_size=result.batch_size
            )
            if deleted < result.batch_size:  # a short batch: nothing deletable is left
                return
            params["cursor"] = last_expires_at
            if cfg.batch_pause > timedelta(0):
                self._sleep(cfg.batch_pause.total_seconds())

    def _shrink(self, result: PurgeResult) -> bool:
        """Halve the batch size down to the floor; False when it is already there."""
        floor = min(self.config.min_batch_size, self.config.batch_size)
        if result.batch_size <= floor:
            return False
        previous, result.batch_size = result.batch_size, max(floor, result.batch_size // 2)
        self._log.warning(f"{EVENTS}.batch_shrunk", from_batch_size=previous, batch_size=result.batch_size)
        return True

    def _rows_left(self, conn: psycopg.Connection, params: dict[str, Any], timeout: str) -> int:
        """Deletable rows past the cursor, up to ROWS_LEFT_CAP; -1 if even counting timed out."""
        try:
            return int(_fetch_limited(conn, timeout, COUNT_ROWS_LEFT, params | {"cap": ROWS_LEFT_CAP})[0])
        except errors.QueryCanceled:
            self._log.warning(f"{EVENTS}.rows_left_timeout", cap=ROWS_LEFT_CAP)
            return -1


def _fetch_limited(conn: psycopg.Connection, timeout: str, query: str, params: dict[str, Any]) -> tuple:
    """One row of ``query``, run in its own transaction under the batch limits."""
    with conn.transaction():
        conn.execute(SET_BATCH_LIMITS, (timeout,))
        # Never a prepared statement: after five runs PostgreSQL may switch to a generic plan,
        # and for the batch delete one such plan ran 10x slower in the benchmark.
        row = conn.execute(query, params, prepare=False).fetchone()
    assert row is not None
    return row


# --- demo -----------------------------------------------------------------------------------
def demo_lines(db: Database, result: PurgeResult) -> list[str]:
    """What the run deleted and which fences it kept, by the rule that kept each."""
    if result.skipped:
        return ["skipped: another purge run held the lock"]
    with db.connect(autocommit=True) as conn:
        not_expired, inside_window, pending = conn.execute(
            COUNT_KEPT, {"cutoff": result.cutoff, "protected_from": result.protected_from}
        ).fetchone()
    return [
        f"deleted {result.num_deleted} fences in {result.num_batches} batch(es): expired, processed more than"
        f" {format_duration(result.cutoff - result.protected_from)} (margin x retry window) ago, no pending dead letter",
        f"kept {inside_window} expired fences still inside the retry window (a late retry still needs them)",
        f"kept {pending} expired fences whose job has a dead letter pending review (a replay needs them)",
        f"kept {not_expired} fences not expired yet",
    ]


# --- 4. scheduler entry point -------------------------------------------------------------------
def build(settings: Settings, db: Database) -> Purger:
    return Purger(PurgeConfig.from_settings(settings), db)


SPEC = register(
    JobSpec(
        name="purge",
        summary="delete expired processed_jobs fences in short batches, behind the TTL-vs-retry-window guard",
        build=build,
        zero_fields=zero_fields,
        event_prefix=EVENTS,
        demo_lines=demo_lines,
    )
)
