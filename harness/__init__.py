"""The consumer harness: the idempotency fence in the work transaction, retries, poison, dead letters.

What a consumer service imports, and nothing of the operator's side (listing, replaying or
resolving is the bundle's: ``maintenance/operations/``). Imports nothing else of core-jobs.
A service uses the names of this façade (``from harness import Consumer, Worker, PgQueue``);
the subpackages are grouped by concept:

- ``harness.runtime`` — declaring a consumer (``consumer``), the worker loop behind ``core-jobs
  worker`` (``worker``), the retry policy (``retry``), what is counted (``metrics``), the
  dead-letter writer (``dead_letters``);
- ``harness.queue`` — the queue port (``port``: ``QueuePort``, ``Envelope``, the outcomes) and
  its reference PostgreSQL adapter (``pgqueue``);
- durable execution — declaring actions (``harness.durable.actions``) and the executor behind them;
- ``harness.errors`` — how a handler says what went wrong, and how an error becomes text;
- ``harness.handling`` — what happens to one delivery; ``harness.pg`` — the PostgreSQL helpers
  shared with the bundle (the clock read once, advisory locks); ``harness.enumerations`` — the
  values the harness's tables allow.

The façade loads lazily (PEP 562): ``import harness.enumerations`` — the CLI's parser — does not
drag psycopg in with it. docs/harness.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.durable.actions import Action, ActionContext, ActionError, Effect
    from harness.errors import NotSent, PermanentError, PoisonMessage, TransientError
    from harness.handling import handle
    from harness.queue.pgqueue import PgQueue
    from harness.queue.port import (
        NO_TENANT,
        Acked,
        DeadLettered,
        Delivery,
        Duplicate,
        Envelope,
        Held,
        InvalidPayload,
        Outcome,
        QueuePort,
        RetryAfter,
        Stale,
        settle,
    )
    from harness.runtime.consumer import Consumer, ConsumerError, JobContext
    from harness.runtime.metrics import NO_METRICS, HarnessMetrics, Metrics
    from harness.runtime.retry import RetryPolicy, RetryPolicyError
    from harness.runtime.worker import Worker, WorkerConfig, WorkerStats

# Each public name → the module that defines it.
_HOMES = {
    "Action": "harness.durable.actions",
    "ActionContext": "harness.durable.actions",
    "ActionError": "harness.durable.actions",
    "Effect": "harness.durable.actions",
    "NotSent": "harness.errors",
    "PermanentError": "harness.errors",
    "PoisonMessage": "harness.errors",
    "TransientError": "harness.errors",
    "handle": "harness.handling",
    "PgQueue": "harness.queue.pgqueue",
    "NO_TENANT": "harness.queue.port",
    "Acked": "harness.queue.port",
    "DeadLettered": "harness.queue.port",
    "Delivery": "harness.queue.port",
    "Duplicate": "harness.queue.port",
    "Envelope": "harness.queue.port",
    "Held": "harness.queue.port",
    "InvalidPayload": "harness.queue.port",
    "Outcome": "harness.queue.port",
    "QueuePort": "harness.queue.port",
    "RetryAfter": "harness.queue.port",
    "Stale": "harness.queue.port",
    "settle": "harness.queue.port",
    "Consumer": "harness.runtime.consumer",
    "ConsumerError": "harness.runtime.consumer",
    "JobContext": "harness.runtime.consumer",
    "NO_METRICS": "harness.runtime.metrics",
    "HarnessMetrics": "harness.runtime.metrics",
    "Metrics": "harness.runtime.metrics",
    "RetryPolicy": "harness.runtime.retry",
    "RetryPolicyError": "harness.runtime.retry",
    "Worker": "harness.runtime.worker",
    "WorkerConfig": "harness.runtime.worker",
    "WorkerStats": "harness.runtime.worker",
}

__all__ = [
    "NO_METRICS",
    "NO_TENANT",
    "Acked",
    "Action",
    "ActionContext",
    "ActionError",
    "Consumer",
    "ConsumerError",
    "DeadLettered",
    "Delivery",
    "Duplicate",
    "Effect",
    "Envelope",
    "HarnessMetrics",
    "Held",
    "InvalidPayload",
    "JobContext",
    "Metrics",
    "NotSent",
    "Outcome",
    "PermanentError",
    "PgQueue",
    "PoisonMessage",
    "QueuePort",
    "RetryAfter",
    "RetryPolicy",
    "RetryPolicyError",
    "Stale",
    "TransientError",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "handle",
    "settle",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # once: the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
