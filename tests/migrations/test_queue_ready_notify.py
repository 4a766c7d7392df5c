"""Every way a message of the reference queue becomes ready now is announced: NOTIFY core_jobs_queue_ready, '<queue>'
(migration 0024), once per queue and transaction, at commit; what is not ready now (a delay, a claim) is not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from importlib import import_module

import psycopg
import pytest
from support.factories import QUEUE, TENANT, dead_letter, publish

from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.queue.wakeup import CHANNEL
from maintenance.operations.dead_letters import replay

END = "-end-"
OTHER = "other.queue"


@pytest.fixture
def listener(database_url) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def announced(listener: psycopg.Connection, conn: psycopg.Connection) -> list[str]:
    """The queues announced so far, in order: everything before a marker notified now (delivered in commit order)."""
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, END))
    payloads = []
    for notify in listener.notifies(timeout=10):
        if notify.payload == END:
            return payloads
        payloads.append(notify.payload)
    raise AssertionError(f"the end marker never came: {payloads}")


def message(member: str) -> Envelope:
    return Envelope(job_id=uuid.uuid4(), payload={"member_id": member, "points": 1}, tenant_id=TENANT)


def test_the_harness_listens_on_the_channel_the_migration_notifies():
    assert import_module("migrations.versions.0024_queue_ready_notify").CHANNEL == CHANNEL


def test_a_publish_ready_now_is_announced_with_its_queue(listener, conn):
    publish(conn, {"member_id": "m-1", "points": 1})
    assert announced(listener, conn) == [QUEUE]


def test_a_delayed_publish_is_not_announced(listener, conn):
    publish(conn, {"member_id": "m-1", "points": 1}, delay=timedelta(minutes=5))
    assert announced(listener, conn) == []


def test_a_copy_is_announced_once_per_queue(listener, conn):
    PgQueue(conn).publish_many([(QUEUE, message("m-1")), (OTHER, message("m-2")), (QUEUE, message("m-3"))])
    assert sorted(announced(listener, conn)) == sorted([QUEUE, OTHER])


def test_a_delayed_copy_is_not_announced(listener, conn):
    PgQueue(conn).publish_many([(QUEUE, message("m-1"))], delay=timedelta(minutes=5))
    assert announced(listener, conn) == []


def test_many_publishes_in_one_transaction_are_one_announcement_at_commit(listener, conn):
    with conn.transaction():
        for member in ("m-1", "m-2", "m-3"):
            publish(conn, {"member_id": member, "points": 1})
        assert list(listener.notifies(timeout=0)) == []  # nothing before the commit
    assert announced(listener, conn) == [QUEUE]


def test_a_rolled_back_publish_is_not_announced(listener, conn):
    with pytest.raises(RuntimeError), conn.transaction():
        publish(conn, {"member_id": "m-1", "points": 1})
        raise RuntimeError("rolled back")
    assert announced(listener, conn) == []


def test_a_replay_is_announced(listener, conn):
    letter_id, _job_id = dead_letter(conn, {"member_id": "m-1", "points": 1})
    announced(listener, conn)
    replay(conn, [letter_id], operator="ana")
    assert announced(listener, conn) == [QUEUE]


def test_a_claim_is_not_announced_and_a_release_is(listener, conn):
    publish(conn, {"member_id": "m-1", "points": 1})
    publish(conn, {"member_id": "m-2", "points": 1})
    announced(listener, conn)
    queue = PgQueue(conn)
    deliveries = queue.claim(QUEUE, 10)
    assert announced(listener, conn) == []
    assert queue.release(deliveries) == 2
    assert announced(listener, conn) == [QUEUE]


@pytest.mark.parametrize(("delay", "expected"), [(timedelta(0), [QUEUE]), (timedelta(seconds=30), [])])
def test_a_retry_is_announced_only_when_it_is_ready_now(listener, conn, delay, expected):
    publish(conn, {"member_id": "m-1", "points": 1})
    queue = PgQueue(conn)
    (delivery,) = queue.claim(QUEUE, 10)
    announced(listener, conn)
    assert queue.retry(delivery, delay, "TransientError: try again")
    assert announced(listener, conn) == expected


def test_an_update_of_a_waiting_message_is_not_announced_again(listener, conn):
    publish(conn, {"member_id": "m-1", "points": 1})
    announced(listener, conn)
    conn.execute("UPDATE core.queue_messages SET correlation_id = 'c-1'")
    assert announced(listener, conn) == []
