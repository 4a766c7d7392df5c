"""Waits a signal can end, whichever thread the kernel hands the signal to.

A process-directed signal (``kill PID``, a pod's SIGTERM) runs Python's C-level handler in whichever of the
process's threads the kernel picks; the Python handler (the one setting a stop event) runs only in the main
thread, and only once that thread executes bytecode again. A main thread blocked in a plain ``Event.wait()`` or
``Thread.join()`` does not: if the signal landed in another thread, it is not handled until the wait ends — for a
worker joining its threads, never (stop 33's CI failure: a ``core-jobs worker`` that did not stop on SIGTERM).

So the waits of a process's main thread — a worker or worker group joining its threads, the outbox relay between
runs, ``core-jobs serve`` until stopped — go through :func:`wait` and :func:`join`, which in the main thread
wait in slices of :data:`SLICE_S`: a signal is handled within one slice. In any other thread they are the plain
waits (no handler can run there anyway).

In the main thread :func:`wait` never takes the event's lock: it sleeps and reads ``is_set()``, which takes none.
The handler's ``stop.set()`` takes that lock, and runs in the main thread between two bytecodes — had the main
thread been inside ``Event.wait`` holding it (a few microseconds at each slice's start and end), the handler would
wait for itself forever. The price: a ``set()`` from another thread is seen within a slice, not at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

__all__ = ["SLICE_S", "join", "wait"]

# The longest the main thread waits in one piece: how late, at most, a signal another thread caught is handled.
SLICE_S = 0.1


def wait(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)``, in slices in the main thread: True once set, False after ``timeout`` seconds."""
    if threading.current_thread() is not threading.main_thread():
        return event.wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not event.is_set():
        slice_s = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        if slice_s <= 0:
            return False
        time.sleep(slice_s)
    return True


def join(threads: Iterable[threading.Thread]) -> None:
    """Join every one of ``threads``, in slices in the main thread."""
    in_main = threading.current_thread() is threading.main_thread()
    for thread in threads:
        while thread.is_alive():
            thread.join(SLICE_S if in_main else None)
