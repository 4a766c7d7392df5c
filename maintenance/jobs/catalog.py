"""The scheduled jobs, in the order `core-jobs run-once` runs them when no job is named.

Adding a job is one new package under ``maintenance/jobs/`` plus one line here
(docs/adding-a-job.md).
"""

from __future__ import annotations

from maintenance.jobs.alerts.job import SPEC as ALERTS
from maintenance.jobs.base import JobSpec
from maintenance.jobs.metrics.job import SPEC as METRICS
from maintenance.jobs.purge.job import SPEC as PURGE

JOBS: tuple[JobSpec, ...] = (PURGE, ALERTS, METRICS)


def by_name() -> dict[str, JobSpec]:
    """Every job by name, in run order."""
    return {spec.name: spec for spec in JOBS}
