"""The consumer harness: the idempotency fence in the work transaction, retries, poison, dead letters.

What a consumer service imports, and nothing of the operator's side (listing, replaying or
resolving is the bundle's: ``maintenance/operations/``). Imports nothing else of core-jobs.
A service uses the names of this façade (``from harness import Consumer, Worker, open_queue``);
the subpackages are grouped by concept:

- ``harness.consumer`` — what a service declares: the consumer (``consumer``), its durable
  actions (``actions``) and their effect classes with the rules the executor follows for each
  (``effects``), retry policies (``retry``);
- ``harness.worker`` — the loop behind ``core-jobs worker``; ``harness.handling`` — what happens
  to one delivery; ``harness.fence`` — the work under the fence, one transaction, for both kinds
  of consumer;
- ``harness.durable`` — the executor of durable actions, phase by phase (take, run, settle,
  finish), its SQL and its window;
- ``harness.queue`` — the queue port (``port``: ``QueuePort``, ``Envelope``, the outcomes), its
  reference PostgreSQL adapter (``pgqueue``), and the choice of an adapter from a URL
  (``adapters``: ``open_queue``; RabbitMQ's and third parties' adapters load only when chosen), and a
  producer's publish in its own transaction through the outbox (``outbox``: ``publish_in_transaction``);
- what they all stand on: ``harness.dead_letters`` (the writer), ``harness.metrics`` (what is
  counted), ``harness.errors`` (how a handler says what went wrong, and how an error becomes
  text), ``harness.pg`` and ``harness.pipelined`` (the PostgreSQL helpers: the clock read once,
  advisory locks, statements that travel with their BEGIN), ``harness.enumerations`` (the values
  the harness's tables allow).

Each layer imports only those below it, in that order (pyproject.toml's import contracts).

The façade loads lazily (PEP 562): ``import harness.enumerations`` — the CLI's parser — does not
drag psycopg in with it. docs/harness.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.consumer.actions import Action, ActionContext, ActionError, Effect
    from harness.consumer.consumer import Consumer, ConsumerError, JobContext
    from harness.consumer.retry import RetryPolicy, RetryPolicyError
    from harness.errors import NotSent, PermanentError, PoisonMessage, TransientError
    from harness.fence import Runtime
    from harness.handling import handle
    from harness.metrics import NO_METRICS, HarnessMetrics, Metrics, WorkerMetrics
    from harness.pg import SchemaNotMigrated, require_schema
    from harness.queue.adapters import QueueUrlError, open_queue
    from harness.queue.ids import new_job_id
    from harness.queue.memory import MemoryBroker, MemoryQueue, memory_broker
    from harness.queue.outbox import NoTransaction, publish_in_transaction
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
    from harness.worker import Worker, WorkerConfig, WorkerGroup, WorkerGroupError, WorkerStats

# Each public name → the module that defines it, loaded on the name's first use. The names are listed again in the
# TYPE_CHECKING imports and __all__ because type checkers read only those (a literal __all__ is how a consumer's
# `mypy --strict` sees them exported); tests/harness/test_facade.py keeps the three equal.
_HOMES = {
    "Action": "harness.consumer.actions",
    "ActionContext": "harness.consumer.actions",
    "ActionError": "harness.consumer.actions",
    "Effect": "harness.consumer.actions",
    "NotSent": "harness.errors",
    "PermanentError": "harness.errors",
    "PoisonMessage": "harness.errors",
    "TransientError": "harness.errors",
    "Runtime": "harness.fence",
    "handle": "harness.handling",
    "PgQueue": "harness.queue.pgqueue",
    "SchemaNotMigrated": "harness.pg",
    "require_schema": "harness.pg",
    "NoTransaction": "harness.queue.outbox",
    "publish_in_transaction": "harness.queue.outbox",
    "QueueUrlError": "harness.queue.adapters",
    "open_queue": "harness.queue.adapters",
    "new_job_id": "harness.queue.ids",
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
    "Consumer": "harness.consumer.consumer",
    "ConsumerError": "harness.consumer.consumer",
    "JobContext": "harness.consumer.consumer",
    "NO_METRICS": "harness.metrics",
    "HarnessMetrics": "harness.metrics",
    "Metrics": "harness.metrics",
    "WorkerMetrics": "harness.metrics",
    "RetryPolicy": "harness.consumer.retry",
    "RetryPolicyError": "harness.consumer.retry",
    "MemoryBroker": "harness.queue.memory",
    "MemoryQueue": "harness.queue.memory",
    "memory_broker": "harness.queue.memory",
    "Worker": "harness.worker",
    "WorkerConfig": "harness.worker",
    "WorkerGroup": "harness.worker",
    "WorkerGroupError": "harness.worker",
    "WorkerStats": "harness.worker",
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
    "MemoryBroker",
    "MemoryQueue",
    "Metrics",
    "NoTransaction",
    "NotSent",
    "Outcome",
    "PermanentError",
    "PgQueue",
    "PoisonMessage",
    "QueuePort",
    "QueueUrlError",
    "RetryAfter",
    "RetryPolicy",
    "RetryPolicyError",
    "Runtime",
    "SchemaNotMigrated",
    "Stale",
    "TransientError",
    "Worker",
    "WorkerConfig",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerMetrics",
    "WorkerStats",
    "handle",
    "memory_broker",
    "new_job_id",
    "open_queue",
    "publish_in_transaction",
    "require_schema",
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
