"""Stand-in jobs for the runner's tests: one that counts and records its clock, one that fails; their specs."""

from __future__ import annotations

from maintenance.jobs.base import JobSpec


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


def spec(name: str) -> JobSpec:
    return JobSpec(
        name=name,
        summary=name,
        build=lambda s, d, _stop: None,
        zero_fields=lambda: {"num_done": 0},
        event_prefix=f"test.{name}",
    )
