"""A pipelined round trip (harness/pipelined.py) whose server goes away mid-pipeline leaves its connection closed, so
every caller's lost-connection check (harness.reconnect.is_lost) sees the outage and reconnects instead of taking it
for a failed statement (the relay's reconnect tests met this: "cannot exit pipeline mode while busy")."""

from __future__ import annotations

import threading

import psycopg
import pytest
from support.waiting import wait_until

from harness.pipelined import transaction_begun_with, transaction_in_one_round_trip
from harness.reconnect import is_lost

# Holds the pipeline busy on the server until the test terminates the backend (seconds it would sleep otherwise).
BUSY = ("SELECT pg_sleep(30)", None)


def terminate_while_busy(database_url: str, conn: psycopg.Connection) -> threading.Thread:
    """Terminates ``conn``'s backend once it is inside the pipeline's sleep (a failover, an operator, a restart)."""
    pid = conn.info.backend_pid

    def terminate() -> None:
        with psycopg.connect(database_url, autocommit=True) as other:
            wait_until(
                lambda: (
                    other.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'", (pid,)
                    ).fetchone()
                    is not None
                ),
                what="the pipeline's statement running",
            )
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    thread = threading.Thread(target=terminate, daemon=True)
    thread.start()
    return thread


def test_a_transaction_in_one_round_trip_cut_mid_pipeline_raises_and_leaves_the_connection_lost(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        thread = terminate_while_busy(database_url, conn)
        with pytest.raises(psycopg.OperationalError):
            transaction_in_one_round_trip(conn, ("SELECT 1", None), BUSY, ("SELECT 2", None))
        thread.join(30)
        assert is_lost(conn)


def test_a_transaction_begun_in_one_round_trip_cut_mid_pipeline_raises_and_leaves_the_connection_lost(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        thread = terminate_while_busy(database_url, conn)
        with pytest.raises(psycopg.OperationalError), transaction_begun_with(conn, ("SELECT 1", None), BUSY):
            pass
        thread.join(30)
        assert is_lost(conn)
