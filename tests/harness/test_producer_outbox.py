"""A producer's publish in its own transaction (harness.publish_in_transaction): on RabbitMQ through the outbox and the relay.

The producer writes its own row and the job in one transaction on its own connection; the job reaches
the broker only through the relay (a worker on the broker relays its queue between batches), and only
if the producer committed. The relay dying between the broker's confirm and its outbox delete is made,
never waited for (``Crashing``; the lease back-dated): the broker then holds the job twice, with one
job id, and the consumer's fence absorbs the second delivery.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from support.factories import QUEUE, TENANT
from support.harness_support import expire_leases, fences, points, scalar
from support.relay_support import Crashing

import harness
from harness.consumer.consumer import JobContext
from harness.queue.pgqueue import PgQueue
from harness.queue.port import InvalidPayload
from harness.queue.relay import Relay

ORDERS = "CREATE TABLE IF NOT EXISTS public.orders (id uuid PRIMARY KEY, member_id text NOT NULL)"


class Ledger:
    """The loyalty ledger: agrees to every credit, counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def confirm(self, payload: object, ctx: JobContext) -> None:
        self.calls += 1


def outbox(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM core.queue_messages")


def place_order(database_url: str, member: str, *, commit: bool) -> uuid.UUID:
    """The producer: its order row and the job crediting it, in one transaction of its own connection."""
    order = uuid.uuid4()
    with psycopg.connect(database_url) as producer:  # not autocommit: the transaction begins with the first statement
        producer.execute(ORDERS)
        producer.execute("INSERT INTO public.orders VALUES (%s, %s)", (order, member))
        harness.publish_in_transaction(
            producer,
            QUEUE,
            {"member_id": member, "points": 5},
            job_id=order,
            tenant_id=TENANT,
            correlation_id=f"order-{order}",
        )
        producer.commit() if commit else producer.rollback()
    return order


def test_a_committed_publish_is_relayed_to_rabbitmq_and_processed_exactly_once(database_url, conn, rabbit_target):
    """Committed with the producer's row: one outbox row; the worker on the broker relays it (published once) and credits it once."""
    order = place_order(database_url, "m-1", commit=True)
    assert outbox(conn) == 1 and rabbit_target.ready(QUEUE) == 0  # in the outbox, not yet on the broker

    ledger = Ledger()
    stats = rabbit_target.run_worker(ledger)

    assert (stats.processed, stats.duplicates, ledger.calls) == (1, 0, 1)
    assert (points(conn, "m-1"), fences(conn, order), outbox(conn)) == (5, 1, 0)
    assert rabbit_target.take(QUEUE) == []  # nothing left on the broker: it was published once


def test_the_relay_publishes_the_message_as_the_producer_wrote_it(database_url, conn, rabbit_target):
    """Same job id, tenant, correlation id and payload on the broker as in the producer's call."""
    order = place_order(database_url, "m-2", commit=True)
    Relay(PgQueue(conn, worker="relay"), rabbit_target.port(), [QUEUE]).run_once()
    (delivery,) = rabbit_target.take(QUEUE)
    envelope = delivery.envelope
    assert (envelope.job_id, envelope.tenant_id, envelope.correlation_id) == (order, TENANT, f"order-{order}")
    assert envelope.payload == {"member_id": "m-2", "points": 5}
    assert outbox(conn) == 0


def test_a_rolled_back_publish_is_never_published(database_url, conn, rabbit_target):
    """Rolled back with the producer's row: no outbox row, the relay publishes nothing, nothing is credited."""
    place_order(database_url, "m-3", commit=False)
    assert outbox(conn) == 0
    assert Relay(PgQueue(conn, worker="relay"), rabbit_target.port(), [QUEUE]).run_once().published == 0
    assert rabbit_target.ready(QUEUE) == 0
    ledger = Ledger()
    assert rabbit_target.run_worker(ledger).processed == 0 and ledger.calls == 0
    assert points(conn, "m-3") == 0


def test_a_relay_killed_after_the_brokers_confirm_loses_nothing_and_the_fence_makes_it_one_effect(
    database_url, conn, rabbit_target
):
    """The relay dies after the broker confirmed the job, before deleting its row: the row is published again once its
    lease is over, with the same job id; the worker gets both copies — one credit, one Duplicate — and the outbox is empty."""
    order = place_order(database_url, "m-4", commit=True)
    with pytest.raises(KeyboardInterrupt):
        Relay(PgQueue(conn, worker="relay"), Crashing(rabbit_target.port()), [QUEUE]).run_once()
    assert (rabbit_target.ready(QUEUE), outbox(conn)) == (1, 1)  # on the broker, and still leased in the outbox
    expire_leases(conn)  # the dead relay's lease runs out

    ledger = Ledger()
    stats = rabbit_target.run_worker(ledger)

    assert (stats.processed, stats.duplicates) == (1, 1)
    assert (points(conn, "m-4"), fences(conn, order), ledger.calls, outbox(conn)) == (5, 1, 1, 0)
    assert rabbit_target.take(QUEUE) == []


def test_an_autocommit_connection_outside_a_transaction_is_refused_and_nothing_is_written(database_url, conn):
    """Outside `with conn.transaction():` an autocommit connection has no transaction to join: NoTransaction, no row."""
    with psycopg.connect(database_url, autocommit=True) as producer:
        with pytest.raises(harness.NoTransaction, match=r"conn\.transaction"):
            harness.publish_in_transaction(producer, QUEUE, {"member_id": "m-5", "points": 1})
        with producer.transaction():
            job = harness.publish_in_transaction(producer, QUEUE, {"member_id": "m-5", "points": 1})
    assert scalar(conn, "SELECT job_id FROM core.queue_messages") == job


def test_a_payload_the_outbox_cannot_store_is_refused_before_any_write(database_url, conn):
    """A payload jsonb refuses raises InvalidPayload; the producer's transaction is still usable and commits its row."""
    with psycopg.connect(database_url) as producer:
        producer.execute(ORDERS)
        producer.execute("INSERT INTO public.orders VALUES (%s, 'm-6')", (uuid.uuid4(),))
        with pytest.raises(InvalidPayload):
            harness.publish_in_transaction(producer, QUEUE, {"bad": "\ud800"})
        producer.commit()
    assert (outbox(conn), scalar(conn, "SELECT count(*) FROM public.orders")) == (0, 1)


def test_a_publish_given_no_job_id_mints_a_time_ordered_one(database_url, conn):
    """With no ``job_id`` the outbox row gets a UUID version 7 (harness.new_job_id), later publishes sorting after."""
    with psycopg.connect(database_url) as producer:
        first = harness.publish_in_transaction(producer, QUEUE, {"member_id": "m-7", "points": 1})
        producer.commit()
    with psycopg.connect(database_url) as producer:
        second = harness.publish_in_transaction(producer, QUEUE, {"member_id": "m-7", "points": 1})
        producer.commit()
    assert (first.version, second.version) == (7, 7)
    assert first.bytes[:6] <= second.bytes[:6]  # the millisecond leads
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages WHERE job_id IN (%s, %s)", (first, second)) == 2
