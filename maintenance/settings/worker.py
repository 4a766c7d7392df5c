"""Worker settings (issue 6): lease, batch size, polling and threads of ``core-jobs worker``."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from maintenance.settings.durations import PositiveDuration

DEFAULT_WORKER_LEASE = timedelta(seconds=30)  # claim held before another worker may take it
DEFAULT_WORKER_BATCH_SIZE = 10  # messages per claim
DEFAULT_WORKER_POLL_INTERVAL = timedelta(seconds=1)  # idle wait
DEFAULT_WORKER_CONCURRENCY = 1  # threads per process


class WorkerFields(BaseModel):
    """`core-jobs worker`: the fencing lease, batch size, polling, threads."""

    worker_lease: PositiveDuration = Field(
        default=DEFAULT_WORKER_LEASE,
        description="How long `core-jobs worker` holds a claimed message before another worker may take it "
        "(the fencing lease). Must cover a whole batch of handler runs.",
    )
    worker_batch_size: int = Field(
        default=DEFAULT_WORKER_BATCH_SIZE,
        ge=1,
        le=1000,
        description="Messages a worker claims at once (FOR UPDATE SKIP LOCKED); successes are acked per batch.",
    )
    worker_poll_interval: PositiveDuration = Field(
        default=DEFAULT_WORKER_POLL_INTERVAL,
        description="How long an idle worker waits before looking for ready messages again.",
    )
    worker_concurrency: int = Field(
        default=DEFAULT_WORKER_CONCURRENCY,
        ge=1,
        le=64,
        description="Worker threads per `core-jobs worker` process, each with its own connection.",
    )
