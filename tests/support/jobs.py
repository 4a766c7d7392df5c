"""What the jobs' tests share: the one :class:`JobEnv` factory, and stand-in jobs for the runner's tests (one that
counts and records its clock, one that fails) with their specs."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from maintenance.jobs.base import JobEnv, JobSpec
from maintenance.settings import TtlGuard

# TTL 7 days, margin 2 x a 10-minute retry window: fences processed in the last 20 minutes stay.
GUARD = TtlGuard(ttl=timedelta(days=7), window=timedelta(minutes=10), margin=2.0)


def env(db: Any, *, guard: TtlGuard = GUARD, stop: threading.Event | None = None, **clocks: Any) -> JobEnv:
    """What a job runs with in a test: ``db``, the test guard (or ``guard``), a stop event nobody sets (or ``stop``)
    and the real clocks (or ``monotonic=``, ``sleep=``)."""
    return JobEnv(db=db, ttl_guard=guard, stop=stop if stop is not None else threading.Event(), **clocks)


class CountingResult:
    ok = True

    def fields(self) -> dict[str, int]:
        return {"num_done": 3}


class CountingJob:
    """Records the clock it was given."""

    def __init__(self) -> None:
        self.now = None

    def run_once(self, now):
        self.now = now
        return CountingResult()


class FailingJob:
    def run_once(self, now):
        raise RuntimeError("provider down")


def spec(name: str, **given: Any) -> JobSpec[BaseModel]:
    """A stand-in job's spec (no settings of its own); ``given`` replaces any of its parts."""
    parts: dict[str, Any] = {
        "name": name,
        "summary": name,
        "settings": BaseModel,
        "build": lambda _fields, _env: None,
        "zero_fields": lambda: {"num_done": 0},
        "event_prefix": f"test.{name}",
    }
    return JobSpec(**(parts | given))
