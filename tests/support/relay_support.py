"""The relay's targets: a queue standing for the broker, and a way to read what reached it (harness/queue/relay.py).

Loaded as a pytest plugin by conftest.py. ``relay_target`` is parametrised over the kinds of
target; each test that takes it runs once per kind:

- ``postgresql``: a :class:`~harness.queue.pgqueue.PgQueue` on ANOTHER database of the test
  server (a fresh copy of the migrated template, dropped after the test), which stands for the
  broker: the relay's outbox and the "broker" never share a table.
- ``rabbitmq``: a :class:`~harness.queue.rabbitmq.RabbitQueue` on the real test broker
  (``rabbit_url``, tests/support/rabbit_support.py; skipped when it does not answer), its queue
  names under a prefix of this test's own (``test.<hex>.``: tests running at the same time, here
  or in other sessions on the broker, never share a queue); ``url`` is the broker's URL with that
  ``prefix`` option, as ``CORE_JOBS_QUEUE_URL`` would name it. Every queue its ports declared is
  deleted after the test. The same target is the fixture ``rabbit_target`` for a test that runs
  on RabbitMQ only (tests/harness/test_broker_end_to_end.py): there it also gives the URL a
  ``Worker(queue_url=…)`` is started with (``worker_url``), the messages ready on the broker
  (``ready``) and the death of a port's process (``crash``).

A test uses only the protocol below.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Protocol

import pika.exceptions
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from harness.consumer.retry import RetryPolicy
from harness.examples.points import LoyaltyLedger, make_consumer
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Delivery
from harness.queue.rabbitmq import RabbitQueue, exhausted_queue_name
from harness.queue.relay import Publisher
from harness.worker import Worker, WorkerConfig, WorkerStats
from support.harness_support import TTL
from support.rabbit_support import BrokerChannel, crash_port

TARGET_KINDS = ["postgresql", "rabbitmq"]
# How long ``take`` waits for messages the broker reports ready to reach its consumer (it returns as
# soon as they have; an empty queue returns at once): generous, for a loaded machine.
TAKE_WAIT = timedelta(seconds=10)


class RelayTarget(Protocol):
    url: str  # what names it to ``core-jobs relay`` (the broker's URL)

    def port(self) -> Publisher:
        """A new port on the target (its own connection), as a relay opens it."""
        ...

    def take(self, queue: str) -> list[Delivery]:
        """Every message ``queue`` holds on the target now, claimed and acked (consumed)."""
        ...


class Crashing:
    """The relay's process dying right after the target confirmed the publish, before the outbox ack."""

    def __init__(self, target: Publisher) -> None:
        self.target = target

    def publish_many(self, messages, *, delay=timedelta(0)) -> None:
        self.target.publish_many(messages, delay=delay)
        raise KeyboardInterrupt  # not an Exception: nothing of the relay's runs after it


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


class _Declaring(RabbitQueue):
    """A RabbitQueue that tells its target every broker queue it declares (so the test can delete them)."""

    def __init__(self, *args: Any, declared: set[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._declared = declared

    def _declare(self, link: Any, name: str) -> None:
        self._declared.update((name, exhausted_queue_name(name)))
        super()._declare(link, name)


class RabbitTarget:
    """The real broker, under a queue-name prefix of this test's own.

    Its ports hold a connection to the test's database (the adapter writes dead letters there; a
    relay's target only publishes)."""

    def __init__(self, rabbit_url: str, database_url: str) -> None:
        self.rabbit_url = rabbit_url
        self.prefix = f"test.{uuid.uuid4().hex[:12]}."
        self.url = f"{rabbit_url}{'&' if '?' in rabbit_url else '?'}prefix={self.prefix}"
        self._database_url = database_url
        self._connections: list[psycopg.Connection] = []
        self._ports: list[RabbitQueue] = []
        self._declared: set[str] = set()

    def port(self, *, worker: str = "relay-target", **options: Any) -> RabbitQueue:
        conn = psycopg.connect(self._database_url, autocommit=True)
        self._connections.append(conn)
        port = _Declaring(
            self.rabbit_url,
            conn,
            worker=worker,
            prefix=self.prefix,
            declared=self._declared,
            **options,
        )
        self._ports.append(port)
        return port

    def run_worker(self, ledger: LoyaltyLedger) -> WorkerStats:
        """A worker of the points consumer on this broker (confirming with ``ledger``), once over what is ready."""
        worker = Worker(
            self._database_url,
            make_consumer(ledger),
            policy=RetryPolicy(),
            config=WorkerConfig(fence_ttl=TTL),
            metrics=HarnessMetrics(CollectorRegistry()),
            queue_url=self.worker_url(),
        )
        return worker.run(once=True)

    def worker_url(self) -> str:
        """The URL a ``Worker(queue_url=…)`` on this broker is given: the prefix, and a claim that waits
        long enough for what the broker reports ready to arrive on a loaded machine."""
        return f"{self.url}&claim_wait={int(TAKE_WAIT / timedelta(milliseconds=1))}"

    def ready(self, queue: str) -> int:
        """Messages ready in harness queue ``queue`` on the broker (0 when it does not exist)."""
        name = f"{self.prefix}{queue}"
        self._declared.update((name, exhausted_queue_name(name)))
        with BrokerChannel(self.rabbit_url) as channel:
            try:
                return channel.queue_declare(name, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                return 0

    def crash(self, port: RabbitQueue) -> None:
        """``port``'s process died (rabbit_support.crash_port): the broker requeues its unsettled deliveries."""
        crash_port(port)

    def take(self, queue: str) -> list[Delivery]:
        port = self.port(worker="test-consumer", claim_wait=TAKE_WAIT)
        try:
            taken = port.claim(queue, 10_000)
            assert port.ack(taken) == len(taken)
        finally:
            port.close()
        return taken

    def close(self) -> None:
        for port in self._ports:
            port.close()
        self._declared.update(name for port in self._ports for name in port.delay_queues)
        with BrokerChannel(self.rabbit_url) as channel:
            for name in sorted(self._declared):
                channel.queue_delete(name)
        for conn in self._connections:
            conn.close()


@pytest.fixture
def broker_database_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """A second fresh migrated database of this test: the broker's stand-in, never the outbox's."""
    from tests.conftest import create_database, drop_database

    name = f"core_jobs_b_{os.getpid()}_{secrets.token_hex(4)}"
    url = create_database(pg_server_url, name, template=template_database)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture
def rabbit_target(rabbit_url: str, database_url: str) -> Iterator[RabbitTarget]:
    """The real broker under a prefix of this test's own; every queue declared on it deleted afterwards."""
    target = RabbitTarget(rabbit_url, database_url)
    yield target
    target.close()


@pytest.fixture(params=TARGET_KINDS)
def relay_target(request: pytest.FixtureRequest) -> Iterator[RelayTarget]:
    """The relay's target, once per kind in :data:`TARGET_KINDS`."""
    if request.param == "postgresql":
        target = PgTarget(request.getfixturevalue("broker_database_url"))
        yield target
        target.close()
        return
    if request.param == "rabbitmq":
        yield request.getfixturevalue("rabbit_target")
        return
    raise AssertionError(f"unknown relay target kind {request.param!r}")
