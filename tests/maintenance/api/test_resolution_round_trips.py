"""A resolution's transaction in as few round trips as its checks allow (maintenance/operations/resolution.py).

The API's latency under 8 operators on 2 cores was mostly waiting — each round trip a wakeup of
PostgreSQL and of the API's thread — so the new token is drawn with the reads, in one round trip
after the BEGIN; the writes are a second; then the commit (its WAL flush).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.factories import add_execution
from support.resolutions import UNCERTAIN_NOTIFY
from support.round_trips import round_trips


def resolve(conn, execution_id, key="key-1", notification_id=1):
    from harness.examples.ledger_points import consumer as example
    from maintenance.operations.resolution import Evidence, Resume, resolve

    name = "points.ledger"  # add_execution's consumer, published as the example's actions
    return resolve(
        conn,
        execution_id=execution_id,
        idempotency_key=key,
        operator="ops:ana",
        command=Resume(
            results=(("notify", {"notification_id": notification_id}),),
            evidence=Evidence("RESULT_VERIFIED", "CASE-1", "seen sent in the provider's console"),
        ),
        consumers={name: replace(example, name=name)},
        scopes=frozenset({"loyalty"}),
    )


def test_a_resolution_is_four_round_trips_begin_the_reads_the_writes_and_the_commit(conn):
    """A RESUME applied: BEGIN, the locked reads with the new token in one round trip, the writes in one, the commit."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    with round_trips(conn) as counted:
        outcome = resolve(conn, execution_id)
    assert not outcome.replayed and outcome.body["status"] == "PENDING"
    assert counted == [4]


def test_an_idempotent_replay_is_three_round_trips_and_writes_nothing(conn):
    """The same key again: BEGIN, the reads in one round trip, then the commit of a transaction that wrote nothing."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    first = resolve(conn, execution_id)
    with round_trips(conn) as counted:
        again = resolve(conn, execution_id)
    assert again.replayed and again.body == first.body
    assert counted == [3]


def test_a_refused_resolution_is_three_round_trips_and_rolls_back(conn):
    """A refusal after the reads (here: not awaiting resolution): BEGIN, the reads, the rollback; nothing written."""
    from maintenance.operations.resolution import ResolutionRefused

    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    resolve(conn, execution_id)
    with round_trips(conn) as counted, pytest.raises(ResolutionRefused, match="not RECONCILIATION_REQUIRED"):
        resolve(conn, execution_id, key="key-2")
    assert counted == [3]
    assert conn.info.transaction_status.name == "IDLE"
