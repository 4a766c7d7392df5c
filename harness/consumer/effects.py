"""Effect classes and the one table of rules each follows: the executor consults it, never the class's name.

An action's effect class says what its call does to the provider, and so what the executor may
do when the call fails, answers badly or is interrupted. Each class is one entry of
:data:`RULES`, each rule a question the executor asks (:class:`EffectRules`); no code asks which
class an action has. docs/durable-actions.md ("Effect classes: one table of rules") is this
table in words, checked against it by tests/harness/durable/test_execution_policy.py. :data:`FINAL_WRITE` is the
handler's local write in the fence's transaction (no effect class: it retries on the queue's
policy, and its failure rolls back).

**Adding an effect class** is this table's one entry (a member of :class:`Effect` and its row
in :data:`RULES`; the import-time check below refuses a member without a row) plus a migration
that adds the value to the CHECK of ``core.execution_checkpoints.effect`` (0010), and the value
in :data:`harness.enumerations.EFFECTS`, which tests/migrations/test_enumerations.py holds equal to both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = ["FINAL_WRITE", "RULES", "Effect", "EffectRules", "rules_of"]


class Effect(StrEnum):
    """What an action does to the provider; its entry of :data:`RULES` decides what happens when it fails or is interrupted."""

    READ_ONLY = "READ_ONLY"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"
    NON_IDEMPOTENT_WRITE = "NON_IDEMPOTENT_WRITE"

    @property
    def writes(self) -> bool:
        """Whether it changes something at the provider (its rules' ``writes``)."""
        return RULES[self].writes

    @property
    def rules(self) -> EffectRules:
        """Its entry of :data:`RULES`."""
        return RULES[self]


# What giving up on an action means: FAILED (nothing is in doubt) or RECONCILIATION_REQUIRED.
GiveUp = Literal["failed", "reconcile"]


@dataclass(frozen=True, kw_only=True)
class EffectRules:
    """The rules of one effect class, each a question the executor asks (harness/durable/executor.py)."""

    # It changes something at the provider: an attempt that did not finish leaves a doubt, so the
    # crash-loop bound parks an execution whose such checkpoint is not SUCCEEDED for an operator.
    writes: bool
    # How its STARTED checkpoint is committed — synchronously, fenced, before the request is sent:
    # "none" (no checkpoint before the call: running it again is harmless), "autocommit" (one
    # statement, one round trip: committed after the worker died, it only means a re-send with the
    # same key), "transaction" (an explicit one, whose COMMIT only a live worker sends: its absence
    # is the durable proof that nothing was sent).
    started: Literal["none", "autocommit", "transaction"]
    # A take finds its STARTED checkpoint (a worker was lost mid-call): "retry" (re-send with the
    # same key while attempts remain, then reconcile) or "reconcile" at once. UNCERTAIN always reconciles.
    lost_while_started: Literal["retry", "reconcile"]
    # A failed attempt is retried (while attempts remain) if the error proves the request never
    # left (``NotSent``) / if it may have reached the provider (any other retryable error).
    retries_if_not_sent: bool
    retries_if_maybe_sent: bool
    # Not retried (out of attempts, or not allowed above): what the last error leads to.
    gives_up_if_not_sent: GiveUp
    gives_up_if_maybe_sent: GiveUp
    # Its answer breaks the ``output`` contract (it will not become valid): FAILED (permanent) or
    # RECONCILIATION_REQUIRED (the call may have changed something we cannot record).
    invalid_output: GiveUp


RULES = {
    # Changes nothing: safe to run again at any time.
    Effect.READ_ONLY: EffectRules(
        writes=False,
        started="none",
        lost_while_started="retry",  # never asked: no STARTED checkpoint
        retries_if_not_sent=True,
        retries_if_maybe_sent=True,
        gives_up_if_not_sent="failed",
        gives_up_if_maybe_sent="failed",
        invalid_output="failed",
    ),
    # The provider deduplicates on our key: sending again has one effect; but once its
    # attempts are used, an earlier one may have been applied: an operator decides.
    Effect.IDEMPOTENT_WRITE: EffectRules(
        writes=True,
        started="autocommit",
        lost_while_started="retry",
        retries_if_not_sent=True,
        retries_if_maybe_sent=True,
        gives_up_if_not_sent="reconcile",
        gives_up_if_maybe_sent="reconcile",
        invalid_output="reconcile",
    ),
    # No deduplication: sent at most once automatically. Only a NotSent failure is retried, so
    # running out of attempts means no attempt was sent (FAILED); any doubt is for an operator.
    Effect.NON_IDEMPOTENT_WRITE: EffectRules(
        writes=True,
        started="transaction",
        lost_while_started="reconcile",
        retries_if_not_sent=True,
        retries_if_maybe_sent=False,
        gives_up_if_not_sent="failed",
        gives_up_if_maybe_sent="reconcile",
        invalid_output="reconcile",
    ),
}

# The handler's final local write (no effect class, no checkpoint) fails as a READ_ONLY call does:
# retried on the queue's policy, then FAILED — its failure rolled everything back, nothing is in doubt.
FINAL_WRITE = RULES[Effect.READ_ONLY]


def rules_of(effect: Effect | None) -> EffectRules:
    """The rules of ``effect``; None is the final write (:data:`FINAL_WRITE`)."""
    return FINAL_WRITE if effect is None else RULES[effect]


_missing = set(Effect) - set(RULES)
if _missing:  # pragma: no cover - a declaration error, caught at import
    raise RuntimeError(f"effect classes without rules in harness.consumer.effects.RULES: {sorted(_missing)}")
