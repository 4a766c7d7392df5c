"""The scheduled jobs, in the order `core-jobs run-once` runs them when no job is named.

Each job is a package of its own with the same parts (see docs/adding-a-job.md): named defaults
with their unit, a config built from the settings that validates once, ``run_once(now) ->
Result`` whose result names its event fields, and a ``SPEC`` with the default schedule. Adding a
job is one new package plus one line in :data:`JOBS`.
"""

from __future__ import annotations

from maintenance.jobs import alerts, metrics, purge
from maintenance.jobs.base import JobSpec

JOBS: tuple[JobSpec, ...] = (purge.SPEC, alerts.SPEC, metrics.SPEC)


def by_name() -> dict[str, JobSpec]:
    """Every job by name, in run order."""
    return {spec.name: spec for spec in JOBS}
