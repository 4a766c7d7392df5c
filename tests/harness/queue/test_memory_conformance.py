"""The in-memory queue keeps the queue port's contract: the conformance kit (harness/testing/conformance.py) run on
MemoryQueue, so a consumer's tests on it do not pass by a laxer queue."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import psycopg
import pytest

from harness.queue.memory import MemoryBroker, MemoryQueue
from harness.queue.port import QueuePort
from harness.testing.conformance import QueuePortContract, QueueUnderTest


@dataclass
class MemoryQueueUnderTest:
    """A broker of this test's own: make_due readies its delayed messages; crash closes the port unsettled."""

    broker: MemoryBroker = field(default_factory=MemoryBroker)
    queue: str = field(default_factory=lambda: f"conformance.{uuid.uuid4().hex[:12]}")

    def port(self, conn: psycopg.Connection) -> QueuePort:
        return MemoryQueue(self.broker, conn)

    def make_due(self) -> None:
        self.broker.make_due(self.queue)

    def crash(self, port: QueuePort) -> None:
        port.close()  # what it claimed and did not settle comes back, redelivered


class TestMemoryQueue(QueuePortContract):
    @pytest.fixture
    def queue_under_test(self) -> QueueUnderTest:
        return MemoryQueueUnderTest()
