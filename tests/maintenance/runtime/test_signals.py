"""SIGTERM asks for a cooperative stop: the batch in hand finishes and no further job starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from pydantic import BaseModel

from maintenance.jobs.base import JobSpec
from maintenance.runtime.signals import on_signals
from maintenance.service.runner import build_jobs, job_env, run_jobs
from maintenance.service.telemetry import Telemetry
from maintenance.settings import Settings


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


def spec(name: str) -> JobSpec[BaseModel]:
    return JobSpec(
        name=name,
        summary=name,
        settings=BaseModel,
        build=lambda _fields, _env: None,
        zero_fields=lambda: {"num_done": 0},
    )


def test_a_signal_inside_the_block_sets_the_given_event_instead_of_killing():
    """Under on_signals a SIGTERM and a SIGINT set the event passed in and name themselves; afterwards the old handlers are back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop, received = threading.Event(), []
    with on_signals(stop, on_signal=received.append):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set()
        os.kill(os.getpid(), signal.SIGINT)
    assert received == ["SIGTERM", "SIGINT"]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_stop_in_one_command_does_not_stop_the_next():
    """Each command has its own stop event: a signal in one block leaves a later block's event unset."""
    first, second = threading.Event(), threading.Event()
    with on_signals(first):
        os.kill(os.getpid(), signal.SIGTERM)
    with on_signals(second):
        pass
    assert first.is_set() and not second.is_set()


def test_run_once_starts_no_further_job_after_sigterm(db):
    """When a SIGTERM arrives during the first job, it finishes, and the second job is not started."""
    first, second = RecordingJob(stop_while_running=True), RecordingJob()
    stop = threading.Event()
    with on_signals(stop):
        outcomes = run_jobs([(spec("first"), first), (spec("second"), second)], db, Telemetry(), stop=stop)
    assert [o.name for o in outcomes] == ["first"] and outcomes[0].ok
    assert first.ran and not second.ran


def test_the_built_purge_checks_the_stop_event_it_was_given(db, database_url):
    """build_jobs hands the command's stop event to the purge's batch loop: set, the purge starts no batch."""
    settings = Settings(database_url=database_url)
    stop = threading.Event()
    ((_, purge),) = build_jobs(settings, job_env(settings, db, stop=stop), ["purge"])
    stop.set()
    result = purge.run_once(db.server_now())
    assert (result.stopped_on_signal, result.num_batches) == (1, 0)


IMPORT_STATE = """
import prometheus_client.metrics as created
import maintenance.cli, maintenance.service.scheduler, maintenance.service.runner, maintenance.service.telemetry
import maintenance.runtime.signals as signals
print(created._use_created, sorted(n for n in vars(signals) if not n.startswith("__")))
"""


def test_importing_the_runtime_creates_no_process_wide_state():
    """Importing the CLI and runtime leaves prometheus_client's _created switch alone and makes no module stop flag or telemetry."""
    out = subprocess.run([sys.executable, "-c", IMPORT_STATE], capture_output=True, text=True, check=True).stdout
    use_created, names = out.split(" ", 1)
    assert use_created == "True"
    assert "_requested" not in names and "request_stop" not in names
    import maintenance.service.telemetry as telemetry

    assert not hasattr(telemetry, "default") and not hasattr(telemetry, "_DEFAULT")


def test_a_signal_caught_while_the_main_thread_holds_the_logs_lock_is_still_reported():
    """The handler runs in the main thread between two bytecodes — perhaps while that thread holds a lock the log
    line's writer needs (structlog's write lock is not reentrant). The line is written by a thread of the block,
    which waits for the lock; the handler itself only sets the event: no deadlock, the line comes once released."""
    writer_lock, reported = threading.Lock(), []

    def log_line(name: str) -> None:  # as a log line's write would: take the writer's lock
        got = writer_lock.acquire(timeout=5)
        reported.append((name, got))
        if got:
            writer_lock.release()

    stop = threading.Event()
    with on_signals(stop, on_signal=log_line), writer_lock:  # the main thread is writing a log line, then the signal
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set()
    assert reported == [("SIGTERM", True)]


def test_a_signal_another_thread_caught_sets_the_event_while_the_main_thread_is_blocked():
    """The kernel may hand the signal to any thread, and Python runs the handler only in the main thread once it runs
    bytecode again: the block's own thread, woken by the signal itself, sets the event (and reports the signal) while
    the main thread still sits in a plain lock wait, which a signal caught elsewhere does not interrupt."""
    import time

    stop, reported, blocked, seen = threading.Event(), [], threading.Lock(), []

    def deliver() -> None:
        time.sleep(0.2)  # the main thread in its lock wait by then
        sent = time.monotonic()
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # caught here, not in the main thread
        seen.append(time.monotonic() - sent if stop.wait(10) else None)
        blocked.release()  # now let the main thread go

    with on_signals(stop, on_signal=reported.append):
        blocked.acquire()
        threading.Timer(3, lambda: blocked.locked() and not seen and blocked.release()).start()  # a test that fails
        threading.Thread(target=deliver).start()
        assert blocked.acquire(timeout=15)
    assert seen and seen[0] is not None and seen[0] < 1.0, seen
    assert reported == ["SIGTERM"]
