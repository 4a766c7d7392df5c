"""Choosing the queue adapter from a URL (harness/queue/adapters.py), and the worker on whichever it opens."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from support.factories import QUEUE, publish
from support.harness_support import TTL
from support.queue_adapters import EchoQueue

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.examples.points import CreditPoints
from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.queue.adapters import ENTRY_POINT_GROUP, adapter_reference, open_queue
from harness.queue.pgqueue import PgQueue
from harness.worker import Worker, WorkerConfig

LEASE = timedelta(seconds=30)
PASSWORD = "hunter2-queue"


@pytest.mark.parametrize(
    "url", [None, "", "postgresql://elsewhere:5432/other", f"postgres://app:{PASSWORD}@db/core", "PostgreSQL://x/y"]
)
def test_no_url_or_a_postgresql_one_opens_the_reference_queue_on_the_connection_given(conn, url):
    """None, "" and a postgresql:// or postgres:// URL (its host ignored) open PgQueue on the worker's own connection,
    with its lease and worker name; closing the port leaves that connection open."""
    port = open_queue(url, conn, worker="host:1/0", lease=LEASE)
    assert type(port) is PgQueue
    assert (port.conn, port.lease, port.worker, port.system) == (conn, LEASE, "host:1/0", "postgresql")
    port.close()
    assert not conn.closed


@pytest.mark.pure
@pytest.mark.parametrize(
    ("url", "reference"),
    [
        (None, "harness.queue.pgqueue:PgQueue"),
        ("postgres://db/core", "harness.queue.pgqueue:PgQueue"),
        (f"amqp://app:{PASSWORD}@rabbit:5672/%2F", "harness.queue.rabbitmq:RabbitQueue"),
        ("AMQPS://rabbit/", "harness.queue.rabbitmq:RabbitQueue"),
    ],
)
def test_each_built_in_scheme_names_its_adapter_without_importing_it(url, reference):
    """adapter_reference gives the module:Class a URL selects: the reference queue, or the RabbitMQ adapter for amqp(s)."""
    assert adapter_reference(url) == reference


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"kafka://app:{PASSWORD}@broker:9092/jobs", "'kafka'"),
        (f"app:{PASSWORD}@broker", "'app'"),  # a forgotten scheme: the user name reads as one
        ("broker.internal:5672", "'broker.internal'"),
        ("broker.internal", "no scheme"),
    ],
)
def test_an_unknown_scheme_is_a_value_error_naming_it_and_the_known_ones_never_the_password(conn, url, named):
    """open_queue refuses a URL of no known scheme with a ValueError that names the scheme and every known one,
    and never the URL's password."""
    with pytest.raises(ValueError) as info:
        open_queue(url, conn, lease=LEASE)
    message = str(info.value)
    assert named in message
    assert "amqp, amqps, memory, postgres, postgresql" in message
    assert PASSWORD not in message


def test_amqp_without_the_rabbitmq_adapter_importable_says_what_to_install(conn, monkeypatch):
    """An amqp:// URL when harness.queue.rabbitmq (or pika) cannot be imported is a ValueError naming the module and
    the rabbitmq extra, not the password; nothing was opened."""
    monkeypatch.setitem(sys.modules, "harness.queue.rabbitmq", None)  # `import` raises ModuleNotFoundError
    with pytest.raises(ValueError) as info:
        open_queue(f"amqp://app:{PASSWORD}@127.0.0.1:5672/%2F", conn, lease=LEASE)
    message = str(info.value)
    assert "harness.queue.rabbitmq" in message and "core-jobs-harness[rabbitmq]" in message
    assert PASSWORD not in message


