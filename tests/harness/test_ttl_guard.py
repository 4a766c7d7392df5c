"""The TTL guard belongs to the library: ``Worker`` refuses a fence that a late retry or redelivery could outlive, and
a third-party adapter's declared redelivery horizon counts, for the library and the bundle alike (harness/ttl_guard.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.queue_adapters import EchoQueue

from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.worker import Worker, WorkerConfig
from maintenance.fields.horizon import adapter_horizon

POLICY = RetryPolicy()  # 5 attempts: a window of 11 min 12 s at most


def worker(ttl: timedelta, queue_url: str | None = None) -> Worker:
    return Worker(
        "postgresql://nowhere/", points_consumer, policy=POLICY, config=WorkerConfig(fence_ttl=ttl), queue_url=queue_url
    )


def test_a_worker_refuses_a_fence_ttl_shorter_than_the_margin_over_its_retry_window():
    """fence_ttl 1 s as a library caller might give it: refused at construction, naming the TTL it needs."""
    with pytest.raises(ValueError, match=r"fence_ttl 0:00:01 is shorter than ttl_margin 2 x .* at least 0:22:24"):
        worker(timedelta(seconds=1))


def test_a_worker_accepts_a_fence_ttl_of_twice_its_retry_window():
    assert worker(timedelta(minutes=23)).config.fence_ttl == timedelta(minutes=23)


def test_a_third_party_adapters_declared_horizon_raises_what_the_guard_requires(echo_queues, monkeypatch):
    """An adapter declaring a 1 h horizon: 23 min, enough on the reference queue, is refused; the bundle's
    horizon (check-config, core-jobs worker) takes the same declaration."""
    monkeypatch.setattr(
        EchoQueue, "redelivery_horizon", classmethod(lambda cls, url, policy: timedelta(hours=1)), raising=False
    )
    with pytest.raises(ValueError, match="fence_ttl 0:23:00 is shorter"):
        worker(timedelta(minutes=23), queue_url="echo://nowhere/")
    declared = adapter_horizon("echo://nowhere/", {"the default policy": POLICY})
    assert declared is not None and (declared.horizon, declared.adapter) == (timedelta(hours=1), "EchoQueue")
