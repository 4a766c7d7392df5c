"""Purge settings (issue 3): batch sizing, timeouts, time budget and access path of the processed_jobs purge.

The purge job itself is ``maintenance/jobs/purge/`` (its package docstring is the manual); the defaults are its ``config.py``'s; its manual explains how these are used.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from maintenance.jobs.purge.config import (
    DEFAULT_BATCH_PAUSE as DEFAULT_PURGE_BATCH_PAUSE,
)  # the job owns its defaults; the settings import them
from maintenance.jobs.purge.config import (
    DEFAULT_BATCH_SIZE as DEFAULT_PURGE_BATCH_SIZE,
)
from maintenance.jobs.purge.config import (
    DEFAULT_IDEMPOTENCY_KEY_RETENTION,
    MIN_IDEMPOTENCY_KEY_RETENTION,
)
from maintenance.jobs.purge.config import (
    DEFAULT_MAX_RUNTIME as DEFAULT_PURGE_MAX_RUNTIME,
)
from maintenance.jobs.purge.config import (
    DEFAULT_MIN_BATCH_SIZE as DEFAULT_PURGE_MIN_BATCH_SIZE,
)
from maintenance.jobs.purge.config import (
    DEFAULT_PROGRESS_INTERVAL as DEFAULT_PURGE_PROGRESS_INTERVAL,
)
from maintenance.jobs.purge.config import (
    DEFAULT_STATEMENT_TIMEOUT as DEFAULT_PURGE_STATEMENT_TIMEOUT,
)
from maintenance.jobs.purge.config import (
    DEFAULT_STRATEGY as DEFAULT_PURGE_STRATEGY,
)
from maintenance.jobs.purge.config import (
    DEFAULT_TARGET_BATCH_DURATION as DEFAULT_PURGE_TARGET_BATCH_DURATION,
)
from maintenance.jobs.purge.config import (
    DEFAULT_TIMEOUTS_BEFORE_SHRINK as DEFAULT_PURGE_TIMEOUTS_BEFORE_SHRINK,
)
from maintenance.settings.durations import NonNegativeDuration, PositiveDuration, format_duration


class PurgeFields(BaseModel):
    """The purge of expired processed_jobs fences."""

    purge_batch_size: int = Field(
        default=DEFAULT_PURGE_BATCH_SIZE,
        ge=1,
        description="Largest number of fences per batch; each batch is its own short transaction, sized "
        "to CORE_JOBS_PURGE_TARGET_BATCH_DURATION.",
    )
    purge_min_batch_size: int = Field(
        default=DEFAULT_PURGE_MIN_BATCH_SIZE,
        ge=1,
        description="Floor the batch size may shrink to (slow batches, statement timeouts); "
        "at this size, repeated timeouts stop the run (exit 1).",
    )
    purge_target_batch_duration: PositiveDuration = Field(
        default=DEFAULT_PURGE_TARGET_BATCH_DURATION,
        description="Wall time each batch transaction aims at: after a slower batch the batch size shrinks in "
        "proportion, after one under half of it the size doubles (up to CORE_JOBS_PURGE_BATCH_SIZE).",
    )
    purge_timeouts_before_shrink: int = Field(
        default=DEFAULT_PURGE_TIMEOUTS_BEFORE_SHRINK,
        ge=1,
        description="Consecutive statement timeouts after which the batch size is halved.",
    )
    purge_statement_timeout: PositiveDuration = Field(
        default=DEFAULT_PURGE_STATEMENT_TIMEOUT,
        description="statement_timeout of each batch's DELETE (SET LOCAL).",
    )
    purge_batch_pause: NonNegativeDuration = Field(
        default=DEFAULT_PURGE_BATCH_PAUSE,
        description="Pause between batches, to leave I/O to the application.",
    )
    purge_max_runtime: PositiveDuration = Field(
        default=DEFAULT_PURGE_MAX_RUNTIME,
        description="Time budget of one run; no new batch starts after it and the run reports rows_left.",
    )
    purge_strategy: Literal["auto", "index", "sweep"] = Field(
        default=DEFAULT_PURGE_STRATEGY,
        description="Access path of each run: index walks the expires_at index in expiry order; sweep walks "
        "the heap in block ranges; auto picks one per run from the expired fraction and the physical order.",
    )
    purge_progress_interval: PositiveDuration = Field(
        default=DEFAULT_PURGE_PROGRESS_INTERVAL,
        description="How often a long run logs maintenance.purge.progress at info (rows deleted, rate, "
        "estimated rows and seconds left).",
    )
    idempotency_key_retention: PositiveDuration = Field(
        default=DEFAULT_IDEMPOTENCY_KEY_RETENTION,
        description="How long the operations API replays a recorded answer to a retried Idempotency-Key; the purge "
        "deletes keys older than this (at least P1D). Resolution keys (core.execution_resolutions) never expire.",
    )

    @field_validator("idempotency_key_retention")
    @classmethod
    def _retention_covers_retries(cls, value: timedelta) -> timedelta:
        if value < MIN_IDEMPOTENCY_KEY_RETENTION:
            raise ValueError(
                f"must be at least {format_duration(MIN_IDEMPOTENCY_KEY_RETENTION)}: a client retrying after its "
                "key was deleted would run the action again"
            )
        return value
