"""Declaring durable actions: the external calls of a consumer, each with its effect class.

A consumer whose work calls providers over the network declares that work as ordered, named
actions; its ``handler`` stays the final local write, in the fence's transaction::

    credit_points = Consumer(
        name="points.credit.ledger",
        queue="points.credit.ledger",
        payload_schema=CreditPoints,
        business_scope="loyalty",                       # who may resolve it (R-6)
        actions=(
            Action(name="lookup", effect=Effect.READ_ONLY, call=lookup, output=Member),
            Action(name="credit", effect=Effect.IDEMPOTENT_WRITE, call=credit, output=Receipt),
            Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=notify, output=Sent),
        ),
        handler=record_credit,   # handler(conn, payload, ctx); ctx.results["credit"] is a Receipt
    )

Effect classes (harness/consumer/effects.py: each one's rules, one entry of a table)
--------------------------------------------------------------------------------
- ``READ_ONLY`` — changes nothing at the provider: safe to run again at any time.
- ``IDEMPOTENT_WRITE`` — changes something, and the provider deduplicates on the key we send
  (:attr:`ActionContext.idempotency_key`, ``job_id:consumer:action``, the same on every attempt,
  R-3): sending it again has one effect.
- ``NON_IDEMPOTENT_WRITE`` — changes something and the provider does not deduplicate (a legacy
  endpoint with no key): sent at most once, automatically. If it may have been sent and we do not
  know the answer, the execution goes to ``RECONCILIATION_REQUIRED`` for a person to resolve.

An action is ``call(payload, ctx) -> result``: ``payload`` the validated payload, ``ctx`` an
:class:`ActionContext`. It signals failure with :mod:`harness.errors` (an unclassified exception
is transient). Its result must satisfy ``output`` (a pydantic model; ``None``: any JSON value);
it is stored in the action's checkpoint as JSON and handed to later actions and to the handler
in ``ctx.results`` — as an instance of ``output`` when one is declared. A result that fails the
contract is not retried: an invalid answer will not become valid (docs/durable-actions.md says
what then happens to the execution).

Retry policy (R-2): each action retries on :data:`ACTION_RETRY_POLICY` — the published
defaults: 3 attempts in total, 2 s doubling, jitter 80–120 %, at most 60 s, a ``Retry-After`` up
to 120 s honoured (the larger of the two wins). Another policy needs a written
``retry_justification`` (as J-B3 for queues).

``verified_only`` marks an action whose result an operator may not state by hand when resolving
an execution (a document's registration: its result must come from the verification itself).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from harness.consumer.effects import Effect
from harness.consumer.retry import RetryPolicy

__all__ = [
    "ACTION_RETRY_POLICY",
    "Action",
    "ActionContext",
    "ActionError",
    "Effect",
    "idempotency_key",
    "uncallable_as",
]

# The published retry policy's defaults.
ACTION_RETRY_POLICY = RetryPolicy(
    max_attempts=3,
    base_delay=timedelta(seconds=2),
    max_delay=timedelta(seconds=60),
    jitter=0.2,
    retry_after_cap=timedelta(seconds=120),
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ActionError(ValueError):
    """An invalid action declaration; the message names the action and the field."""


def idempotency_key(job_id: UUID, consumer: str, action: str) -> str:
    """The key an action sends to its provider: ``job_id:consumer:action``, stable across attempts (R-3)."""
    return f"{job_id}:{consumer}:{action}"


@dataclass(frozen=True)
class ActionContext:
    """What an action may want to know about the attempt it is running."""

    job_id: UUID
    tenant_id: UUID
    correlation_id: str | None
    consumer: str
    action: str
    attempt: int  # of this action, 1 on the first
    idempotency_key: str  # send it to the provider: the same on every attempt
    results: Mapping[str, Any] = field(default_factory=dict)  # earlier actions' results, by name


def uncallable_as(function: Callable[..., Any], role: str, arguments: tuple[str, ...]) -> str | None:
    """Why ``function`` cannot be called with ``arguments`` positionally (``handler(conn, payload, ctx)``), naming
    its signature; None if it can, or if Python cannot say (a builtin without a signature is given the benefit).
    A declaration is refused with it, rather than its every delivery retried for minutes with a TypeError."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        name = getattr(function, "__qualname__", None) or type(function).__qualname__
        return f"{role} {name}{signature} cannot be called as {role}({', '.join(arguments)}): {exc}"
    return None


@dataclass(frozen=True, kw_only=True)
class Action:
    """One named external call of a durable consumer: see the module docstring."""

    name: str
    effect: Effect
    call: Callable[[Any, ActionContext], Any]
    output: type[BaseModel] | None = None
    retry_policy: RetryPolicy | None = None
    retry_justification: str | None = None
    verified_only: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and _NAME.match(self.name) and len(self.name) <= 64):
            raise ActionError(f"action name must be 1-64 letters, digits and . _ -, got {self.name!r}")
        if not isinstance(self.effect, Effect):
            raise ActionError(f"action {self.name}: effect must be an Effect, got {self.effect!r}")
        if not callable(self.call):
            raise ActionError(f"action {self.name}: call must be callable, got {self.call!r}")
        if (problem := uncallable_as(self.call, "call", ("payload", "ctx"))) is not None:
            raise ActionError(f"action {self.name}: {problem}")
        if self.output is not None and not (isinstance(self.output, type) and issubclass(self.output, BaseModel)):
            raise ActionError(f"action {self.name}: output must be a pydantic model class, got {self.output!r}")
        if self.retry_policy is not None and not (self.retry_justification or "").strip():
            raise ActionError(
                f"action {self.name}: a retry_policy other than the published defaults needs a retry_justification (R-2)"
            )

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy in force: the declared one if justified, else :data:`ACTION_RETRY_POLICY`."""
        return self.retry_policy if self.retry_policy is not None else ACTION_RETRY_POLICY
