"""After a lost database connection: the bounded, capped backoff of reconnecting, and when to give up.

A connection is **lost** (:func:`is_lost`) when psycopg says it is closed or broken: a failover, a server
restart, a terminated backend, a network cut. What lost it is an outage to wait out, not a failure of the
process: a worker's thread (harness/worker.py) and the outbox relay (:meth:`harness.queue.relay.Relay.run`) each
keep one :class:`Outage` per connection, try again after each of :data:`BACKOFF_S` (the last one repeated),
and give up with :class:`DatabaseUnavailable` once ``reconnect_for`` has passed since the connection was
lost. Each caller logs and counts the loss and each failed try under its own events (``harness.worker.*``,
``harness.relay.*``); the state and the arithmetic are shared here.
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg

from harness.errors import describe_error

__all__ = ["BACKOFF_S", "DatabaseUnavailable", "Outage", "is_lost"]

# The waits between attempts to reconnect after a connection was lost: growing, capped.
BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class DatabaseUnavailable(ConnectionError):
    """The database could not be reached again for ``reconnect_for``: the process (or the worker) gives up."""


def is_lost(conn: psycopg.Connection) -> bool:
    """Whether ``conn`` can no longer be used: closed, or broken by a lost server or network."""
    return bool(conn.closed or conn.broken)


class Outage:
    """One connection's outage: since when it is lost (``time.monotonic``), and how many tries to reconnect failed."""

    def __init__(self, reconnect_for: timedelta) -> None:
        self.reconnect_for = reconnect_for
        self.since: float | None = None  # None while connected
        self.failures = 0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def begin(self) -> bool:
        """The connection is lost (now, unless an outage is already ongoing); True when it just began."""
        if self.since is not None:
            return False
        self.since, self.failures = time.monotonic(), 0
        return True

    def failed(self, exc: BaseException) -> tuple[int, float]:
        """A try to reconnect failed with ``exc``: (this try's number, the wait before the next).

        Raises :class:`DatabaseUnavailable`, saying how long, once ``reconnect_for`` has passed since :meth:`begin`.
        """
        self.begin()
        assert self.since is not None
        waited = time.monotonic() - self.since
        if waited >= self.reconnect_for.total_seconds():
            raise DatabaseUnavailable(
                f"the database could not be reached again for {waited:.0f} s (reconnect_for"
                f" {self.reconnect_for}): {describe_error(exc)}"
            ) from None
        delay = BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]
        self.failures += 1
        return self.failures, delay

    def end(self) -> tuple[float, int] | None:
        """Connected again: (seconds the outage lasted, tries it took), or None if none was ongoing."""
        if self.since is None:
            return None
        lasted = (round(time.monotonic() - self.since, 3), self.failures + 1)
        self.since, self.failures = None, 0
        return lasted
