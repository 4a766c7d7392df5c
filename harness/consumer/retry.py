"""Retry policy: how long a consumer waits before retrying a failed job.

Pure logic — no I/O, no clock reads unless `now` is omitted, no sleeps. The caller decides
*whether* to retry (poison messages skip retries entirely, J-B5; an exhausted job becomes a
dead letter, J-B4); this module says *when*.

Schedule
--------
A job is delivered at most `max_attempts` times. After attempt n fails (n < max_attempts),
retry number k = n is scheduled after

    delay(k) = min(max_delay, base_delay · 2^(k−1)) × U(1 − jitter, 1 + jitter), clamped to max_delay

where U is drawn as ``1 − jitter + 2·jitter·random()`` from an injectable source returning
values in [0, 1) — one draw per call. The exponent is capped before it is raised, so retry
numbers such as 10**9 cost nothing and give max_delay.

If the peer sent a ``Retry-After`` (delta-seconds, decimal seconds, or an HTTP-date), it is
honoured but bounded to `retry_after_cap` (R-2); invalid, negative or non-finite values are
ignored. The **larger** of the jittered backoff and the bounded Retry-After is the delay, so a
Retry-After can lengthen a delay but never shorten it.

Options (J-B3 defaults; set by `CORE_JOBS_RETRY_*` settings, configured elsewhere)
---------------------------------------------------------------------------------
- ``max_attempts``    int, default 5: total deliveries including the first (so 4 retries).
- ``base_delay``      duration, default 30 s: nominal delay of the first retry; doubles per retry.
- ``max_delay``       duration, default 1 h: cap of any backoff delay, before and after jitter.
- ``jitter``          fraction in [0, 1), default 0.2: delay scaled by 80 %–120 %.
- ``retry_after_cap`` duration, default 120 s: bound on an honoured Retry-After (R-2).

A per-queue override of these values is configuration that must carry a written justification
(J-B3); that rule is enforced where overrides are configured, not here. Invalid values raise
`RetryPolicyError` (a `ValueError`) naming the field.

Default schedule (computed with this module; seconds)
-----------------------------------------------------
    retry k   nominal   min (80 %)   max (120 %)   worst case with Retry-After bound
    1         30        24           36            120
    2         60        48           72            120
    3         120       96           144           144
    4         240       192          288           288

    max_retry_window = 120 + 120 + 144 + 288 = 672 s (11 min 12 s)

`max_retry_window(policy)` is the worst case of the whole schedule: every retry at the top of
its jitter and at the Retry-After bound — the longest time from the first failure until the
last retry can start. The `processed_jobs` TTL must exceed it with a margin (J-B7), or a late
retry after the fence expired would apply the work twice.
"""

from __future__ import annotations

import random as _random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from email.utils import parsedate_to_datetime

__all__ = [
    "RetryPolicy",
    "RetryPolicyError",
    "compute_delay",
    "max_retry_window",
    "parse_retry_after",
]

_ONE_MICROSECOND = timedelta(microseconds=1)
_MAX_MICROSECONDS = timedelta.max // _ONE_MICROSECOND
# delta-seconds (RFC 9110: 1*DIGIT); decimal fractions accepted too. No sign, no exponent.
_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


class RetryPolicyError(ValueError):
    """An invalid retry policy or argument; `field` names the offending value."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RetryPolicy:
    """When to retry a failed job; see the module docstring for each option."""

    max_attempts: int = 5
    base_delay: timedelta = timedelta(seconds=30)
    max_delay: timedelta = timedelta(hours=1)
    jitter: float = 0.2
    retry_after_cap: timedelta = timedelta(seconds=120)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            _fail("max_attempts", f"must be an integer, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            _fail("max_attempts", f"must be at least 1, got {self.max_attempts}")
        for name in ("base_delay", "max_delay", "retry_after_cap"):
            if not isinstance(getattr(self, name), timedelta):
                _fail(name, f"must be a timedelta, got {getattr(self, name)!r}")
        if self.base_delay <= timedelta(0):
            _fail("base_delay", f"must be positive, got {self.base_delay}")
        if self.max_delay < self.base_delay:
            _fail("max_delay", f"must be at least base_delay ({self.base_delay}), got {self.max_delay}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)):
            _fail("jitter", f"must be a number, got {self.jitter!r}")
        if not 0 <= self.jitter < 1:  # also rejects NaN
            _fail("jitter", f"must be in [0, 1), got {self.jitter}")
        if self.retry_after_cap < timedelta(0):
            _fail("retry_after_cap", f"must not be negative, got {self.retry_after_cap}")

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt: max_attempts − 1."""
        return self.max_attempts - 1


