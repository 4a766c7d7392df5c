"""The broker's redelivery horizon the TTL guard (J-B7) adds to the retry window, and where it comes from.

A fence (``core.processed_jobs``) must outlive every delivery of its job. On the reference queue
every delivery is a counted attempt inside the retry window; a broker may deliver a job later
than that. ``CORE_JOBS_BROKER_REDELIVERY_HORIZON`` is the operator's figure for it; when
``CORE_JOBS_QUEUE_URL`` selects an adapter that can compute its own — RabbitMQ
(:func:`harness.queue.rabbitmq_topology.redelivery_horizon`: delay-bucket rounding and one
``consumer_timeout`` per delivery that may be held, from the URL's ``consumer_timeout`` and
``delivery_limit``, for the worst configured policy) — the guard uses the **larger** of the two
(:class:`RedeliveryHorizon`). The computed one raises the setting and never replaces it: an
operator may know of later deliveries the adapter cannot see (a shovel, a message moved back by
hand, a broker whose timeout is raised per queue), so a larger setting stands; a smaller one
would let the purge delete a fence a broker redelivery still needs, so it is raised.

The same reading refuses a ``delivery_limit`` not above a policy's ``max_attempts``
(:func:`harness.queue.rabbitmq_topology.delivery_limit_problem`): the broker would give up on a
message whose worker keeps dying before its retry policy does.

Pure: reads the URL's query with :mod:`harness.queue.rabbitmq_topology` — no pika, no broker —
so ``check-config`` shows it where the ``rabbitmq`` extra is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from harness.consumer.retry import RetryPolicy
from harness.queue.adapters import url_scheme
from harness.queue.rabbitmq_topology import (
    DEFAULT_CONSUMER_TIMEOUT,
    DEFAULT_DELIVERY_LIMIT,
    delivery_limit_problem,
    redelivery_horizon,
    url_options,
)
from maintenance.fields.durations import format_duration
from maintenance.fields.environment import ENV_PREFIX

__all__ = ["AdapterHorizon", "RedeliveryHorizon", "adapter_horizon"]

RABBITMQ_SCHEMES = ("amqp", "amqps")


@dataclass(frozen=True)
class AdapterHorizon:
    """The redelivery horizon a queue adapter computed from its URL, and what it was computed from."""

    horizon: timedelta
    adapter: str  # the broker, for people: "RabbitMQ"
    source: str  # the options and the policy it was computed from


@dataclass(frozen=True)
class RedeliveryHorizon:
    """What the TTL guard adds to the worst retry window: the setting, raised to the adapter's horizon if larger."""

    setting: timedelta  # CORE_JOBS_BROKER_REDELIVERY_HORIZON
    adapter: AdapterHorizon | None  # None: the queue adapter computes none (the reference queue, a third party's)

    @property
    def value(self) -> timedelta:
        return self.setting if self.adapter is None else max(self.setting, self.adapter.horizon)

    def explain(self) -> str:
        """One line: the horizon used, which figure it is, and the other one."""
        setting = f"{ENV_PREFIX}BROKER_REDELIVERY_HORIZON={format_duration(self.setting)}"
        if self.adapter is None:
            return f"{format_duration(self.value)} ({setting}; the queue adapter computes none)"
        computed = (
            f"the {self.adapter.adapter} adapter's {format_duration(self.adapter.horizon)} ({self.adapter.source})"
        )
        if self.adapter.horizon > self.setting:
            return f"{format_duration(self.value)}, {computed}, which raises {setting}"
        return f"{format_duration(self.value)}, {setting}, at least {computed}"


def adapter_horizon(queue_url: str | None, policies: Mapping[str, RetryPolicy]) -> AdapterHorizon | None:
    """The horizon of the adapter ``queue_url`` selects, for the worst of ``policies`` (label -> policy); None when
    the adapter computes none.

    ValueError (its message naming the option or the policy, never the password) when a RabbitMQ
    option does not read, or its ``delivery_limit`` is not above some policy's ``max_attempts``.
    """
    if url_scheme(queue_url) not in RABBITMQ_SCHEMES:
        return _declared_horizon(queue_url, policies)
    assert queue_url is not None  # a scheme was read from it
    _pika_url, options = url_options(queue_url)
    delivery_limit: int = options.get("delivery_limit", DEFAULT_DELIVERY_LIMIT)
    consumer_timeout: timedelta = options.get("consumer_timeout", DEFAULT_CONSUMER_TIMEOUT)
    for label, policy in policies.items():
        problem = delivery_limit_problem(delivery_limit, policy, policy_name=label)
        if problem is not None:
            raise ValueError(problem)
    try:
        label, horizon = max(
            (
                (label, redelivery_horizon(policy, consumer_timeout=consumer_timeout, delivery_limit=delivery_limit))
                for label, policy in policies.items()
            ),
            key=lambda item: item[1],
        )
    except OverflowError:  # absurd attempts or timeout: no fence could outlive it
        raise ValueError(
            "consumer_timeout x (max_attempts + delivery_limit + 1) is longer than any duration: shorten them"
        ) from None

    def shown(name: str, value: str) -> str:
        return f"{name}={value}" + ("" if name in options else " (default)")

    source = (
        f"from {ENV_PREFIX}QUEUE_URL: {shown('consumer_timeout', f'{consumer_timeout // timedelta(milliseconds=1)} ms')},"
        f" {shown('delivery_limit', str(delivery_limit))}; worst policy: {label}"
    )
    return AdapterHorizon(horizon=horizon, adapter="RabbitMQ", source=source)


def _declared_horizon(queue_url: str | None, policies: Mapping[str, RetryPolicy]) -> AdapterHorizon | None:
    """A third party's adapter's own horizon (its ``redelivery_horizon`` classmethod, harness/ttl_guard.py), for the
    worst of ``policies``; None for the reference queue and an adapter that declares none."""
    if url_scheme(queue_url) in (None, "postgresql", "postgres") or not policies:
        return None
    from harness.queue.adapters import adapter_class

    adapter = adapter_class(queue_url)
    if getattr(adapter, "redelivery_horizon", None) is None:
        return None
    label, horizon = max(
        ((label, adapter.redelivery_horizon(queue_url, policy)) for label, policy in policies.items()),
        key=lambda item: item[1],
    )
    return AdapterHorizon(
        horizon=horizon, adapter=adapter.__name__, source=f"declared by the adapter; worst policy: {label}"
    )
