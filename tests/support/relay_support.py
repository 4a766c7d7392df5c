"""The relay's targets: a queue standing for the broker, and a way to read what reached it (harness/queue/relay.py).

Loaded as a pytest plugin by conftest.py. ``relay_target`` is parametrised over the kinds of
target; each test that takes it runs once per kind:

- ``postgresql``: a :class:`~harness.queue.pgqueue.PgQueue` on ANOTHER database of the test
  server (a fresh copy of the migrated template, dropped after the test), which stands for the
  broker: the relay's outbox and the "broker" never share a table.
- ``rabbitmq``: a ``RabbitQueue`` on the test broker (tests/support/rabbit_support.py), its queue
  names under a prefix fresh for the test (the broker is shared), deleted afterwards.

A test uses only the protocol below.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Protocol

import psycopg
import pytest

from harness.queue.pgqueue import PgQueue
from harness.queue.port import Delivery
from harness.queue.relay import Publisher

TARGET_KINDS = ["postgresql", "rabbitmq"]


class RelayTarget(Protocol):
    url: str  # what names it to ``core-jobs relay`` (the broker's URL)

    def port(self) -> Publisher:
        """A new port on the target (its own connection), as a relay opens it."""
        ...

    def take(self, queue: str) -> list[Delivery]:
        """Every message ``queue`` holds on the target now, claimed and acked (consumed)."""
        ...


class PgTarget:
    """A reference queue in another database, standing for the broker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connections: list[psycopg.Connection] = []

    def port(self) -> PgQueue:
        conn = psycopg.connect(self.url, autocommit=True)
        self._connections.append(conn)
        return PgQueue(conn)

    def take(self, queue: str) -> list[Delivery]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            port = PgQueue(conn, worker="test-consumer")
            taken = port.claim(queue, 10_000)
            port.ack(taken)
        return taken

    def close(self) -> None:
        for conn in self._connections:
            conn.close()


class RabbitTarget:
    """The test broker, every queue name under a prefix of this test's own."""

    def __init__(self, url: str, conn: psycopg.Connection) -> None:
        from harness.queue.rabbitmq import RabbitQueue

        self.url = url
        self.prefix = f"test.relay.{secrets.token_hex(6)}."
        self.conn = conn
        self._ports: list[RabbitQueue] = []
        self._queues: set[str] = set()

    def port(self) -> Publisher:
        from harness.queue.rabbitmq import RabbitQueue

        port = RabbitQueue(self.url, self.conn, prefix=self.prefix)
        self._ports.append(port)
        return _Remembering(port, self._queues)

    def take(self, queue: str) -> list[Delivery]:
        from harness.queue.rabbitmq import RabbitQueue

        self._queues.add(queue)
        port = RabbitQueue(self.url, self.conn, prefix=self.prefix, worker="test-consumer")
        try:
            port.figures(queue)  # declared, so the claim's count of ready messages is right
            taken: list[Delivery] = []
            while batch := port.claim(queue, 100):
                port.ack(batch)
                taken.extend(batch)
            return taken
        finally:
            port.close()

    def close(self) -> None:
        import pika

        from harness.queue.rabbitmq import exhausted_queue_name

        for port in self._ports:
            port.close()
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            for queue in self._queues:
                for name in (self.prefix + queue, exhausted_queue_name(self.prefix + queue)):
                    channel.queue_delete(name)
        finally:
            connection.close()


class _Remembering:
    """A port that notes the queues published on, so the target deletes them afterwards."""

    def __init__(self, port, queues: set[str]) -> None:
        self.port = port
        self.queues = queues

    def publish_many(self, messages, **options) -> None:
        self.queues.update(queue for queue, _envelope in messages)
        self.port.publish_many(messages, **options)


@pytest.fixture
def broker_database_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """A second fresh migrated database of this test: the broker's stand-in, never the outbox's."""
    from conftest import create_database, drop_database

    name = f"core_jobs_b_{os.getpid()}_{secrets.token_hex(4)}"
    url = create_database(pg_server_url, name, template=template_database)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture(params=TARGET_KINDS)
def relay_target(request: pytest.FixtureRequest) -> Iterator[RelayTarget]:
    """The relay's target, once per kind in :data:`TARGET_KINDS`."""
    if request.param == "postgresql":
        target = PgTarget(request.getfixturevalue("broker_database_url"))
        yield target
        target.close()
        return
    if request.param == "rabbitmq":
        rabbit = RabbitTarget(request.getfixturevalue("rabbit_url"), request.getfixturevalue("conn"))
        yield rabbit
        rabbit.close()
        return
    raise AssertionError(f"unknown relay target kind {request.param!r}")
