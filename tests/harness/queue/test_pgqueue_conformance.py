"""The reference queue keeps the queue port's contract: the conformance kit (harness/testing/conformance.py) run on PgQueue."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
import pytest
from support.harness_support import expire_leases, make_due

from harness.queue.pgqueue import PgQueue
from harness.queue.port import QueuePort
from harness.testing.conformance import QueuePortContract, QueueUnderTest


@dataclass
class PgQueueUnderTest:
    """PgQueue on this test's database: make_due back-dates run_at; crash expires the leases of the port's worker."""

    database_url: str
    queue: str = field(default_factory=lambda: f"conformance.{uuid.uuid4().hex[:12]}")

    def port(self, conn: psycopg.Connection) -> QueuePort:
        return PgQueue(conn, lease=timedelta(seconds=30), worker=f"kit-{uuid.uuid4().hex[:8]}")

    def make_due(self) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            make_due(conn, queue=self.queue)

    def crash(self, port: QueuePort) -> None:
        assert isinstance(port, PgQueue)
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            expire_leases(conn, worker=port.worker)


class TestPgQueue(QueuePortContract):
    @pytest.fixture
    def queue_under_test(self, database_url: str) -> QueueUnderTest:
        return PgQueueUnderTest(database_url)
