"""The real RabbitMQ of the tests: the ``rabbit_url`` fixture and ``rabbit``, a fresh queue per test (a ``QueueUnderTest``).

The broker is ``CORE_JOBS_TEST_RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/%2F``);
a test that needs it is skipped, saying why, when nothing answers there — or fails with that
reason when ``CORE_JOBS_REQUIRE_RABBITMQ=1`` (CI sets it: a missing broker must not look green). Each test gets a queue
name of its own (``test.<hex>``); its work, ``.exhausted`` and delay queues are deleted afterwards.

:class:`RabbitUnderTest` is what the conformance kit (harness/testing/conformance.py) asks of an
adapter's tests: ``queue``, ``port(conn)``, ``make_due()`` — what waiting out every delay would do:
the delayed messages moved to the work queue now, as the broker's dead-lettering would move
them — and ``crash(port)``: the port's TCP connection cut without a goodbye, as when its process
dies; the broker requeues its unacked deliveries (counted) at once.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pika
import pika.exceptions
import psycopg
import pytest

from harness.queue.rabbitmq import RabbitQueue, exhausted_queue_name

RABBIT_URL_VARIABLE = "CORE_JOBS_TEST_RABBITMQ_URL"
DEFAULT_RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
# Set to 1 (CI does, .ci/run): a broker that does not answer fails the tests that need it instead of skipping them.
REQUIRE_VARIABLE = "CORE_JOBS_REQUIRE_RABBITMQ"


@pytest.fixture(scope="session")
def rabbit_url() -> str:
    """The test broker's URL; when it does not answer the test is skipped, or fails under CORE_JOBS_REQUIRE_RABBITMQ=1."""
    url = os.environ.get(RABBIT_URL_VARIABLE, DEFAULT_RABBIT_URL)
    check_broker(url, required=os.environ.get(REQUIRE_VARIABLE) == "1")
    return url


def check_broker(url: str, *, required: bool) -> None:
    """Return when something answers at ``url``'s host and port; else skip the test saying why, or — ``required``,
    as in CI, where a missing broker must not pass for a green run — fail it with the same reason."""
    parameters = pika.URLParameters(url)
    try:
        with socket.create_connection((parameters.host, parameters.port), timeout=2):
            return
    except OSError as exc:
        reason = f"RabbitMQ is not reachable at {parameters.host}:{parameters.port} ({exc}); set {RABBIT_URL_VARIABLE}"
    if required:
        pytest.fail(f"{reason} ({REQUIRE_VARIABLE}=1: the broker's tests must run)", pytrace=False)
    pytest.skip(reason)


def crash_port(port: RabbitQueue) -> None:
    """``port``'s process died: its TCP connection cut without a goodbye, so the broker requeues its unsettled
    deliveries (counted, ``redelivered``) as soon as it sees the connection gone."""
    link = port._link
    if link is not None:
        link.connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)


@dataclass
class RabbitUnderTest:
    """A queue fresh for this test on the real broker, and the ports opened on it (closed afterwards)."""

    url: str
    queue: str = field(default_factory=lambda: f"test.{uuid.uuid4().hex[:12]}")
    ports: list[RabbitQueue] = field(default_factory=list)

    def port(self, conn: psycopg.Connection, **options) -> RabbitQueue:
        """A new port, with its own broker connection, as a worker opens it."""
        port = RabbitQueue(self.url, conn, worker="test", lease=timedelta(seconds=30), **options)
        self.ports.append(port)
        return port

    def make_due(self) -> None:
        """Every delayed message of ``queue`` moved to its work queue now (the clock moved on)."""
        with self._channel() as channel:
            for bucket in self._buckets():
                while True:
                    method, properties, body = channel.basic_get(bucket)
                    if method is None:
                        break
                    channel.basic_publish("", self.queue, body, properties, mandatory=True)
                    channel.basic_ack(method.delivery_tag)

    def crash(self, port: RabbitQueue) -> None:
        """The port's process died: its TCP connection cut, so the broker requeues its unsettled deliveries."""
        crash_port(port)

    def ready(self, name: str | None = None) -> int:
        """Messages ready in broker queue ``name`` (default: the work queue); 0 when it does not exist."""
        name = name or self.queue
        with self._channel() as channel:
            try:
                return channel.queue_declare(name, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                return 0

    def delayed(self) -> dict[str, int]:
        """Ready messages of each delay bucket that exists, by queue name."""
        return {name: self.ready(name) for name in self._buckets()}

    def delayed_total(self) -> int:
        return sum(self.delayed().values())

    def exhausted(self) -> int:
        return self.ready(exhausted_queue_name(self.queue))

    def publish_raw(self, body: bytes, properties: pika.BasicProperties) -> None:
        """A message as another producer might publish it, on the (declared) work queue."""
        with self._channel() as channel:
            channel.basic_publish("", self.queue, body, properties, mandatory=True)

    def delete(self) -> None:
        for port in self.ports:
            port.close()
        with self._channel() as channel:
            for name in (self.queue, exhausted_queue_name(self.queue), *self._buckets()):
                channel.queue_delete(name)

    def _buckets(self) -> list[str]:
        """The delay queues of ``queue`` that the ports of this test declared."""
        return sorted({name for port in self.ports for name in port.delay_queues})

    def _channel(self):
        return BrokerChannel(self.url)


class BrokerChannel:
    """A confirm-mode channel on a connection of its own, closed on exit."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self):
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = self.connection.channel()
        channel.confirm_delivery()
        return channel

    def __exit__(self, *exc) -> None:
        self.connection.close()


@pytest.fixture
def rabbit(rabbit_url: str) -> Iterator[RabbitUnderTest]:
    """A fresh queue name on the test broker; its queues deleted and its ports closed afterwards."""
    under_test = RabbitUnderTest(rabbit_url)
    yield under_test
    under_test.delete()
