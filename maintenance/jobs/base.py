"""What every scheduled job provides: a :class:`JobSpec` and a ``run_once(now) -> Result``.

A job's ``job.py`` defines ``SPEC`` (listed in :data:`maintenance.jobs.catalog.JOBS`), a
``JobSpec[F]`` generic in the job's settings mixin ``F`` (its ``settings.py``): that model *is* the
job's configuration, validated by pydantic whether it comes from the environment (``Settings`` is-a
``F``) or is built in code (``PurgeFields(purge_batch_size=10)``). ``build(fields, env)`` returns an
object with ``run_once(now) -> Result``; it raises ``ConfigError`` for what no single field can
say (the purge's TTL guard), so a bad configuration exits 2 before any data is touched. ``env``, a
:class:`JobEnv`, is what every job shares, made once near the entry point (River's ``Archetype``).
A result has ``ok`` and ``fields()`` (the fixed keys of the job's stop event); ``zero_fields()``
gives the same keys with zero counts for the error event.

The stop event's fields are the log contract; what Prometheus gets from them is declared apart,
in the SPEC's ``result_metrics``: one gauge per quantity, in base units (seconds, rows), named
``core_jobs_<job>_<quantity>`` — never one gauge of unrelated fields, which no one can chart
or alert on with one unit. :mod:`maintenance.service.telemetry` exports what is declared here,
and ``python -m tools.reference`` lists it in docs/reference/metrics.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from maintenance.fields.retry import TtlGuard
    from maintenance.runtime.db import Database

F = TypeVar("F", bound=BaseModel)


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
class JobEnv:
    """What every job runs with, made once near the entry point and handed to each ``build``.

    ``stop`` is the command's stop event (SIGTERM), which a batch loop checks; ``ttl_guard`` the one
    platform fact a job must honour (J-B7: the purge refuses to run when it fails);
    ``retry_after_max`` the bound on a provider's honoured Retry-After (R-2, ``CORE_JOBS_RETRY_AFTER_MAX``: the
    alerts' client);
    ``monotonic`` and ``sleep`` the clocks of budgets and pauses (tests inject them).
    """

    db: Database
    ttl_guard: TtlGuard
    stop: threading.Event = field(default_factory=threading.Event)
    retry_after_max: timedelta | None = None  # None: the client's own bound
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class JobSpec(Generic[F]):
    name: str
    summary: str
    # The job's settings mixin (its settings.py), its configuration: Settings composes it, the manuals list it.
    settings: type[F]
    build: Callable[[F, JobEnv], Job]
    zero_fields: Callable[[], dict[str, Any]]
    event_prefix: str = ""
    # The gauges its result sets (after a run that returned one); see the module docstring.
    result_metrics: tuple[ResultMetric, ...] = ()

    @property
    def events(self) -> str:
        return self.event_prefix or f"maintenance.{self.name}"
