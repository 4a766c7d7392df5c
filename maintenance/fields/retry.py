"""Retry policies (J-B3) and, beside the retry window it guards, the TTL guard (J-B7).

The default policy is ``CORE_JOBS_RETRY_*`` (:mod:`maintenance.settings.foundation`); a queue
may have its own policy in ``CORE_JOBS_RETRY_OVERRIDES`` (:class:`RetryOverride`), which
must say why (``justification``) and overrides only the fields it names
(:func:`policy_with_override`). The maximum retry window is the worst policy's window plus the
broker's own redelivery horizon (:func:`worst_retry_window`). The TTL guard (:class:`TtlGuard`)
holds that a processed_jobs fence outlives every retry and redelivery:
``PROCESSED_JOBS_TTL >= TTL_MARGIN x max retry window``; its explanation shows every figure
exactly (never rounded) and, when short, what to change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from difflib import get_close_matches
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.ttl_guard import TtlGuard as _TtlGuard
from maintenance.fields.durations import Duration, format_duration, format_factor
from maintenance.fields.environment import ENV_PREFIX


class RetryOverride(BaseModel):
    """A per-queue retry policy. J-B3: overriding the default needs a written justification.

    Its keys (:data:`RETRY_OVERRIDE_KEYS`): ``justification`` (required), and any of ``max_attempts``,
    ``base_delay``, ``max_delay`` (durations: ``30s``, ``PT5M``…), ``jitter`` (0–1) and ``retry_after_cap`` (a
    duration), each replacing the default policy's ``CORE_JOBS_RETRY_*`` value for this queue. Another key is
    refused, naming the valid ones (and the closest, for a typo).
    """

    model_config = {"extra": "forbid"}

    justification: str = Field(description="Why this queue needs a policy other than the default.")
    max_attempts: int | None = None
    base_delay: Duration | None = None
    max_delay: Duration | None = None
    jitter: float | None = None
    retry_after_cap: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key in value:
                if key not in RETRY_OVERRIDE_KEYS:
                    closest = get_close_matches(str(key), RETRY_OVERRIDE_KEYS, n=1)
                    hint = f"did you mean {closest[0]}? " if closest else ""
                    raise ValueError(
                        f"unknown key {key!r}; {hint}the keys are {', '.join(RETRY_OVERRIDE_KEYS)}"
                        " (justification required)"
                    )
        return value

    @field_validator("justification")
    @classmethod
    def _justification_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must explain why this queue overrides the default retry policy (J-B3)")
        return value.strip()


# The keys of one queue's override in CORE_JOBS_RETRY_OVERRIDES, as documented.
RETRY_OVERRIDE_KEYS = ("justification", "max_attempts", "base_delay", "max_delay", "jitter", "retry_after_cap")


def policy_with_override(default: RetryPolicy, override: RetryOverride | None) -> RetryPolicy:
    """``default`` with the fields ``override`` names replaced; ``default`` itself when there is no override."""
    if override is None:
        return default
    fields = override.model_dump(exclude={"justification"}, exclude_none=True)
    values: dict[str, Any] = {
        "max_attempts": default.max_attempts,
        "base_delay": default.base_delay,
        "max_delay": default.max_delay,
        "jitter": default.jitter,
        "retry_after_cap": default.retry_after_cap,
    } | fields
    return RetryPolicy(**values)


def worst_retry_window(policies: Iterable[RetryPolicy], broker_redelivery_horizon: timedelta) -> timedelta:
    """The longest time a job may still be retried: the worst policy's window + the broker's redelivery horizon."""
    return max(max_retry_window(p) for p in policies) + broker_redelivery_horizon


@dataclass(frozen=True)
class TtlGuard(_TtlGuard):
    """TTL versus the retry window (J-B7), the harness's predicate (harness/ttl_guard.py) told in settings' names."""

    def explain(self) -> str:
        verdict = "ok" if self.ok else "TOO SHORT"
        text = (
            f"{ENV_PREFIX}PROCESSED_JOBS_TTL={format_duration(self.ttl)} vs {ENV_PREFIX}TTL_MARGIN={format_factor(self.margin)}"
            f" x max retry window {format_duration(self.window)} = {format_duration(self.required)}: {verdict}"
        )
        if not self.ok:
            text += (
                f"; raise {ENV_PREFIX}PROCESSED_JOBS_TTL to at least {format_duration(self.required)},"
                f" or shorten the retry policies ({ENV_PREFIX}RETRY_*, {ENV_PREFIX}RETRY_OVERRIDES)"
                f" or {ENV_PREFIX}BROKER_REDELIVERY_HORIZON"
            )
        return text
