"""The in-memory queue as a consumer's tests use it (harness/queue/memory.py): a worker on ``memory://<name>``, and a
broker clock that moves only when the test says so — retries and leases without waiting."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from support.factories import TENANT
from support.harness_support import TTL, points

from harness.consumer.retry import RetryPolicy
from harness.examples.points import OutageLedger, make_consumer
from harness.metrics import HarnessMetrics
from harness.queue.adapters import adapter_reference
from harness.queue.memory import MemoryBroker, MemoryQueue, memory_broker
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig

QUEUE = "points.credit"


def credit(member: str, n: int) -> Envelope:
    return Envelope(job_id=uuid.uuid4(), payload={"member_id": member, "points": n}, tenant_id=TENANT)


def worker_on(database_url: str, url: str, consumer) -> tuple[Worker, HarnessMetrics]:
    metrics = HarnessMetrics(CollectorRegistry())
    config = WorkerConfig(fence_ttl=TTL, poll_interval=timedelta(milliseconds=20))
    return Worker(database_url, consumer, policy=RetryPolicy(), config=config, metrics=metrics, queue_url=url), metrics


def test_memory_url_selects_the_in_memory_queue():
    assert adapter_reference("memory://orders") == "harness.queue.memory:MemoryQueue"


def test_a_worker_on_a_memory_url_credits_what_was_published_on_the_broker_of_that_name(database_url, conn):
    name = f"t-{uuid.uuid4().hex[:8]}"
    MemoryQueue(memory_broker(name), conn).publish(QUEUE, credit("m-1", 5))
    worker, _metrics = worker_on(database_url, f"memory://{name}", make_consumer())
    stats = worker.run(once=True)
    assert (stats.processed, points(conn, "m-1")) == (1, 5)
    assert (memory_broker(name).ready(QUEUE), memory_broker(name).in_flight(QUEUE)) == (0, 0)


def test_a_retry_waits_for_the_broker_clock_and_not_for_time(database_url, conn):
    """The ledger times out once: the retry is delayed by the policy's backoff, ready only once the clock moves past it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    hub = memory_broker(name)
    MemoryQueue(hub, conn).publish(QUEUE, credit("m-late", 2))
    consumer = make_consumer(OutageLedger(timeouts={"m-late": 1}))
    worker, _metrics = worker_on(database_url, f"memory://{name}", consumer)
    assert worker.run(once=True).retried == 1
    assert (hub.ready(QUEUE), hub.delayed(QUEUE), points(conn, "m-late")) == (0, 1, 0)
    hub.advance(timedelta(hours=1))
    worker, _metrics = worker_on(database_url, f"memory://{name}", consumer)
    assert worker.run(once=True).processed == 1
    assert points(conn, "m-late") == 2


def test_a_claim_not_settled_within_its_lease_comes_back_redelivered_and_its_late_ack_is_refused(conn):
    hub = MemoryBroker()
    port = MemoryQueue(hub, conn, lease=timedelta(seconds=30))
    port.publish(QUEUE, credit("m-1", 1))
    (first,) = port.claim(QUEUE, 10)
    hub.advance(timedelta(seconds=29))
    assert port.claim(QUEUE, 10) == []
    hub.advance(timedelta(seconds=1))
    (again,) = MemoryQueue(hub, conn).claim(QUEUE, 10)
    assert (again.attempt, again.redelivered, again.envelope.job_id) == (2, True, first.envelope.job_id)
    assert port.ack([first]) == 0


def test_a_payload_comes_back_as_json_reads_it_as_from_a_real_queue(conn):
    """A tuple is a list once it has been through the queue: a consumer's test sees what production would."""
    port = MemoryQueue(MemoryBroker(), conn)
    port.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"ids": (1, 2)}, tenant_id=TENANT))
    (delivery,) = port.claim(QUEUE, 1)
    assert delivery.envelope.payload == {"ids": [1, 2]}


def test_figures_are_the_ready_messages_and_the_oldest_ones_age_on_the_broker_clock(conn):
    hub = MemoryBroker()
    port = MemoryQueue(hub, conn)
    port.publish(QUEUE, credit("m-1", 1))
    port.publish(QUEUE, credit("m-2", 1), delay=timedelta(minutes=5))
    hub.advance(timedelta(seconds=90))
    assert port.figures(QUEUE) == (1, 90.0)


def test_a_dead_letter_on_a_port_without_a_connection_says_where_letters_go():
    port = MemoryQueue(MemoryBroker())
    port.publish(QUEUE, credit("m-1", 1))
    (delivery,) = port.claim(QUEUE, 1)
    letter = delivery.letter("points.credit", attempts=1, last_error="PermanentError: no member")
    with pytest.raises(ValueError, match="writes its dead letters in PostgreSQL: open it on a connection"):
        port.dead_letter(delivery, letter)
