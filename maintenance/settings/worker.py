"""Worker settings: lease, batch size, polling and threads of ``core-jobs worker``; the bulk cap.

``CORE_JOBS_DEAD_LETTERS_BULK_MAX`` bounds the dead letters one bulk action by filter may touch
(``core-jobs dead-letters replay --queue Q --all-pending`` and the API's ``filter`` bodies,
:mod:`maintenance.operations.dead_letters`): a filter matching more is refused with the count, nothing changed.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from maintenance.fields.durations import PositiveDuration
from maintenance.operations.limits import DEFAULT_BULK_MAX  # not from dead_letters: that loads psycopg

DEFAULT_WORKER_LEASE = timedelta(seconds=30)  # claim held before another worker may take it
DEFAULT_WORKER_BATCH_SIZE = 10  # messages per claim
DEFAULT_WORKER_POLL_INTERVAL = timedelta(seconds=1)  # idle wait
DEFAULT_WORKER_CONCURRENCY = 1  # threads per process
DEFAULT_DEAD_LETTERS_BULK_MAX = DEFAULT_BULK_MAX  # dead letters per bulk action by filter


class WorkerFields(BaseModel):
    """`core-jobs worker`: the fencing lease, batch size, polling, threads; the cap of a bulk action by filter."""

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
    dead_letters_bulk_max: int = Field(
        default=DEFAULT_DEAD_LETTERS_BULK_MAX,
        ge=1,
        le=1_000_000,
        description="The most dead letters one bulk replay or discard by filter may touch (the CLI's --all-pending, "
        "the API's filter body); a filter matching more is refused with the count, nothing changed.",
    )
