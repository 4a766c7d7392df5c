"""The relay (harness/queue/relay.py): the outbox's rows reach the target once, whatever crashes in between.

The outbox is this test's database (``core.queue_messages``, written by a real replay or a
publish); the target is parametrised (``relay_target``, tests/support/relay_support.py): a
PgQueue on another database standing for the broker, and the real RabbitMQ. Leases are expired by back-dating them,
never by waiting.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import threading
from datetime import timedelta

import pika
import pika.exceptions
import psycopg
import pytest
from support.factories import QUEUE, add_dead_letters, dead_letter, publish
from support.harness_support import TTL, expire_leases, fences, points, replay_state, scalar
from support.relay_support import Crashing
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.examples.points import make_consumer
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import NO_TENANT, Acked, Duplicate, Envelope
from harness.queue.rabbitmq import RabbitQueue, exhausted_queue_name
from harness.queue.relay import RELAY_CONSUMER, Relay
from harness.worker import Worker, WorkerConfig
from maintenance.operations.dead_letters import replay

OTHER_QUEUE = "points.other"
DEEP = "(repeat('[', 150) || repeat(']', 150))"  # valid jsonb Python cannot decode (deeper than 100 levels)


def outbox(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM core.queue_messages")


def test_a_replay_reaches_the_target_as_it_was_published_and_leaves_the_outbox(conn, relay_target):
    """A replayed letter's message arrives on the target with its job id, tenant, correlation id, payload, replay_of and trace context, and its outbox row is gone."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    (letter,) = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1", "points": 5}, traceparent=traceparent)
    (row,) = replay(conn, [letter], operator="ops:ana")

    result = Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once()

    assert (result.published, result.refused, outbox(conn)) == (1, 0, 0)
    (delivered,) = relay_target.take(QUEUE)
    assert delivered.envelope == Envelope(
        job_id=row.job_id,
        payload={"member_id": "m-1", "points": 5},
        tenant_id=row.tenant_id or NO_TENANT,
        correlation_id=row.correlation_id,
        replay_of=letter,
        traceparent=traceparent,
        tracestate=None,
    )
    assert replay_state(conn, letter) == (None, False)  # outstanding until a worker handles the delivery


def test_a_relay_run_counts_what_it_published_and_what_failed_in_its_metrics(conn, relay_target):
    """Three rows relayed: harness_relay_published_total{queue} 3; a run whose publish fails counts a failure."""
    from prometheus_client import CollectorRegistry

    from harness.metrics import HarnessMetrics

    metrics = HarnessMetrics(CollectorRegistry())
    for i in range(3):
        publish(conn, {"member_id": f"m-{i}", "points": i})
    Relay(PgQueue(conn), relay_target.port(), [QUEUE], metrics=metrics).run_once()
    publish(conn, {"member_id": "m-later", "points": 1})

    class Unreachable:
        def publish_many(self, messages, *, delay=timedelta(0)) -> None:
            raise ConnectionError("the broker is down")

    with pytest.raises(ConnectionError):
        Relay(PgQueue(conn), Unreachable(), [QUEUE], metrics=metrics).run_once()  # type: ignore[arg-type]

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"harness_relay_{name}_total", {"queue": QUEUE})

    assert (sample("published"), sample("refused"), sample("leases_lost"), sample("failures")) == (3, 0, 0, 1)


def test_it_relays_batch_after_batch_until_one_comes_back_short(conn, relay_target):
    """Five messages with a batch of two are published in three batches, all of them, in publishing order."""
    jobs = [publish(conn, {"member_id": f"m-{i}", "points": i}) for i in range(5)]
    result = Relay(PgQueue(conn), relay_target.port(), [QUEUE], batch_size=2).run_once()
    assert (result.published, result.batches, outbox(conn)) == (5, 3, 0)
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == jobs


def test_it_relays_only_the_queues_it_serves_and_only_due_messages(conn, relay_target):
    """A message of another queue and one published with a delay stay in the outbox; the due one of its queue goes."""
    due = publish(conn, {"member_id": "m-1", "points": 1})
    publish(conn, {"member_id": "m-2", "points": 2}, delay=timedelta(hours=1))
    publish(conn, {"member_id": "m-3", "points": 3}, queue=OTHER_QUEUE)
    assert Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once().published == 1
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [due]
    assert outbox(conn) == 2


