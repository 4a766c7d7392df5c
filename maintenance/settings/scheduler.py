"""Scheduler settings (issue 5): the crontab of each job under ``core-jobs serve``, misfires, the HTTP server.

A job is scheduled by ``serve`` when it has a setting ``CORE_JOBS_SCHEDULE_<JOB>`` here
(:meth:`SchedulerFields.schedule_of`); a new scheduled job adds one. Crontabs are UTC, checked
by :func:`~maintenance.settings.crontab.check_crontab`.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field, field_validator

from maintenance.errors import ConfigError
from maintenance.jobs.alerts.config import (
    DEFAULT_SCHEDULE as DEFAULT_SCHEDULE_ALERTS,  # crontab, UTC: each job owns its schedule
)
from maintenance.jobs.metrics.config import DEFAULT_SCHEDULE as DEFAULT_SCHEDULE_METRICS
from maintenance.jobs.purge.config import DEFAULT_SCHEDULE as DEFAULT_SCHEDULE_PURGE
from maintenance.settings.crontab import check_crontab
from maintenance.settings.durations import PositiveDuration
from maintenance.settings.environment import ENV_PREFIX

DEFAULT_SCHEDULER_MISFIRE_GRACE = timedelta(seconds=60)  # lateness before a run is skipped
DEFAULT_HTTP_HOST = "0.0.0.0"  # listen address
DEFAULT_HTTP_PORT = 9108  # TCP port


class SchedulerFields(BaseModel):
    """`serve`: job schedules, misfire grace, the /healthz and /metrics server."""

    schedule_purge: str = Field(default=DEFAULT_SCHEDULE_PURGE, description="`serve`: crontab (UTC) of the purge job.")
    schedule_alerts: str = Field(
        default=DEFAULT_SCHEDULE_ALERTS, description="`serve`: crontab (UTC) of the alerts job."
    )
    schedule_metrics: str = Field(
        default=DEFAULT_SCHEDULE_METRICS, description="`serve`: crontab (UTC) of the metrics job."
    )
    scheduler_misfire_grace: PositiveDuration = Field(
        default=DEFAULT_SCHEDULER_MISFIRE_GRACE,
        description="`serve`: a run that starts later than this after its scheduled time is skipped "
        "(missed runs of one job are coalesced into one).",
    )
    http_host: str = Field(
        default=DEFAULT_HTTP_HOST, description="`serve`: address of the /healthz and /metrics server."
    )
    http_port: int = Field(
        default=DEFAULT_HTTP_PORT,
        ge=0,
        le=65535,
        description="`serve`: port of the /healthz and /metrics server (0: any free port).",
    )

    @field_validator("schedule_purge", "schedule_alerts", "schedule_metrics")
    @classmethod
    def _crontab(cls, value: str) -> str:
        return check_crontab(value)

    def schedule_of(self, job: str) -> str:
        """The crontab of ``job`` for `serve` (setting SCHEDULE_<JOB>); ConfigError when it has none."""
        name = "schedule_" + job.replace("-", "_").replace(".", "_")
        if name not in type(self).model_fields:
            raise ConfigError(
                f"job {job} has no schedule: add a setting {ENV_PREFIX}{name.upper()} (maintenance/settings/scheduler.py)"
            )
        return getattr(self, name)
