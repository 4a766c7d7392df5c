"""Counting a connection's round trips to PostgreSQL, from libpq's own trace of the messages it sends.

A round trip is a message the client then waits on: a simple ``Query`` (BEGIN, COMMIT, a statement
without parameters), a ``Sync`` (a statement with parameters, or a pipeline's end), or a ``Flush``
that no ``Sync`` just preceded (a pipeline's results fetched before its end).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import pq

__all__ = ["round_trips"]


@contextmanager
def round_trips(conn: psycopg.Connection) -> Iterator[list[int]]:
    """The round trips ``conn`` makes in the block: ``[count]``, set when the block ends."""
    counted = [0]
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            conn.pgconn.untrace()
            trace.seek(0)
            sent = [line.split("\t")[2] for line in trace.read().splitlines() if line.startswith("F\t")]
    counted[0] = sum(
        1
        for i, message in enumerate(sent)
        if message.startswith("Query") or message == "Sync" or (message == "Flush" and sent[i - 1 : i] != ["Sync"])
    )
