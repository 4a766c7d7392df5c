"""The purge's configuration: its named defaults (with their units) and :class:`PurgeConfig`.

The settings (``maintenance/settings/purge.py``) take their defaults from here; a
:class:`PurgeConfig` is built from the settings in one place, :meth:`PurgeConfig.from_settings`,
and validated once, by :class:`~maintenance.jobs.purge.job.Purger`'s constructor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from maintenance.settings.retry import TtlGuard

if TYPE_CHECKING:
    from maintenance.settings import Settings

DEFAULT_BATCH_SIZE = 10_000  # rows: the largest batch
DEFAULT_MIN_BATCH_SIZE = 100  # rows: the batch never shrinks below this
DEFAULT_TARGET_BATCH_DURATION = timedelta(milliseconds=10)  # wall time each batch aims at
DEFAULT_TIMEOUTS_BEFORE_SHRINK = 2  # consecutive statement timeouts before the batch halves
DEFAULT_STATEMENT_TIMEOUT = timedelta(seconds=5)  # per batch DELETE (SET LOCAL)
DEFAULT_BATCH_PAUSE = timedelta(0)  # between batches
DEFAULT_MAX_RUNTIME = timedelta(minutes=5)  # time budget of one run
DEFAULT_PROGRESS_INTERVAL = timedelta(seconds=5)  # between two progress events of a long run
# The operations API's Idempotency-Key ledger (core.api_idempotency_keys): a key's recorded answer
# is replayed to a retry for this long after the action, then the purge deletes it.
DEFAULT_IDEMPOTENCY_KEY_RETENTION = timedelta(days=30)
# Never shorter: a client retrying an action (a timeout, a restart) does so within minutes or
# hours; a key deleted before its last retry would let that retry run the action a second time.
MIN_IDEMPOTENCY_KEY_RETENTION = timedelta(days=1)
DEFAULT_STRATEGY: Final = "auto"  # access path: auto | index | sweep
DEFAULT_SCHEDULE = "*/15 * * * *"  # crontab (UTC) under `core-jobs serve`
# Slow start: each run's first batch is at most this many rows; the size then steers toward
# the target batch duration (see "Batch size" in the package docstring).
SLOW_START_BATCH_SIZE = 1_000  # rows
# Up to this many dead letters holding a fence the replay guard is a hash (paths.py).
HASHED_PENDING_LIMIT = 50_000  # dead letters
STRATEGIES = ("auto", "index", "sweep")


@dataclass(frozen=True)
class PurgeConfig:
    """What one purge run does; the defaults are the named constants above."""

    guard: TtlGuard  # TTL, margin and the max retry window (J-B7)
    batch_size: int = DEFAULT_BATCH_SIZE
    min_batch_size: int = DEFAULT_MIN_BATCH_SIZE
    target_batch_duration: timedelta = DEFAULT_TARGET_BATCH_DURATION
    slow_start_batch_size: int = SLOW_START_BATCH_SIZE
    timeouts_before_shrink: int = DEFAULT_TIMEOUTS_BEFORE_SHRINK
    statement_timeout: timedelta = DEFAULT_STATEMENT_TIMEOUT
    batch_pause: timedelta = DEFAULT_BATCH_PAUSE
    max_runtime: timedelta = DEFAULT_MAX_RUNTIME
    strategy: str = DEFAULT_STRATEGY
    progress_interval: timedelta = DEFAULT_PROGRESS_INTERVAL
    idempotency_key_retention: timedelta = DEFAULT_IDEMPOTENCY_KEY_RETENTION
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
            progress_interval=settings.purge_progress_interval,
            idempotency_key_retention=settings.idempotency_key_retention,
        )
