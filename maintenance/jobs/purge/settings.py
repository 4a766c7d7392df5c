"""The purge's settings, declared once: each field's default, bounds, unit (its type) and description.

It is the job's configuration: :class:`~maintenance.jobs.purge.job.Purger` takes it as it is (read
from the environment as part of :class:`maintenance.settings.Settings`, which composes this mixin
from the job catalog, or built in code, ``PurgeFields(purge_batch_size=10)``), validated by
pydantic either way. The option list of ``docs/purge.md`` and ``docs/reference/settings.md`` are
generated from it (``uv run python -m tools.reference``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from maintenance.fields.crontab import Crontab
from maintenance.fields.durations import NonNegativeDuration, PositiveDuration, PostgresTimeout, format_duration

# Never shorter: a client retrying an action (a timeout, a restart) does so within minutes or
# hours; a key deleted before its last retry would let that retry run the action a second time.
MIN_IDEMPOTENCY_KEY_RETENTION = timedelta(days=1)


class PurgeFields(BaseModel):
    """The purge of expired processed_jobs fences: each field is its setting ``CORE_JOBS_<FIELD>``."""

    model_config = ConfigDict(extra="forbid")  # built in code, a misspelt field is an error too

    schedule_purge: Crontab = Field(default="*/15 * * * *", description="`serve`: crontab (UTC) of the purge job.")
    # 50 000, not lower: the steering sizes batches to the target; a ceiling under what the target
    # allows only adds batches (on the quiet development machine the single DELETE ran at
    # 2.2-2.5 M rows/s: 10 000 rows in ~4-5 ms, under the 10 ms target).
    purge_batch_size: int = Field(
        default=50_000,
        ge=1,
        description="Largest number of fences per batch; each batch is its own short transaction, sized "
        "to CORE_JOBS_PURGE_TARGET_BATCH_DURATION.",
    )
    purge_min_batch_size: int = Field(
        default=100,
        ge=1,
        description="Floor the batch size may shrink to (slow batches, statement timeouts); "
        "at this size, repeated timeouts stop the run (exit 1).",
    )
    purge_target_batch_duration: PositiveDuration = Field(
        default=timedelta(milliseconds=10),
        description="Time each batch transaction aims at, as the server measures it (its start to the end of its "
        "DELETE, without the round trip): after a slower batch the batch size shrinks in "
        "proportion, after one under half of it the size doubles (up to CORE_JOBS_PURGE_BATCH_SIZE).",
    )
    purge_timeouts_before_shrink: int = Field(
        default=2,
        ge=1,
        description="Consecutive statement timeouts after which the batch size is halved.",
    )
    purge_statement_timeout: PostgresTimeout = Field(
        default=timedelta(seconds=5),
        description="statement_timeout of each batch's DELETE (SET LOCAL).",
    )
    purge_batch_pause: NonNegativeDuration = Field(
        default=timedelta(0),
        description="Pause between batches, to leave I/O to the application.",
    )
    purge_max_runtime: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="Time budget of one run; no new batch starts after it and the run reports rows_left.",
    )
    purge_strategy: Literal["auto", "index", "sweep"] = Field(
        default="auto",
        description="Access path of each run: index walks the expires_at index in expiry order; sweep walks "
        "the heap in block ranges; auto picks one per run from the expired fraction and the physical order.",
    )
    purge_progress_interval: PositiveDuration = Field(
        default=timedelta(seconds=5),
        description="How often a long run logs maintenance.purge.progress at info (rows deleted, rate, "
        "estimated rows and seconds left).",
    )
    idempotency_key_retention: PositiveDuration = Field(
        default=timedelta(days=30),
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