@pytest.mark.pure
def test_choosing_an_adapter_imports_neither_the_rabbitmq_adapter_nor_pika_nor_psycopg():
    """Loading the selection and naming the amqp adapter (what check-config does) leaves pika, the RabbitMQ adapter
    and psycopg unimported: only open_queue imports the adapter it opens."""
    code = (
        "import json, sys; from harness.queue.adapters import adapter_reference;"
        "adapter_reference('amqp://rabbit/');"
        "print(json.dumps(sorted({'pika', 'harness.queue.rabbitmq', 'psycopg'} & set(sys.modules))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_an_amqp_url_opens_the_rabbitmq_adapter_with_the_worker_name_and_lease(conn, rabbit_url):
    """An amqp:// URL opens RabbitQueue (its spans say rabbitmq) on the connection given, with the worker name and
    lease."""
    from harness.queue.rabbitmq import RabbitQueue

    port = open_queue(rabbit_url, conn, worker="w/0", lease=LEASE)
    try:
        assert type(port) is RabbitQueue
        assert (port.system, port.worker, port.lease) == ("rabbitmq", "w/0", LEASE)
    finally:
        port.close()


def test_a_scheme_of_the_entry_point_group_opens_that_adapter_with_the_url(echo_queues, conn):
    """A scheme registered by an installed distribution in core_jobs_harness.queues (any case) opens its class's
    from_url with the URL, the connection, the worker name and the lease."""
    url = f"ECHO://app:{PASSWORD}@nowhere/x"
    assert adapter_reference(url) == "support.queue_adapters:EchoQueue"
    port = open_queue(url, conn, worker="w/1", lease=LEASE)
    assert isinstance(port, EchoQueue)
    assert (port.url, port.conn, port.worker, port.lease) == (url, conn, "w/1", LEASE)
    assert echo_queues.opened == [port]


@pytest.mark.pure
def test_the_unknown_scheme_message_lists_the_installed_entry_points_too(echo_queues):
    """A refused scheme's message names the third-party schemes installed beside the built-in ones."""
    with pytest.raises(ValueError, match="known: amqp, amqps, echo, memory, postgres, postgresql") as info:
        adapter_reference("kafka://broker/")
    assert ENTRY_POINT_GROUP in str(info.value)


@pytest.mark.pure
def test_a_worker_refuses_an_unknown_queue_url_before_starting_any_thread():
    """Worker(queue_url=…) of an unknown scheme raises the ValueError at construction, the password not in it."""
    with pytest.raises(ValueError, match="'kafka'") as info:
        Worker(
            "postgresql://nowhere/x",
            points_consumer,
            policy=RetryPolicy(),
            config=WorkerConfig(fence_ttl=TTL),
            queue_url=f"kafka://app:{PASSWORD}@broker/",
        )
    assert PASSWORD not in str(info.value)


def echo_worker(database_url: str, consumer: Consumer = points_consumer, **config) -> tuple[Worker, HarnessMetrics]:
    """A worker of ``consumer`` on the ``echo://`` adapter, and its metrics."""
    metrics = HarnessMetrics(CollectorRegistry())
    worker = Worker(
        database_url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, **config),
        metrics=metrics,
        queue_url=f"echo://app:{PASSWORD}@nowhere/",
    )
    return worker, metrics


def test_a_worker_runs_on_the_adapter_its_queue_url_selects_and_closes_each_port_when_its_thread_ends(
    echo_queues, database_url, conn
):
    """Each worker thread opens its own port of the queue_url's adapter on its own connection, processes through it,
    and closes it when the thread ends."""
    for member in ("a", "b", "c"):
        publish(conn, {"member_id": member, "points": 1})
    worker, _metrics = echo_worker(database_url, concurrency=2)

    assert worker.run(once=True).processed == 3

    ports = echo_queues.opened
    assert len(ports) == 2 and all(port.closed for port in ports)
    assert len({port.worker for port in ports}) == 2 and len({id(port.conn) for port in ports}) == 2
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)


def test_a_worker_leaves_the_queue_gauges_alone_when_its_adapter_cannot_tell_them(echo_queues, database_url, conn):
    """An adapter whose figures() returns None changes neither the depth nor the age gauge; its messages are
    processed all the same."""
    publish(conn, {"member_id": "a", "points": 1})
    worker, metrics = echo_worker(database_url)
    metrics.queue_figures(QUEUE, 5, 7.0)

    assert worker.run(once=True).processed == 1

    assert metrics.registry.get_sample_value("harness_queue_depth", {"queue": QUEUE}) == 5
    assert metrics.registry.get_sample_value("harness_queue_oldest_ready_age_seconds", {"queue": QUEUE}) == 7


def test_the_delivery_span_carries_the_adapters_messaging_system(echo_queues, spans, database_url, conn):
    """The worker's `<queue> process` span says messaging.system as the adapter names itself, not postgresql."""
    publish(conn, {"member_id": "a", "points": 1})
    worker, _metrics = echo_worker(database_url)

    worker.run(once=True)

    assert spans.one(f"{QUEUE} process").attributes["messaging.system"] == "echo"


def test_a_worker_that_lost_its_connection_gives_its_batch_back_through_a_port_opened_anew_on_a_fresh_one(
    echo_queues, database_url, conn
):
    """Connection lost mid-batch: the worker opens its adapter anew on a fresh connection, acks the batch's success
    and releases its unstarted message there, closes both ports, then reconnects and handles the released message on
    a third; the message in hand keeps its lease and its attempt."""
    for member in ("m-ok", "m-cut", "m-next"):
        publish(conn, {"member_id": member, "points": 1})
    credit = points_consumer.handler

    def cut_off(conn_, payload, ctx):
        if payload.member_id == "m-cut":
            conn_.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        credit(conn_, payload, ctx)

    # One transaction per job, so m-ok's success is committed before the cut (a shared one would go with it).
    consumer = Consumer(
        name=points_consumer.name,
        queue=QUEUE,
        payload_schema=CreditPoints,
        handler=cut_off,
        shares_transactions=False,
    )
    worker, _metrics = echo_worker(database_url, consumer)

    stats = worker.run(once=True)

    first, fresh, again = echo_queues.opened
    assert first.conn is not fresh.conn and first.conn.closed and fresh.conn.closed and again.conn.closed
    assert first.closed and fresh.closed and again.closed and fresh.worker == first.worker == again.worker
    assert (stats.connections_lost, stats.released, stats.processed) == (1, 1, 2)
    assert conn.execute(
        "SELECT payload->>'member_id', attempts, lease_token IS NOT NULL FROM core.queue_messages ORDER BY id"
    ).fetchall() == [("m-cut", 1, True)]
