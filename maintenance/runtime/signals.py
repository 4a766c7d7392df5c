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
"""

from __future__ import annotations

import signal
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
    """For the block: each of ``signals`` sets ``stop`` (then calls ``on_signal(name)``) instead of killing.

    Must be entered in the main thread (Python delivers signals there only).
    """

    def handler(signum: int, _frame: Any) -> None:
        stop.set()
        if on_signal is not None:
            on_signal(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield stop
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
