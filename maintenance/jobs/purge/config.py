"""The purge's configuration: :class:`PurgeConfig`, its defaults, and the constants that are not settings.

The defaults are the settings' (declared once, in ``settings.py``); a :class:`PurgeConfig` is
built from the settings in one place, :meth:`PurgeConfig.from_settings`, and validated once, by
:class:`~maintenance.jobs.purge.job.Purger`'s constructor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from maintenance.fields import default_of
from maintenance.fields.retry import TtlGuard
from maintenance.jobs.purge.settings import MIN_IDEMPOTENCY_KEY_RETENTION, PurgeFields

if TYPE_CHECKING:
    from maintenance.settings import Settings

DEFAULT_BATCH_SIZE: int = default_of(PurgeFields, "purge_batch_size")
DEFAULT_MIN_BATCH_SIZE: int = default_of(PurgeFields, "purge_min_batch_size")
DEFAULT_TARGET_BATCH_DURATION: timedelta = default_of(PurgeFields, "purge_target_batch_duration")
DEFAULT_TIMEOUTS_BEFORE_SHRINK: int = default_of(PurgeFields, "purge_timeouts_before_shrink")
DEFAULT_STATEMENT_TIMEOUT: timedelta = default_of(PurgeFields, "purge_statement_timeout")
DEFAULT_BATCH_PAUSE: timedelta = default_of(PurgeFields, "purge_batch_pause")
DEFAULT_MAX_RUNTIME: timedelta = default_of(PurgeFields, "purge_max_runtime")
DEFAULT_PROGRESS_INTERVAL: timedelta = default_of(PurgeFields, "purge_progress_interval")
# The operations API's Idempotency-Key ledger (core.api_idempotency_keys): a key's recorded answer
# is replayed to a retry for this long after the action, then the purge deletes it.
DEFAULT_IDEMPOTENCY_KEY_RETENTION: timedelta = default_of(PurgeFields, "idempotency_key_retention")
DEFAULT_STRATEGY: str = default_of(PurgeFields, "purge_strategy")
# Slow start: each run's first batch is at most this many rows; the size then steers toward
# the target batch duration (docs/purge.md).
SLOW_START_BATCH_SIZE = 1_000  # rows
# Up to this many dead letters holding a fence the replay guard is a hash (paths.py).
HASHED_PENDING_LIMIT = 50_000  # dead letters
STRATEGIES = ("auto", "index", "sweep")

__all__ = ["MIN_IDEMPOTENCY_KEY_RETENTION", "STRATEGIES", "PurgeConfig"]


@dataclass(frozen=True)
class PurgeConfig:
    """What one purge run does; the defaults are the settings' (above)."""

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
