"""Cooperative shutdown: a SIGTERM asks the running jobs to stop after the batch in hand.

`core-jobs serve` and `core-jobs run-once` call :func:`request_stop` when they are told to stop
(SIGTERM from Kubernetes: a deploy, a node drain, a CronJob's activeDeadlineSeconds). Batch
loops — the purge — check :func:`stop_requested` before each batch and end the run cleanly,
reporting what is left, just as when their time budget runs out; `run-once` starts no further
job. The flag is per process.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_requested = threading.Event()


def request_stop() -> None:
    _requested.set()


def stop_requested() -> bool:
    return _requested.is_set()


def clear() -> None:
    _requested.clear()


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """For the block: SIGTERM requests a cooperative stop instead of killing the process."""

    def on_sigterm(_signum: int, _frame: Any) -> None:
        request_stop()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        clear()
