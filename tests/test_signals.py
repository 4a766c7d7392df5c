"""SIGTERM asks for a cooperative stop: the batch in hand finishes and no further job starts."""

from __future__ import annotations

import os
import signal

from maintenance.jobs.base import JobSpec
from maintenance.runtime import signals as shutdown
from maintenance.runtime.runner import run_jobs


class RecordingJob:
    """A job that records that it ran and can request a stop while it runs, as a SIGTERM would."""

    def __init__(self, *, stop_while_running: bool = False) -> None:
        self.ran = False
        self.stop_while_running = stop_while_running

    def run_once(self, now):
        self.ran = True
        if self.stop_while_running:
            os.kill(os.getpid(), signal.SIGTERM)
        return self

    ok = True

    def fields(self):
        return {"num_done": 1}


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, summary=name, build=lambda s, d: None, zero_fields=lambda: {"num_done": 0})


def test_sigterm_inside_the_block_requests_a_stop_instead_of_killing():
    """Under stop_on_sigterm a SIGTERM sets the stop flag; afterwards the flag is cleared and the old handler back."""
    before = signal.getsignal(signal.SIGTERM)
    with shutdown.stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        assert shutdown.stop_requested()
    assert not shutdown.stop_requested()
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_once_starts_no_further_job_after_sigterm(db):
    """When a SIGTERM arrives during the first job, it finishes, and the second job is not started."""
    first, second = RecordingJob(stop_while_running=True), RecordingJob()
    with shutdown.stop_on_sigterm():
        outcomes = run_jobs([(spec("first"), first), (spec("second"), second)], db)
    assert [o.name for o in outcomes] == ["first"] and outcomes[0].ok
    assert first.ran and not second.ran
