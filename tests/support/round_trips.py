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

__all__ = ["protocol_trace", "round_trips"]


@contextmanager
def protocol_trace(conn: psycopg.Connection) -> Iterator[list[str]]:
    """The protocol messages ``conn`` exchanges inside the block, as libpq traces them: one line each, "F" sent, "B" received."""
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield lines
        finally:
            conn.pgconn.untrace()
            trace.seek(0)
            lines.extend(trace.read().splitlines())


@contextmanager
def round_trips(conn: psycopg.Connection) -> Iterator[list[int]]:
    """The round trips ``conn`` makes in the block: ``[count]``, set when the block ends."""
    counted = [0]
    with protocol_trace(conn) as lines:
        yield counted
    sent = [line.split("\t")[2] for line in lines if line.startswith("F\t")]
    counted[0] = sum(
        1
        for i, message in enumerate(sent)
        if message.startswith("Query") or message == "Sync" or (message == "Flush" and sent[i - 1 : i] != ["Sync"])
    )