class Refusing:
    """A target whose publish fails (the broker is down): what the relay must survive without losing a row."""

    def publish_many(self, messages, *, delay=timedelta(0)) -> None:
        raise ConnectionError("broker unreachable")


def test_a_failed_publish_gives_the_batch_back_at_once_and_raises(conn, relay_target):
    """The target refusing: the error is raised and logged, the rows are ready again with no attempt used, and the next run publishes them."""
    job = publish(conn, {"member_id": "m-1", "points": 1})
    with pytest.raises(ConnectionError, match="broker unreachable"):
        Relay(PgQueue(conn), Refusing(), [QUEUE]).run_once()
    assert conn.execute("SELECT attempts, lease_token FROM core.queue_messages").fetchall() == [(0, None)]
    assert Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once().published == 1
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [job]


def test_a_crash_between_publish_and_ack_publishes_again_and_the_fence_absorbs_it(conn, relay_target):
    """The relay dies after the publish: once the lease expires the next run publishes the replay again; handled by a worker on the outbox's database, one delivery credits, the other is a Duplicate, the replay is handled."""
    letter, job_id = dead_letter(conn, {"member_id": "m-1", "points": 7})
    replay(conn, [letter], operator="ops:ana")
    with pytest.raises(KeyboardInterrupt):
        Relay(PgQueue(conn), Crashing(relay_target.port()), [QUEUE]).run_once()
    assert outbox(conn) == 1  # still leased to the dead relay
    assert Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once().published == 0  # the lease keeps it
    expire_leases(conn)
    assert Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once().published == 1

    deliveries = relay_target.take(QUEUE)
    assert [d.envelope.job_id for d in deliveries] == [job_id, job_id]
    consumer = make_consumer()
    outcomes = [handle(conn, consumer, d, policy=RetryPolicy(), fence_ttl=TTL) for d in deliveries]
    assert outcomes == [Acked(), Duplicate()]
    assert (points(conn, "m-1"), fences(conn, job_id)) == (7, 1)
    assert replay_state(conn, letter) == ("processed", True)


def test_two_relays_never_publish_the_same_row_while_its_lease_lives(conn, relay_target):
    """A second relay running while the first holds its batch (claimed, not yet acked) finds nothing to publish."""
    publish(conn, {"member_id": "m-1", "points": 1})
    first = PgQueue(conn, worker="relay-1")
    claimed = first.claim(QUEUE, 10)  # the first relay's claim, before its publish
    assert Relay(PgQueue(conn, worker="relay-2"), relay_target.port(), [QUEUE]).run_once().published == 0
    assert len(claimed) == 1 and relay_target.take(QUEUE) == []


def test_a_row_it_cannot_publish_becomes_a_dead_letter_and_blocks_no_other(conn, relay_target, logs):
    """A payload Python cannot decode is dead-lettered with its stored text and the relay's name, logged, and the next row is published."""
    first = publish(conn, {"member_id": "m-0", "points": 0})
    conn.execute(f"UPDATE core.queue_messages SET payload = {DEEP}::jsonb WHERE job_id = %s", (first,))
    stored = scalar(conn, "SELECT payload::text FROM core.queue_messages WHERE job_id = %s", (first,))
    second = publish(conn, {"member_id": "m-1", "points": 1})

    result = Relay(PgQueue(conn), relay_target.port(), [QUEUE]).run_once()

    assert (result.published, result.refused, outbox(conn)) == (1, 1, 0)
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [second]
    letter = conn.execute("SELECT job_id, consumer, payload::text, last_error FROM core.dead_letters").fetchone()
    assert letter[:3] == (first, RELAY_CONSUMER, stored) and "cannot publish" in letter[3]
    assert [e["job_id"] for e in logs.named("harness.relay.refused")] == [str(first)]


def test_the_relay_refuses_to_relay_a_queue_into_itself(conn):
    """A relay whose target is its own source is a configuration error: the reference queue is its own outbox."""
    queue = PgQueue(conn)
    with pytest.raises(ValueError, match="its own outbox"):
        Relay(queue, queue, [QUEUE])


def test_a_worker_on_a_broker_relays_its_own_queues_outbox_at_most_once_per_interval(database_url, conn, relay_target):
    """The worker's hook relays its consumer's queue (not another) to its adapter, then nothing more until its relay_interval has passed."""
    worker = Worker(
        database_url,
        make_consumer(),
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, relay_interval=timedelta(hours=1)),
    )
    first = publish(conn, {"member_id": "m-1", "points": 1})
    publish(conn, {"member_id": "m-2", "points": 2}, queue=OTHER_QUEUE)
    relay = worker._outbox_relay(conn, relay_target.port(), "host:1/0")
    worker._relay_outbox(relay)
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [first]
    publish(conn, {"member_id": "m-3", "points": 3})
    worker._relay_outbox(relay)  # within the interval: not yet
    assert relay_target.take(QUEUE) == [] and outbox(conn) == 2


