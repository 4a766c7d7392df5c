"""The alerts job: the job class, its result and SPEC. The manual is the package docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alerts.feed import AlertFeed, AlertFeedResult
from maintenance.jobs.base import JobSpec
from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger

if TYPE_CHECKING:
    from maintenance.settings import Settings
from maintenance.jobs.alerts.config import (
    DEFAULT_SCHEDULE,
    betterstack_client,
    feed_config,
)


def build(settings: Settings, db: Database, _stop: object = None) -> AlertFeed:  # one pass: no batch loop to stop
    return AlertFeed(
        feed_config(settings),
        connect=lambda: db.connect(autocommit=True),
        client=betterstack_client(settings),
        log=get_logger(job="alerts"),
    )


SPEC = JobSpec(
    schedule=DEFAULT_SCHEDULE,
    name="alerts",
    summary="Better Stack incidents for new dead letters and RECONCILIATION_REQUIRED executions, escalations, auto-resolve",
    build=build,
    zero_fields=AlertFeedResult.zero_fields,
    event_prefix="alerts.feed",
)
