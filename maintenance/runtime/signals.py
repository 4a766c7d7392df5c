"""Cooperative shutdown: a SIGTERM asks the running jobs to stop after the batch in hand.

There is no process-wide stop flag. Each command makes its own ``threading.Event`` in the CLI
and passes it down: to the runner (``run_jobs(..., stop=)``: start no further job), to the
jobs it builds (the purge checks it before each batch and ends the run cleanly, reporting
what is left, just as when its time budget runs out), to the scheduler (``serve(..., stop=)``)
and to the worker (``Worker(..., stop=)``: finish the message in hand).

:func:`on_signals` is the one place that turns signals into that event: `run-once`, `serve`
and `worker` (and the operations API) all use it. For the block, SIGTERM and SIGINT (by
default) set ``stop`` and log one ``<event>`` line with the signal's name (e.g.
``maintenance.serve.stopping``); the previous handlers are put back when the block ends. A
second signal only sets the event again: the process still stops cooperatively.

The kernel hands a process's signal to whichever of its threads it picks, and Python runs a handler only in the
main thread, between two of its bytecodes — not while that thread is blocked in a lock wait, and perhaps while it
holds a lock (a log line's writer: structlog's is not reentrant). So the handler does as little as it can (sets
the event), and a thread of the block's own does the rest: ``signal.set_wakeup_fd`` has the C-level handler, in
whatever thread caught the signal, write its number to a socket that thread reads; it sets the event too, and
calls ``on_signal`` (the log line), waiting for any lock like any other thread. A signal is thus acted on at once
even while the main thread is blocked, and the line is never written from inside the handler.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_signals(
    stop: threading.Event,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    *,
    on_signal: Callable[[str], None] | None = None,
) -> Iterator[threading.Event]:
    """For the block: each of ``signals`` sets ``stop`` and has ``on_signal(name)`` called (in a thread of the block,
    before the block ends) instead of killing.

    Must be entered in the main thread (where Python runs handlers, and alone may set the wakeup socket).
    """
    watched = {int(signum) for signum in signals}
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)  # set_wakeup_fd's requirement: the C handler never blocks on it

    def handler(_signum: int, _frame: Any) -> None:  # the main thread, between two bytecodes: the event alone
        stop.set()

    def report() -> None:  # the block's thread: every signal caught, in order, until the block ends (a 0 byte)
        while True:
            for signum in wake_r.recv(64):
                if signum == 0:
                    return
                if signum in watched:
                    stop.set()
                    if on_signal is not None:
                        on_signal(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, handler) for signum in signals}
    previous_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    reporter = threading.Thread(target=report, name="signals", daemon=True)
    reporter.start()
    try:
        yield stop
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        signal.set_wakeup_fd(previous_wakeup)
        wake_w.setblocking(True)
        wake_w.send(b"\0")  # after any signal's byte: each one caught in the block is reported before it ends
        reporter.join()
        wake_r.close()
        wake_w.close()
