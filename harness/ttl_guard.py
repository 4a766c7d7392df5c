"""The TTL guard (J-B7): a fence must outlive every retry and redelivery of its job, or a late one applies twice.

One definition of the predicate — ``ttl >= margin x window`` — for the library and the bundle:
:class:`harness.worker.Worker` refuses a ``fence_ttl`` it fails (the window of its consumer's
policy, a durable consumer's execution window, and the horizon its queue adapter declares), and
``core-jobs`` checks the same predicate over every configured policy, naming its settings
(maintenance/fields/retry.py). An adapter declares how much longer than a policy's retry window a
job may still be delivered with a classmethod ``redelivery_horizon(url, policy) -> timedelta``
(docs/writing-an-adapter.md); an adapter without one adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from harness.consumer.retry import RetryPolicy

if TYPE_CHECKING:  # check-config imports this module for TtlGuard alone: no consumer, durable or driver code
    from harness.consumer.consumer import Consumer

__all__ = ["DEFAULT_TTL_MARGIN", "TtlGuard", "adapter_horizon", "worker_window"]

DEFAULT_TTL_MARGIN = 2.0  # factor over the longest retry window


@dataclass(frozen=True)
class TtlGuard:
    """``ttl`` versus ``margin`` x ``window``: ok when the fence outlives the window with the margin."""

    ttl: timedelta
    window: timedelta
    margin: float

    @property
    def required(self) -> timedelta:
        try:
            return self.window * self.margin
        except OverflowError:  # an absurd margin or horizon: no TTL can satisfy it
            return timedelta.max

    @property
    def ok(self) -> bool:
        return self.ttl >= self.required


def adapter_horizon(adapter: Any, url: str | None, policy: RetryPolicy) -> timedelta:
    """What the adapter class declares it adds to ``policy``'s retry window (``redelivery_horizon``), else nothing."""
    declared = getattr(adapter, "redelivery_horizon", None)
    return timedelta(0) if declared is None else declared(url, policy)


def worker_window(
    consumer: Consumer[Any], policy: RetryPolicy, lease: timedelta, adapter: Any, url: str | None
) -> timedelta:
    """The longest a job of ``consumer`` may still be delivered: its execution window plus the adapter's horizon."""
    from harness.durable.window import max_execution_window

    try:
        return max_execution_window(consumer, policy, lease) + adapter_horizon(adapter, url, consumer.policy(policy))
    except OverflowError:
        return timedelta.max
