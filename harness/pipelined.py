"""Transactions whose BEGIN travels with their first statements: one round trip instead of two or more.

psycopg's ``conn.transaction()`` sends ``BEGIN`` alone and waits for it; in pipeline mode it even
syncs around it. :func:`transaction_begun_with` queues ``BEGIN`` and the given statements in one
pipeline and sends them with a single Sync, so the server runs them in order, each with its own
snapshot (READ COMMITTED, as if sent one by one), and the client waits once. The statements must
not depend on each other's results on the client side (each may read what an earlier one wrote
in the database, e.g. a transaction-local setting). Their results are in the cursors yielded.

The ``COMMIT`` is *not* pipelined: it is sent when the block ends, alone, after the caller has
seen the results — so only a live client commits (a statement left waiting on a lock by a worker
that died is rolled back with its session: the server reads the end of the connection, not a
COMMIT queued behind the statement). An exception in the block, or an error of any statement,
rolls the transaction back.

:func:`transaction_in_one_round_trip` queues the ``COMMIT`` too, for a transaction whose outcome
does not depend on what the client sees: the server commits it even if the client is gone by
then, so use it only where a commit after the worker's death is as good as one just before it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["Statement", "transaction_begun_with", "transaction_in_one_round_trip"]

# One statement to queue: its SQL and its parameters (None: none).
Statement = tuple[str, Mapping[str, Any] | None]


@contextmanager
def transaction_begun_with(conn: psycopg.Connection, *statements: Statement) -> Iterator[list[psycopg.Cursor[Any]]]:
    """A transaction on ``conn`` (autocommit, idle) opened by ``BEGIN`` and ``statements`` in one round trip.

    Yields their cursors, results already in; commits at the end of the block (one more round
    trip), rolls back on an exception.
    """
    with ExitStack() as transaction:
        with conn.pipeline():
            # Entered inside the pipeline, the transaction's BEGIN is only queued; conn.transaction()
            # would sync the pipeline around it, a round trip of its own.
            transaction.enter_context(psycopg.Transaction(conn))
            cursors = [conn.execute(query, params) for query, params in statements]
        yield cursors


def transaction_in_one_round_trip(conn: psycopg.Connection, *statements: Statement) -> list[psycopg.Cursor[Any]]:
    """``BEGIN``, ``statements`` and ``COMMIT`` on ``conn`` (autocommit, idle) in one round trip.

    Returns their cursors, results in. An error of any statement rolls the whole of it back
    (the pipeline skips the rest, the server's transaction is aborted) and is raised.
    """
    try:
        with conn.pipeline(), psycopg.Transaction(conn):
            cursors = [conn.execute(query, params) for query, params in statements]
    except BaseException:
        # The transaction had queued its COMMIT before the pipeline's sync brought the error back,
        # so the server's transaction is still open, aborted: end it.
        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                # The server went away mid-pipeline (a terminated backend: the pipeline cannot even be left,
                # "cannot exit pipeline mode while busy"): the connection is unusable, so it is closed, and every
                # caller's lost-connection check (closed or broken) sees it and reconnects.
                conn.close()
        raise
    return cursors
