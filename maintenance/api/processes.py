"""Several API processes on one listening socket (``CORE_JOBS_API_PROCESSES`` > 1), and their metrics as one.

The API's Python runs on one core at a time; under 8 concurrent operators on 2 cores one
process held a resolution's p95 at 51–59 ms, its own CPU the bottleneck (docs/performance.md).
``core-jobs api`` with ``CORE_JOBS_API_PROCESSES=N`` is then a **pre-fork**:

- the parent checks the settings, builds the app (admin mode's start checks included: one exit
  2 before any child exists), binds the socket, then forks N children. It serves no request.
- Each child runs uvicorn on the inherited socket (the kernel hands each new connection to one of
  them) with its **own** database pool (``CORE_JOBS_API_POOL_MAX_SIZE`` each: N times as many
  connections), worker threads and token/JWKS cache (a key set fetched once per process; a
  withdrawn key stops each cache within its lifespan, as with one process). The idempotency
  ledger and every decision are in PostgreSQL, so a key sent to two processes at once still
  takes one turn on its advisory lock and has one effect. ``/healthz`` and ``/readyz`` answer
  for the process that accepted the probe (its loop, its pool).
- A child that exits unexpectedly is replaced (``maintenance.api.process_exited``), at most once
  a second per slot. The children get SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``).
- SIGTERM or SIGINT to the parent: ``maintenance.api.stopping``, the parent closes its copy of
  the socket and passes SIGTERM to every child, each lets its requests in flight finish within
  ``CORE_JOBS_API_SHUTDOWN_GRACE``; a child still there :data:`KILL_MARGIN_S` later is killed.
  ``maintenance.api.stopped``, exit 0 (1 if a child had to be killed or failed).

**Metrics across processes** (:func:`shared_metrics`): prometheus_client's multiprocess mode,
confined to the served process. Only there, and only while it serves, ``PROMETHEUS_MULTIPROC_DIR``
names a private directory made for this run (``mkdtemp``, mode 0700) and prometheus_client's value
class is its file-backed one; the children inherit both. Each process writes its counters and
histograms to files of its own there, and ``/metrics`` — whichever child answers it — adds up
every file, a dead child's too: the counters never go back when a child is replaced. The gauge
``core_jobs_api_processes`` is ``livesum`` (a dead child's value is removed when it is reaped).
At exit the environment and the value class are restored and the directory is removed. Nothing
of this happens at import, nor in a process that only builds an app (the tests' in-thread server).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import multiprocess, values

from harness.errors import describe_error
from maintenance.errors import ConfigError
from maintenance.runtime.logs import get_logger

MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
KILL_MARGIN_S = 10.0  # after the shutdown grace: a child still running is killed
RESTART_INTERVAL_S = 1.0  # a slot's child is started again at most this often
WATCHED = frozenset({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def shared_metrics() -> Iterator[str]:
    """For the block: metrics created in this process (and the processes it forks) kept in files of a private
    directory, its path yielded; afterwards the environment and prometheus_client as they were, the directory gone.

    Call it in the served process only (``core-jobs api`` with several processes), never at import or in a
    process that goes on to do other things with prometheus_client meanwhile: the value class is process-wide.
    """
    directory = tempfile.mkdtemp(prefix="core-jobs-api-metrics-")
    previous_directory = os.environ.get(MULTIPROCESS_VARIABLE)
    previous_class = values.ValueClass
    os.environ[MULTIPROCESS_VARIABLE] = directory
    values.ValueClass = values.MultiProcessValue()
    try:
        yield directory
    finally:
        values.ValueClass = previous_class
        values.close_all_multiprocess_files()
        if previous_directory is None:
            os.environ.pop(MULTIPROCESS_VARIABLE, None)
        else:
            os.environ[MULTIPROCESS_VARIABLE] = previous_directory
        shutil.rmtree(directory, ignore_errors=True)


def _die_with_parent(parent: int) -> None:
    """SIGTERM to this process when its parent dies (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)


def _described(status: int) -> dict[str, object]:
    if os.WIFSIGNALED(status):
        return {"signal": signal.Signals(os.WTERMSIG(status)).name}
    return {"exit_code": os.waitstatus_to_exitcode(status)}


@dataclass
class Supervisor:
    """Forks ``count`` children, each running ``serve_child(slot)``; replaces one that exits; stops them all on
    SIGTERM/SIGINT. :meth:`run` returns the parent's exit code."""

    count: int
    serve_child: Callable[[int], None]
    grace_s: float
    metrics_directory: str
    on_stopping: Callable[[], None] = lambda: None  # e.g. close the parent's copy of the socket
    children: dict[int, int] = field(default_factory=dict)  # pid -> slot
    started_at: dict[int, float] = field(default_factory=dict)  # slot -> when its current child was started

    def run(self) -> int:
        if not hasattr(signal, "sigtimedwait"):
            raise ConfigError("CORE_JOBS_API_PROCESSES above 1 needs Linux (sigtimedwait); set it to 1")
        log = get_logger()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)  # taken by sigtimedwait below, never by a handler
        try:
            for slot in range(self.count):
                self._start(slot, mask)
            stopping_since: float | None = None
            failed = False
            waiting: dict[int, float] = {}  # slot -> when to start it again
            while self.children or (waiting and stopping_since is None):
                now = time.monotonic()
                if stopping_since is not None:
                    timeout = max(0.0, stopping_since + self.grace_s + KILL_MARGIN_S - now)
                else:
                    timeout = min([1.0, *(max(0.0, at - now) for at in waiting.values())])
                received = signal.sigtimedwait(WATCHED, timeout)
                if received is not None and received.si_signo != signal.SIGCHLD and stopping_since is None:
                    log.info("maintenance.api.stopping", signal=signal.Signals(received.si_signo).name)
                    stopping_since = time.monotonic()
                    waiting.clear()
                    self.on_stopping()
                    self._signal_all(signal.SIGTERM)
                for pid, status in self._reaped():
                    slot = self.children.pop(pid)
                    multiprocess.mark_process_dead(pid, self.metrics_directory)
                    if stopping_since is None:
                        log.warning("maintenance.api.process_exited", pid=pid, slot=slot, **_described(status))
                        waiting[slot] = self.started_at[slot] + RESTART_INTERVAL_S
                    elif os.waitstatus_to_exitcode(status) != 0:
                        failed = True
                        log.warning("maintenance.api.process_exited", pid=pid, slot=slot, **_described(status))
                for slot, at in list(waiting.items()):
                    if at <= time.monotonic():
                        del waiting[slot]
                        self._start(slot, mask)
                if stopping_since is not None and time.monotonic() >= stopping_since + self.grace_s + KILL_MARGIN_S:
                    self._signal_all(signal.SIGKILL)
            return 1 if failed else 0
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _signal_all(self, signo: signal.Signals) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
                os.kill(pid, signo)

    def _reaped(self) -> Iterator[tuple[int, int]]:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                yield pid, status

    def _start(self, slot: int, mask: set[int | signal.Signals]) -> None:
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code (its finally blocks remove the directory)
            code = 1
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                _die_with_parent(parent)
                self.serve_child(slot)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:
                get_logger().error("maintenance.api.process_failed", slot=slot, error=describe_error(exc))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = slot
        self.started_at[slot] = time.monotonic()
