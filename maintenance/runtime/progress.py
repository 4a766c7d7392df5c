"""Progress of a long loop over items, logged at info every interval: items done of the total, the
rate so far and an estimate of the seconds left.

Why: a run that takes minutes prints nothing between its start and its end otherwise, and an
operator cannot tell a slow run from a stuck one. The shape is the one of
``maintenance.purge.progress`` (``elapsed_s``, ``rate`` per second, ``estimate_left_s``), so one
log query charts them all. The caller logs each report at info
under a literal event name; the clock is injected (a monotonic reading per item, never a sleep), so
tests drive it; the interval comes from the job's ``*_progress_interval`` setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Report(NamedTuple):
    """One progress report: the fields of a ``*.progress`` event."""

    items_done: int
    items_total: int
    elapsed_s: float
    rate: float  # items per second so far
    estimate_left_s: float | None  # None before any rate


class Progress:
    """A report when at least ``interval_s`` passed since the start or the last report.

    The caller logs it, under its own literal event name (the events reference reads them).
    """

    def __init__(self, *, total: int, interval_s: float, monotonic: Callable[[], float]) -> None:
        self._total = total
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._began = self._last = monotonic()

    def due(self, done: int) -> Report | None:
        """``done`` items are finished: a report if the interval has passed (one clock reading)."""
        now = self._monotonic()
        if now - self._last < self._interval_s:
            return None
        self._last = now
        elapsed = now - self._began
        rate = done / elapsed if elapsed > 0 else 0.0
        left = max(self._total - done, 0)
        return Report(done, self._total, round(elapsed, 1), round(rate, 2), round(left / rate, 1) if rate > 0 else None)
