"""The RabbitMQ adapter keeps the queue port's contract: the conformance kit (harness/testing/conformance.py) on the real broker."""

from __future__ import annotations

import pytest
from support.rabbit_support import RabbitUnderTest

from harness.testing.conformance import QueuePortContract, QueueUnderTest


class TestRabbitQueue(QueuePortContract):
    @pytest.fixture
    def queue_under_test(self, rabbit: RabbitUnderTest) -> QueueUnderTest:
        return rabbit
