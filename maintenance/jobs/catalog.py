"""The scheduled jobs, in the order `core-jobs run-once` runs them when no job is named.

Adding a job is one new package — a maintenance job under ``maintenance/jobs/``, an alerting one
in ``alerts/`` — plus one line in :data:`CATALOG` here: its name, the module that holds its
``SPEC`` and its settings mixin (docs/adding-a-job.md). This is the composition root: the one
place of the platform that names both families (an import-linter contract keeps it so).

The catalog reads the jobs two ways. What the settings and ``check-config`` need — the names
and the settings mixins — comes from each job's ``settings.py`` alone: pydantic declarations,
cheap to import. :data:`JOBS`, the specs with the code that runs the jobs (psycopg, Better
Stack's HTTP client, Prometheus), is imported on first use (``run-once``, ``serve``, the
reference docs), so a command that runs no job never pays for it; each spec must name the
settings mixin its line here names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from alerts.settings import AlertsFields
from maintenance.jobs.metrics.settings import MetricsFields
from maintenance.jobs.purge.settings import PurgeFields

if TYPE_CHECKING:
    from maintenance.jobs.base import JobSpec

    JOBS: tuple[JobSpec[Any], ...]  # made on first use by __getattr__ below

# Each job, in run order: its name, the module whose SPEC runs it, and its settings mixin.
CATALOG: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("purge", "maintenance.jobs.purge.job", PurgeFields),
    ("alerts", "alerts.feed", AlertsFields),
    ("metrics", "maintenance.jobs.metrics.job", MetricsFields),
)

NAMES: tuple[str, ...] = tuple(name for name, _, _ in CATALOG)

# Each job's package (its settings.py and manual pointer), by name: the SPEC module's.
PACKAGES: dict[str, str] = {name: module.rpartition(".")[0] for name, module, _ in CATALOG}

# Each job's settings mixin, in run order (maintenance.settings.Settings composes them).
JOB_FIELDS: tuple[type[BaseModel], ...] = tuple(fields for _, _, fields in CATALOG)


def _load_specs() -> tuple[JobSpec[Any], ...]:
    """Each job's SPEC, imported from its job.py, checked against its line in CATALOG."""
    specs = []
    for name, module, fields in CATALOG:
        spec: JobSpec[Any] = importlib.import_module(module).SPEC
        if spec.name != name or spec.settings is not fields:
            raise ImportError(
                f"maintenance/jobs/catalog.py names the job {name!r} with the settings {fields!r}, but its SPEC "
                f"is named {spec.name!r} with the settings {spec.settings!r}"
            )
        specs.append(spec)
    return tuple(specs)


def _jobs() -> tuple[JobSpec[Any], ...]:
    """JOBS, made once (a plain module global from then on)."""
    if "JOBS" not in globals():
        globals()["JOBS"] = _load_specs()
    jobs: tuple[JobSpec[Any], ...] = globals()["JOBS"]
    return jobs


def __getattr__(name: str) -> Any:
    """``from maintenance.jobs.catalog import JOBS``: the specs, imported on first use (the module docstring says why)."""
    if name == "JOBS":
        return _jobs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def by_name() -> dict[str, JobSpec[Any]]:
    """Every job by name, in run order."""
    return {spec.name: spec for spec in _jobs()}
