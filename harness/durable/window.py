"""The TTL guard's window of a durable consumer (J-B7 with its actions): pure arithmetic.

A fence must outlive every delivery that can still arrive for its job, or a late one would run
the work again. For a plain consumer that is its queue policy's retry window. A durable consumer
(one with ``actions``, harness/consumer/actions.py) can take longer from its first delivery to its last
retry, because each action retries on its own policy inside the job, and a worker lost mid-job
is taken over only once its lease has expired::

    window = Σ max_retry_window(action.policy)          each action's retries (R-2)
           + max_retry_window(final write's policy)     the handler, on the queue's policy
           + lease × max_takes                          one lease per take a lost worker can cost

    max_takes = Σ action.policy.max_attempts + final write's policy.max_attempts

``max_takes`` is the crash-loop bound: every take of the execution by a worker uses up an
attempt of some action or of the final write, so the executor (harness/durable/run.py) caps
``core.executions.takes`` at this number and settles the execution instead of taking it once
more. Each of those takes may be lost, and the next one waits for its lease to expire: at most
one lease each (the last one included: its loss is seen one lease later). The time the handlers
themselves run is not counted, as for a plain consumer. The caller adds the broker's own
redelivery horizon, as for every other window (maintenance/fields/retry.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy, max_retry_window

__all__ = ["max_execution_window", "max_takes"]


def max_takes(consumer: Consumer[Any], queue_policy: RetryPolicy) -> int:
    """The crash-loop bound: Σ action max_attempts + the final write's max_attempts."""
    return sum(a.policy.max_attempts for a in consumer.actions) + consumer.policy(queue_policy).max_attempts


def max_execution_window(consumer: Consumer[Any], queue_policy: RetryPolicy, lease: timedelta) -> timedelta:
    """The longest time from a durable consumer's first delivery to its last retry (module docstring).

    For a consumer without actions: its final write's retry window alone (no take-overs: its
    claim is the queue's, whose redelivery the queue policy already counts).
    """
    if lease <= timedelta(0):
        raise ValueError(f"lease must be positive, got {lease}")
    final = max_retry_window(consumer.policy(queue_policy))
    if not consumer.durable:
        return final
    actions = sum((max_retry_window(a.policy) for a in consumer.actions), timedelta(0))
    try:
        return actions + final + lease * max_takes(consumer, queue_policy)
    except OverflowError:
        return timedelta.max
