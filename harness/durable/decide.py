"""What a failed attempt leads to, and what an answer must be: pure, read from the effect rules.

:func:`decide` is docs/durable-actions.md's failure table, computed from the failed action's row
of :data:`harness.consumer.effects.RULES` (the final write's: :data:`~harness.consumer.effects.FINAL_WRITE`).
:func:`validated` checks an answer (or a stored result) against the action's ``output`` contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from harness.consumer.actions import Action
from harness.consumer.effects import Effect, rules_of
from harness.errors import NotSent, PermanentError, describe_error, validation_problems
from harness.queue.port import InvalidPayload, check_payload

__all__ = ["Decision", "OutputBroken", "WorkerLost", "decide", "validated"]


class OutputBroken(Exception):
    """An action's answer broke its declared ``output`` contract (or is not JSON): it will not become valid."""


class WorkerLost(Exception):
    """What an interrupted attempt is recorded as: the worker running it was lost."""


@dataclass(frozen=True)
class Decision:
    """What a failed attempt leads to (docs/durable-actions.md, the failure table)."""

    kind: Literal["retry", "failed", "reconcile"]
    reason: Literal["permanent", "exhausted"] | None = None  # for "failed"


def decide(effect: Effect | None, error: BaseException, attempt: int, max_attempts: int) -> Decision:
    """The contract's failure table; ``effect`` None is the final local write (the queue policy).

    An invalid answer follows the rules' ``invalid_output``, a ``PermanentError`` fails at once.
    Any other error is retried while attempts remain if the rules allow a retry of its kind —
    ``NotSent`` proves the request never left; anything else may have reached the provider —
    and otherwise ends as the rules' ``gives_up_if_*`` of that kind says.
    """
    rules = rules_of(effect)
    if isinstance(error, OutputBroken):
        return Decision("reconcile") if rules.invalid_output == "reconcile" else Decision("failed", "permanent")
    if isinstance(error, PermanentError):
        return Decision("failed", "permanent")
    not_sent = isinstance(error, NotSent)
    retries = rules.retries_if_not_sent if not_sent else rules.retries_if_maybe_sent
    if retries and attempt < max_attempts:
        return Decision("retry")
    gives_up = rules.gives_up_if_not_sent if not_sent else rules.gives_up_if_maybe_sent
    return Decision("reconcile") if gives_up == "reconcile" else Decision("failed", "exhausted")


def validated(action: Action, value: Any, what: str = "the answer") -> Any:
    """The result as the action's ``output`` model (or the JSON value itself), else :class:`OutputBroken`.

    ``what`` names the value in the error: the answer just received, or a checkpoint's stored result
    (checked against today's ``output``, which a deploy may have changed since it was stored)."""
    if action.output is not None:
        try:
            return action.output.model_validate(value)
        except Exception as exc:  # a validator's TypeError is not wrapped by pydantic: broken all the same
            problems = validation_problems(exc, what) if isinstance(exc, ValidationError) else []
            first = f"{problems[0]} ({len(problems)} problem(s))" if problems else describe_error(exc)
            contract = "today's output contract" if what != "the answer" else "its output contract"
            raise OutputBroken(f"{action.name}: {what} breaks {contract}: {first}") from exc
    try:
        check_payload(value)
    except InvalidPayload as exc:
        raise OutputBroken(f"{action.name}: {what} cannot be stored as JSON: {exc}") from exc
    return value