def compute_delay(
    policy: RetryPolicy,
    retry_number: int,
    *,
    retry_after: str | float | int | timedelta | None = None,
    now: datetime | None = None,
    random: Callable[[], float] = _random.random,
) -> timedelta:
    """Delay before retry `retry_number` (1 = the first retry, after the first failed attempt).

    The jittered backoff, or the Retry-After bounded to `retry_after_cap` if that is larger.
    `now` (timezone-aware) anchors an HTTP-date Retry-After. `random` must return [0, 1).
    """
    if isinstance(retry_number, bool) or not isinstance(retry_number, int):
        _fail("retry_number", f"must be an integer, got {retry_number!r}")
    if retry_number < 1:
        _fail("retry_number", f"must be at least 1, got {retry_number}")
    draw = random()
    if not 0 <= draw <= 1:  # also rejects NaN
        _fail("random", f"must return a value in [0, 1], got {draw!r}")
    factor = 1 - policy.jitter + 2 * policy.jitter * draw
    delay = _jittered_backoff(policy, retry_number, factor)
    waited = parse_retry_after(retry_after, now=now)
    if waited is not None:
        delay = max(delay, min(waited, policy.retry_after_cap))
    return delay


def parse_retry_after(value: object, *, now: datetime | None = None) -> timedelta | None:
    """The delay a Retry-After value asks for (unbounded), or None if it is invalid.

    Accepts delta-seconds (a non-negative integer or decimal, as text or a number), an HTTP-date
    (a date in the past gives timedelta(0)), or a timedelta. Garbage, negative, NaN/infinite and
    empty values give None. Absurdly large values saturate at timedelta.max.
    """
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        _fail("now", f"must be timezone-aware, got {now!r}")
    if isinstance(value, timedelta):
        return value if value >= timedelta(0) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return _seconds_to_delay(Decimal(value))
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        return _seconds_to_delay(Decimal(text))
    return _http_date_to_delay(text, now or datetime.now(UTC))


def max_retry_window(policy: RetryPolicy) -> timedelta:
    """Worst case of the whole schedule: every retry at the top of its jitter and at the
    Retry-After bound; the longest time from the first failure until the last retry starts."""
    top = 1 + policy.jitter
    total = timedelta(0)
    for retry_number in range(1, policy.max_retries + 1):
        worst = max(_jittered_backoff(policy, retry_number, top), policy.retry_after_cap)
        if _nominal_microseconds(policy, retry_number) >= policy.max_delay // _ONE_MICROSECOND:
            # Every later retry is capped identically: add them in one step, so that a huge
            # max_attempts costs nothing.
            remaining = policy.max_retries - retry_number + 1
            try:
                return total + worst * remaining
            except OverflowError:
                _fail("max_attempts", f"{policy.max_attempts} makes the retry window exceed {timedelta.max}")
        try:
            total += worst
        except OverflowError:
            _fail("max_attempts", f"{policy.max_attempts} makes the retry window exceed {timedelta.max}")
    return total


def _jittered_backoff(policy: RetryPolicy, retry_number: int, factor: float) -> timedelta:
    """min(max_delay, base·2^(k−1)) × factor, clamped to max_delay, rounded to microseconds."""
    max_us = policy.max_delay // _ONE_MICROSECOND
    jittered_us = round(_nominal_microseconds(policy, retry_number) * factor)
    return timedelta(microseconds=max(0, min(max_us, jittered_us)))


def _nominal_microseconds(policy: RetryPolicy, retry_number: int) -> int:
    """min(max_delay, base·2^(k−1)) in microseconds, without ever building a huge power of 2."""
    base_us = policy.base_delay // _ONE_MICROSECOND
    max_us = policy.max_delay // _ONE_MICROSECOND
    # base_us ≥ 1, so a shift by max_us.bit_length() already reaches max_us: cap the exponent there.
    exponent = min(retry_number - 1, max_us.bit_length())
    return min(max_us, base_us << exponent)


def _seconds_to_delay(seconds: Decimal) -> timedelta | None:
    if not seconds.is_finite() or seconds < 0:
        return None
    microseconds = (seconds * 1_000_000).to_integral_value(rounding=ROUND_HALF_EVEN)
    # Compared as a Decimal first, so an absurd value never becomes a huge int.
    return timedelta(microseconds=int(min(microseconds, Decimal(_MAX_MICROSECONDS))))


def _http_date_to_delay(text: str, now: datetime) -> timedelta | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000" or no zone: HTTP-dates are GMT by definition
        when = when.replace(tzinfo=UTC)
    try:
        return max(timedelta(0), when - now)
    except OverflowError:
        return None


def _fail(field: str, problem: str) -> None:
    raise RetryPolicyError(f"{field} {problem}", field=field)
