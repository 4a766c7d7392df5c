"""The test broker's fixture: a missing RabbitMQ skips the tests that need it, except where it is required (CI)."""

from __future__ import annotations

import socket

import pytest
from support.rabbit_support import REQUIRE_VARIABLE, check_broker


@pytest.fixture
def closed_url() -> str:
    """An amqp URL on a local port nothing listens on: the connection is really refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


@pytest.mark.pure
def test_an_unreachable_broker_skips_the_test_saying_where_it_looked(closed_url):
    """Not required: a broker that refuses the connection skips, naming host:port and the variable to set."""
    with pytest.raises(pytest.skip.Exception) as skipped:
        check_broker(closed_url, required=False)
    port = closed_url.rsplit(":", 1)[1].split("/")[0]
    assert f"RabbitMQ is not reachable at 127.0.0.1:{port}" in str(skipped.value)
    assert "CORE_JOBS_TEST_RABBITMQ_URL" in str(skipped.value)


@pytest.mark.pure
def test_an_unreachable_broker_fails_the_test_with_the_reason_when_required(closed_url):
    """Required (CORE_JOBS_REQUIRE_RABBITMQ=1, as .ci/run sets): the same reason fails the test instead of skipping it."""
    with pytest.raises(pytest.fail.Exception) as failed:
        check_broker(closed_url, required=True)
    assert "RabbitMQ is not reachable at 127.0.0.1:" in str(failed.value)
    assert f"{REQUIRE_VARIABLE}=1" in str(failed.value)


def test_a_reachable_broker_neither_skips_nor_fails(rabbit_url):
    """The test broker answering, the check returns, required or not."""
    check_broker(rabbit_url, required=True)
    check_broker(rabbit_url, required=False)


@pytest.mark.pure
def test_ci_requires_the_broker():
    """.ci/run exports CORE_JOBS_REQUIRE_RABBITMQ=1 beside the test broker's URL."""
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    assert f"export {REQUIRE_VARIABLE}=1" in script
