"""What every scheduled job provides: a :class:`JobSpec` and a ``run_once(now) -> Result``.

A job's ``job.py`` defines ``SPEC`` (listed in :data:`maintenance.jobs.catalog.JOBS`); its ``build(settings, db, stop)`` validates the configuration
(raising ``ConfigError``, so a bad setting exits 2 before any data is touched; ``stop`` is the
command's stop event, which a batch loop checks) and returns an object
with ``run_once(now) -> Result``. A result has ``ok`` and ``fields()`` (the fixed keys of the
job's stop event); ``zero_fields()`` gives the same keys with zero counts for the error event.

The stop event's fields are the log contract; what Prometheus gets from them is declared apart,
in the SPEC's ``result_metrics``: one gauge per quantity, in base units (seconds, rows), named
``core_jobs_<job>_<quantity>`` — never one gauge of unrelated fields, which no one can chart
or alert on with one unit. :mod:`maintenance.service.telemetry` exports what is declared here,
and ``python -m tools.reference`` lists it in docs/reference/metrics.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

if TYPE_CHECKING:
    from maintenance.runtime.db import Database
    from maintenance.settings import Settings


class JobResult(Protocol):
    @property
    def ok(self) -> bool: ...

    def fields(self) -> dict[str, Any]: ...


class Job(Protocol):
    def run_once(self, now: datetime) -> JobResult: ...


@dataclass(frozen=True)
class ResultMetric:
    """One gauge read from one field of a job's result: ``field`` x ``scale`` (to base units)."""

    name: str
    field: str
    documentation: str
    scale: float = 1.0

    def value(self, fields: dict[str, Any]) -> float | None:
        """The gauge's value from a result's fields; None when the field is not a number."""
        raw = fields.get(self.field)
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            return None
        return float(raw) * self.scale


@dataclass(frozen=True)
class JobSpec:
    name: str
    summary: str
    build: Callable[[Settings, Database, threading.Event], Job]
    zero_fields: Callable[[], dict[str, Any]]
    event_prefix: str = ""
    # The job's settings mixin (its settings.py): Settings composes it, the manuals list it.
    settings: type[BaseModel] | None = None
    # The gauges its result sets (after a run that returned one); see the module docstring.
    result_metrics: tuple[ResultMetric, ...] = ()

    @property
    def events(self) -> str:
        return self.event_prefix or f"maintenance.{self.name}"
