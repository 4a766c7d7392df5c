"""Scheduler settings: misfires and the HTTP server of ``core-jobs serve``, and where each job's crontab is.

A job is scheduled by ``serve`` when it has a setting ``CORE_JOBS_SCHEDULE_<JOB>``
(:meth:`SchedulerFields.schedule_of`), which each job declares in its own ``settings.py`` with
the type :data:`~maintenance.fields.crontab.Crontab` (UTC, checked by
:func:`~maintenance.fields.crontab.check_crontab`).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from maintenance.errors import ConfigError
from maintenance.fields.durations import PositiveDuration
from maintenance.fields.environment import ENV_PREFIX

DEFAULT_SCHEDULER_MISFIRE_GRACE = timedelta(seconds=60)  # lateness before a run is skipped
DEFAULT_HTTP_HOST = "0.0.0.0"  # listen address
DEFAULT_HTTP_PORT = 9108  # TCP port


class SchedulerFields(BaseModel):
    """`serve`: misfire grace, the /healthz and /metrics server (the jobs declare their schedules)."""

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

    def schedule_of(self, job: str) -> str:
        """The crontab of ``job`` for `serve` (setting SCHEDULE_<JOB>); ConfigError when it has none."""
        name = "schedule_" + job.replace("-", "_").replace(".", "_")
        if name not in type(self).model_fields:
            raise ConfigError(
                f"job {job} has no schedule: add a setting {ENV_PREFIX}{name.upper()} (maintenance/jobs/<job>/settings.py)"
            )
        return getattr(self, name)