def test_a_worker_on_the_reference_queue_has_no_outbox_to_relay(database_url, conn):
    """On a PgQueue of the worker's own connection the table is the queue: the hook is a no-op and the message stays for the worker."""
    worker = Worker(database_url, make_consumer(), policy=RetryPolicy(), config=WorkerConfig(fence_ttl=TTL))
    publish(conn, {"member_id": "m-1", "points": 1})
    relay = worker._outbox_relay(conn, PgQueue(conn), "host:1/0")
    worker._relay_outbox(relay)
    assert relay is None and outbox(conn) == 1


def test_the_loop_relays_until_stopped_and_logs_its_start_and_stop(database_url, conn, relay_target, logs):
    """Relay.run in a thread publishes what is in the outbox, stops when its event is set, and logs start and stop with the count."""
    job = publish(conn, {"member_id": "m-1", "points": 1})
    stop = threading.Event()
    with psycopg.connect(database_url, autocommit=True) as relay_conn:
        relay = Relay(PgQueue(relay_conn), relay_target.port(), [QUEUE])
        thread = threading.Thread(target=relay.run, args=(stop,), kwargs={"interval": timedelta(milliseconds=50)})
        thread.start()
        try:
            wait_until(lambda: outbox(conn) == 0, what="the outbox relayed")
        finally:
            stop.set()
            thread.join(timeout=20)
    assert not thread.is_alive()
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [job]
    assert [e["queues"] for e in logs.named("harness.relay.start")] == [[QUEUE]]
    (stopped,) = logs.named("harness.relay.stop")
    assert (stopped["num_published"], stopped["ok"]) == (1, True)


def test_rows_the_broker_confirmed_before_it_refused_one_leave_the_outbox_and_are_not_published_again(conn, rabbit_url):
    """A broker queue full after a few rows of a batch of five (a max-length policy; the adapter's reject-publish)
    refuses the next: the run raises, the rows the broker confirmed leave the outbox and only the others stay; once
    the queue is drained the next run publishes those — each job on the broker once, no batch-mate again."""
    prefix = f"test.review-{secrets.token_hex(6)}."
    policy = f"core-jobs-{prefix}max-length"
    rabbitmqctl("set_policy", "--apply-to", "queues", policy, f"^{re.escape(prefix)}", '{"max-length": 2}')
    port = RabbitQueue(rabbit_url, conn, prefix=prefix)
    consumer = RabbitQueue(rabbit_url, conn, prefix=prefix, worker="test-consumer")

    def drain() -> list:
        ready, taken = consumer.figures(QUEUE)[0], []
        wait_until(lambda: taken.extend(consumer.claim(QUEUE, 10)) or len(taken) >= ready, what=f"{ready} messages")
        assert consumer.ack(taken) == len(taken)
        return [d.envelope.job_id for d in taken]

    try:
        jobs = [publish(conn, {"member_id": f"m-{n}", "points": 1}) for n in range(5)]
        with pytest.raises(pika.exceptions.NackError):
            Relay(PgQueue(conn), port, [QUEUE]).run_once()
        first = drain()
        assert 1 <= len(first) < 5 and len(first) + outbox(conn) == 5
        assert Relay(PgQueue(conn), port, [QUEUE]).run_once().published == 5 - len(first)
        assert sorted(first + drain()) == sorted(jobs) and outbox(conn) == 0
    finally:
        port.close()
        consumer.close()
        rabbitmqctl("clear_policy", policy)
        with pika.BlockingConnection(pika.URLParameters(rabbit_url)) as connection:
            channel = connection.channel()
            for name in (prefix + QUEUE, exhausted_queue_name(prefix + QUEUE)):
                channel.queue_delete(name)


def rabbitmqctl(*arguments: str) -> None:
    """Run ``rabbitmqctl`` on the test broker's node (root on the test machine); skip the test when it cannot."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed here: a broker policy cannot be set")
    subprocess.run(["rabbitmqctl", "-q", *arguments], check=True, capture_output=True, timeout=60)
