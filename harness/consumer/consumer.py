"""Declaring a consumer: one object that says everything the harness needs to run it.

    credit_points = Consumer(
        name="points.credit",            # the fence's consumer column; stable across deploys
        queue="points.credit",           # where its messages wait
        payload_schema=CreditPoints,     # a pydantic model; a payload it rejects is poison (J-B5)
        handler=credit,                  # handler(conn, payload, ctx), runs in the fence's transaction; checked at declaration
    )

The handler gets the connection of the work transaction — the fence row is already inserted in
it (J-B1) — the validated payload (an instance of ``payload_schema``) and a :class:`JobContext`.
It must do its writes on that connection and must not commit or roll back: the harness does
(a handler that ends the transaction is dead-lettered; one that leaves it aborted by a swallowed
database error is retried — see ``harness.handling``).
It signals failures with the exceptions of :mod:`harness.errors`.

Retry policy (J-B3): leave ``retry_policy`` unset and the consumer gets its queue's configured
policy (the J-B3 defaults, or the queue's override in ``CORE_JOBS_RETRY_OVERRIDES``, which must
carry a justification). A policy fixed in code needs a written ``retry_justification`` too, so
an override is never silent.

The fence TTL is deliberately not part of the declaration: it is one platform setting
(``CORE_JOBS_PROCESSED_JOBS_TTL``) guarded against the retry window (J-B7), and the caller of
:func:`harness.handling.handle` passes it, so no consumer can shorten it on its own.

Durable actions (R-1..R-4): a consumer that calls providers over the network declares that work
as ``actions`` — ordered, named, each with an effect class (harness/consumer/actions.py) — and keeps
``handler`` as the final local write, which then finds the actions' results in ``ctx.results``.
The harness records a checkpoint per action and retries, resumes or parks the job for an
operator (``RECONCILIATION_REQUIRED``) by effect class (harness/durable/executor.py,
docs/durable-actions.md). ``business_scope`` names the business area whose operators may resolve
its executions (R-5). A consumer with no actions works exactly as before.

Shared work transactions: the worker commits a batch's deliveries of a plain consumer together, in
one transaction (harness/handling.py, :func:`~harness.handling.handle_together`; a failing job rolls it back
and is settled alone, its batch-mates run again).
A handler that must not share its transaction with other jobs' — it takes a transaction-wide
lock (``pg_advisory_xact_lock``, ``LOCK TABLE``) that would then be held for the whole batch,
sets ``SET LOCAL`` settings, or must be visible to others the moment it commits — says
``shares_transactions=False`` and gets one transaction per job, as before.

Batch handlers: a plain consumer whose work for many jobs is one statement (an ``INSERT … SELECT FROM
unnest(…)``) may add ``batch_handler(conn, payloads, contexts)``, doing in one call what ``handler`` does for
each job in turn. The worker calls it once per shared transaction with that transaction's new jobs (their fences
written, duplicates left out), in order. If it raises, or leaves the transaction aborted, the transaction rolls
back and each of its jobs runs again with ``handler`` — so a failing job is found and settled alone, as ever, and
``handler`` stays required (a call that ended the transaction dead-letters its jobs, as a handler's would). A job
run alone (redelivered, past its attempts) uses ``handler`` too.
docs/harness.md, "Batch handlers".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg
from pydantic import BaseModel

from harness.consumer.actions import Action, uncallable_as
from harness.consumer.retry import RetryPolicy

__all__ = ["Consumer", "ConsumerError", "JobContext", "valid_name"]

Payload = TypeVar("Payload", bound=BaseModel)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


def valid_name(value: object) -> bool:
    """Whether ``value`` can be a consumer's or a queue's name: letters, digits and . _ : -, no spaces."""
    return isinstance(value, str) and _NAME.match(value) is not None


class ConsumerError(ValueError):
    """An invalid consumer declaration; the message names the field."""


@dataclass(frozen=True)
class JobContext:
    """What a handler may want to know about the delivery it is handling."""

    job_id: UUID
    tenant_id: UUID
    correlation_id: str | None
    attempt: int  # 1 on the first delivery
    queue: str
    consumer: str
    results: Mapping[str, Any] = field(default_factory=dict)  # a durable consumer's action results, by name


@dataclass(frozen=True, kw_only=True)
class Consumer(Generic[Payload]):
    """A consumer: see the module docstring."""

    name: str
    queue: str
    payload_schema: type[Payload]
    handler: Callable[[psycopg.Connection, Payload, JobContext], Any]
    retry_policy: RetryPolicy | None = None
    retry_justification: str | None = None
    actions: tuple[Action, ...] = ()
    business_scope: str | None = None
    shares_transactions: bool = True
    batch_handler: Callable[[psycopg.Connection, list[Payload], list[JobContext]], Any] | None = None

    def __post_init__(self) -> None:
        for attribute in ("name", "queue"):
            value = getattr(self, attribute)
            if not valid_name(value):
                raise ConsumerError(
                    f"{attribute} must be a non-blank name of letters, digits and . _ : -, got {value!r}"
                )
        if not (isinstance(self.payload_schema, type) and issubclass(self.payload_schema, BaseModel)):
            raise ConsumerError(f"payload_schema must be a pydantic model class, got {self.payload_schema!r}")
        if not callable(self.handler):
            raise ConsumerError(f"handler must be callable, got {self.handler!r}")
        if (problem := uncallable_as(self.handler, "handler", ("conn", "payload", "ctx"))) is not None:
            raise ConsumerError(f"consumer {self.name}: {problem}")
        if self.retry_policy is not None and not (self.retry_justification or "").strip():
            raise ConsumerError(
                f"consumer {self.name}: a retry_policy other than the queue's configured one needs a "
                "retry_justification (J-B3)"
            )
        if not isinstance(self.actions, tuple) or not all(isinstance(a, Action) for a in self.actions):
            raise ConsumerError(f"consumer {self.name}: actions must be a tuple of harness.consumer.actions.Action")
        names = [a.name for a in self.actions]
        if len(set(names)) != len(names):
            raise ConsumerError(f"consumer {self.name}: action names must be unique, got {names}")
        if not isinstance(self.shares_transactions, bool):
            raise ConsumerError(
                f"consumer {self.name}: shares_transactions must be True or False, got {self.shares_transactions!r}"
            )
        if self.batch_handler is not None:
            if not callable(self.batch_handler):
                raise ConsumerError(f"consumer {self.name}: batch_handler must be callable, got {self.batch_handler!r}")
            problem = uncallable_as(self.batch_handler, "batch_handler", ("conn", "payloads", "contexts"))
            if problem is not None:
                raise ConsumerError(f"consumer {self.name}: {problem}")
            if self.actions:
                raise ConsumerError(
                    f"consumer {self.name}: a batch_handler is for a plain consumer; one with actions runs each job"
                    " as a durable execution of its own"
                )
            if not self.shares_transactions:
                raise ConsumerError(
                    f"consumer {self.name}: a batch_handler runs its jobs in one shared transaction;"
                    " shares_transactions=False asks for one transaction per job"
                )
        if self.business_scope is not None and not valid_name(self.business_scope):
            raise ConsumerError(
                f"consumer {self.name}: business_scope must be a name of letters, digits and . _ : -, "
                f"got {self.business_scope!r}"
            )

    @property
    def durable(self) -> bool:
        """Whether it declares actions: its jobs run as durable executions (harness/durable/executor.py)."""
        return bool(self.actions)

    def action(self, name: str) -> Action | None:
        """The declared action called ``name``, or None."""
        return next((a for a in self.actions if a.name == name), None)

    def policy(self, configured: RetryPolicy) -> RetryPolicy:
        """The retry policy in force: the declared one if justified, else the queue's configured one."""
        return self.retry_policy if self.retry_policy is not None else configured
