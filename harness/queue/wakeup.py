"""Waking idle workers of the reference queue on NOTIFY, with polling as the fallback.

An idle worker thread used to wait ``poll_interval`` between empty claims, so a job published while
it waited was picked up up to that late. The database announces every message that becomes ready
now — ``NOTIFY core_jobs_queue_ready, '<queue>'`` from triggers on ``core.queue_messages``
(migration 0024: an INSERT or a COPY, a replay, a retry with no delay, a release), delivered when the
writing transaction commits. A :class:`Wakeup` holds **one listening connection per worker
process** (not per thread), ``LISTEN``s on that channel in a thread of its own, and wakes the
threads waiting on the queue named: :meth:`Wakeup.wait` returns on a notification for its queue,
on :meth:`Wakeup.close` (the worker stopping), or after the timeout (``poll_interval``: the polling
that still finds what is never announced — a delayed message falling due, an expired lease).

No extra load when idle: the listening connection sends nothing while it waits, and the threads
poll no more often than before. A wait returns at once if a notification for its queue came since
the same thread last returned from one (it arrived while the thread was claiming or working), so
none is lost in between; at worst that costs one empty claim.

A lost listening connection (a restart, a terminated backend) is not the worker's failure: the
threads go on polling (``harness.worker.listen_lost``), and the listener reconnects with a growing,
capped backoff and listens again (``harness.worker.listening``), waking every waiter once, since
what was announced meanwhile was missed. TCP keepalives on it notice a silently dead peer.

Only for the reference queue: a broker pushes its messages to the worker itself.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from contextlib import suppress

import psycopg
import structlog

from harness.errors import describe_error
from harness.pg import connect

__all__ = ["CHANNEL", "Wakeup"]

log = structlog.get_logger()

# The channel the triggers of migration 0024 notify; the payload is the queue's name.
CHANNEL = "core_jobs_queue_ready"

# The waits between attempts to listen again after the listening connection was lost: growing, capped.
RELISTEN_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)

# A dead peer is noticed by TCP keepalives within about a minute, sending no query.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


class Wakeup:
    """A listening connection on :data:`CHANNEL` and the waits it ends early; :meth:`start` it, :meth:`close` it."""

    def __init__(
        self,
        conninfo: str,
        *,
        application_name: str = "core-jobs-worker/listen",
        connect_timeout: float = 5,
        connector: Callable[..., psycopg.Connection] = connect,
    ) -> None:
        self.conninfo = conninfo
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self._connect = connector
        self._cond = threading.Condition()
        self._announced: dict[str, int] = {}  # queue: notifications received for it (all queues: under "")
        self._seen = threading.local()  # per thread: {queue: the count when this thread last returned from wait}
        self._closed = False
        self._listening = threading.Event()  # set while LISTEN is in effect on a live connection
        self._wake_r, self._wake_w = socket.socketpair()  # close() ends the listener's select at once
        self._thread = threading.Thread(target=self._listen_loop, name="worker-listen", daemon=True)

    @property
    def listening(self) -> bool:
        """Whether LISTEN is in effect now (False: lost, reconnecting — the waits are plain polling)."""
        return self._listening.is_set()

    def start(self) -> Wakeup:
        self._thread.start()
        return self

    def close(self) -> None:
        """Wake every waiter now and stop listening (its connection is closed by the listener thread)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        with suppress(OSError):
            self._wake_w.send(b"x")

    def join(self, timeout: float | None = None) -> None:
        """Wait for the listener thread to end (after :meth:`close`)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait(self, queue: str, timeout: float) -> None:
        """Until a message of ``queue`` is announced ready, :meth:`close`, or ``timeout`` seconds, whichever first."""
        seen: dict[str, int] = self._seen.__dict__.setdefault("counts", {})
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._count(queue) != seen.get(queue, 0), timeout)
            seen[queue] = self._count(queue)

    def _count(self, queue: str) -> int:
        return self._announced.get(queue, 0) + self._announced.get("", 0)

    def _announce(self, queues: set[str]) -> None:
        with self._cond:
            for queue in queues:
                self._announced[queue] = self._announced.get(queue, 0) + 1
            self._cond.notify_all()

    def _listen_loop(self) -> None:
        failures = 0
        try:
            while not self._closed:
                try:
                    with self._connect(
                        self.conninfo,
                        autocommit=True,
                        application_name=self.application_name,
                        connect_timeout=self.connect_timeout,
                        **KEEPALIVES,
                    ) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        self._listening.set()
                        if failures:
                            log.info("harness.worker.listening", attempts=failures + 1)
                            self._announce({""})  # what was announced while we were not listening was missed
                        failures = 0
                        self._receive(conn)
                except psycopg.Error as exc:
                    self._listening.clear()
                    if self._closed:
                        return
                    delay = RELISTEN_BACKOFF_S[min(failures, len(RELISTEN_BACKOFF_S) - 1)]
                    failures += 1
                    log.warning(
                        "harness.worker.listen_lost", attempt=failures, delay_s=delay, error=describe_error(exc)
                    )
                    with self._cond:
                        self._cond.wait_for(lambda: self._closed, delay)
        finally:
            self._listening.clear()
            self._wake_r.close()
            self._wake_w.close()

    def _receive(self, conn: psycopg.Connection) -> None:
        """Hand the notifications on ``conn`` to the waiters until :meth:`close` (returns) or the connection fails."""
        while not self._closed:
            wake = self._wake_r.fileno()
            readable, _w, _x = select.select([conn.fileno(), wake], [], [])
            if wake in readable:
                return
            queues = {n.payload for n in conn.notifies(timeout=0)}
            if queues:
                self._announce(queues)
