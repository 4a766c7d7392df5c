"""Small PostgreSQL helpers shared by every layer: the server clock and advisory locks.

Decisions about expiry, staleness and retry schedules use PostgreSQL's clock, never the
worker's: read it once per run with :func:`server_now` and pass it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import psycopg


def server_now(conn: psycopg.Connection) -> datetime:
    """PostgreSQL's ``now()``: the start of the current transaction on the server's clock."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


@contextmanager
def advisory_lock(conn: psycopg.Connection, name: str) -> Iterator[bool]:
    """Hold the session-level advisory lock called ``name`` for the block, if it is free.

    Yields True when this session got the lock, False when another session holds it (the
    caller then skips its run). The lock dies with the session, so a crashed runner never
    leaves it behind. ``conn`` should be in autocommit mode: the lock outlives transactions.
    """
    row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (name,)).fetchone()
    acquired = bool(row and row[0])
    try:
        yield acquired
    finally:
        if acquired and not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))
