"""The retry policy (issue 2 point 6, J-B3, R-2): pure logic, so no database, no HTTP, no clock."""

import random
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

import harness.consumer.retry
from harness.consumer.retry import (
    RetryPolicy,
    RetryPolicyError,
    compute_delay,
    max_retry_window,
    parse_retry_after,
)

pytestmark = pytest.mark.pure

DEFAULTS = RetryPolicy()
NO_JITTER = RetryPolicy(jitter=0)
LOWEST = lambda: 0.0  # noqa: E731 - bottom of the jitter range: 80 %
HIGHEST = lambda: 0.999999  # noqa: E731 - just under the top of the jitter range: ~120 %
NOW = datetime(2015, 10, 21, 7, 27, 0, tzinfo=UTC)
ONE_MINUTE_AFTER_NOW = "Wed, 21 Oct 2015 07:28:00 GMT"


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


# --- backoff ------------------------------------------------------------------------------------


@pytest.mark.parametrize("retry_number, expected", [(1, 30), (2, 60), (3, 120), (4, 240)])
def test_nominal_delay_doubles_from_base_delay(retry_number, expected):
    """Without jitter, retry k waits base_delay · 2^(k−1): 30, 60, 120, 240 s."""
    assert compute_delay(NO_JITTER, retry_number) == seconds(expected)


@pytest.mark.parametrize("retry_number, expected", [(7, 1920), (8, 3600), (20, 3600)])
def test_nominal_delay_is_capped_at_max_delay(retry_number, expected):
    """Once base·2^(k−1) passes max_delay (1 h) the delay stays at max_delay; just below, it doesn't."""
    assert compute_delay(NO_JITTER, retry_number) == seconds(expected)


@pytest.mark.parametrize("retry_number, expected", [(1, 24), (2, 48), (3, 96), (4, 192)])
def test_lowest_random_draw_gives_80_percent(retry_number, expected):
    """random() = 0.0 scales the nominal delay by 1 − jitter = 80 %."""
    assert compute_delay(DEFAULTS, retry_number, random=LOWEST) == seconds(expected)


@pytest.mark.parametrize("retry_number, top", [(1, 36), (2, 72), (3, 144), (4, 288)])
def test_highest_random_draw_gives_just_under_120_percent(retry_number, top):
    """random() → 1 scales the nominal delay towards, but not past, 1 + jitter = 120 %."""
    delay = compute_delay(DEFAULTS, retry_number, random=HIGHEST)
    assert seconds(top * 0.9999) < delay < seconds(top)


def test_jitter_never_lifts_a_delay_above_max_delay():
    """A nominal delay near the cap, jittered upwards, is clamped to max_delay."""
    near_cap = RetryPolicy(base_delay=timedelta(minutes=55))  # 3300 s × ~1.2 ≈ 3960 s > 1 h
    assert compute_delay(near_cap, 1, random=HIGHEST) == timedelta(hours=1)
    assert compute_delay(near_cap, 1, random=LOWEST) == seconds(3300 * 0.8)
    assert compute_delay(DEFAULTS, 8, random=HIGHEST) == timedelta(hours=1)


def test_injected_random_source_makes_delays_reproducible():
    """The same seeded source gives the same delays, each from exactly one draw per call."""
    first, second, witness = random.Random(42), random.Random(42), random.Random(42)
    delays_a = [compute_delay(DEFAULTS, k, random=first.random) for k in range(1, 5)]
    delays_b = [compute_delay(DEFAULTS, k, random=second.random) for k in range(1, 5)]
    assert delays_a == delays_b
    for k, delay in enumerate(delays_a, start=1):
        factor = 0.8 + 0.4 * witness.random()
        assert delay.total_seconds() == pytest.approx(30 * 2 ** (k - 1) * factor, abs=1e-6)
    assert len(set(delays_a)) == 4


@pytest.mark.parametrize("retry_number", [10**9, 2**62])
def test_huge_retry_numbers_do_not_overflow_and_stay_within_max_delay(retry_number):
    """Absurd retry numbers give the capped delay, jittered down to 80 % or clamped at 1 h."""
    assert compute_delay(DEFAULTS, retry_number, random=LOWEST) == seconds(2880)
    assert compute_delay(DEFAULTS, retry_number, random=HIGHEST) == timedelta(hours=1)
    assert compute_delay(NO_JITTER, retry_number) == timedelta(hours=1)


@pytest.mark.parametrize("retry_number", [0, -1, 1.0, True])
def test_retry_number_must_be_a_positive_integer(retry_number):
    """Retry numbers start at 1; anything else is rejected naming retry_number."""
    with pytest.raises(RetryPolicyError, match="retry_number") as raised:
        compute_delay(DEFAULTS, retry_number)
    assert raised.value.field == "retry_number"


def test_random_source_outside_unit_interval_is_rejected():
    """A broken random source is reported, not silently turned into a longer delay."""
    with pytest.raises(RetryPolicyError, match="random"):
        compute_delay(DEFAULTS, 1, random=lambda: 5.0)


# --- Retry-After parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("120", seconds(120)),
        (" 7 ", seconds(7)),
        ("0", seconds(0)),
        ("1.5", seconds(1.5)),
        (5, seconds(5)),
        (2.5, seconds(2.5)),
        (timedelta(seconds=42), seconds(42)),
    ],
)
def test_retry_after_in_seconds_is_parsed(value, expected):
    """delta-seconds, decimal seconds, numbers and timedeltas are read as a delay."""
    assert parse_retry_after(value, now=NOW) == expected


def test_retry_after_http_date_is_relative_to_now():
    """An HTTP-date is the time from `now` until that date, whatever zone `now` is in."""
    assert parse_retry_after(ONE_MINUTE_AFTER_NOW, now=NOW) == seconds(60)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000", now=NOW) == seconds(60)
    two_hours_east = timezone(timedelta(hours=2))
    assert parse_retry_after(ONE_MINUTE_AFTER_NOW, now=NOW.astimezone(two_hours_east)) == seconds(60)


def test_retry_after_http_date_in_the_past_means_no_wait():
    """A date already past asks for no wait at all, not a negative one."""
    assert parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now=NOW) == timedelta(0)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "garbage",
        "-5",
        "-1.5",
        "+5",
        "1e3",
        "nan",
        "inf",
        "Wed, 32 Oct 2015 07:28:00 GMT",
        -3,
        float("nan"),
        float("inf"),
        timedelta(seconds=-1),
        True,
    ],
)
def test_invalid_retry_after_is_ignored(value):
    """Garbage, negative, non-finite and empty Retry-After values parse to None."""
    assert parse_retry_after(value, now=NOW) is None


def test_absurdly_large_retry_after_saturates_instead_of_overflowing():
    """A valid but astronomically large delta-seconds is read as the longest timedelta."""
    assert parse_retry_after("9" * 5000, now=NOW) == timedelta.max


def test_now_must_be_timezone_aware():
    """A naive `now` cannot anchor an HTTP-date and is rejected naming `now`."""
    with pytest.raises(RetryPolicyError, match="now"):
        parse_retry_after(ONE_MINUTE_AFTER_NOW, now=datetime(2015, 10, 21, 7, 27))


# --- Retry-After versus backoff -----------------------------------------------------------------


@pytest.mark.parametrize(
    "retry_after, expected",
    [("3600", 120), (3600.0, 120), ("Wed, 21 Oct 2015 08:27:00 GMT", 120), ("119", 119)],
)
def test_retry_after_is_bounded_to_retry_after_cap(retry_after, expected):
    """A Retry-After above retry_after_cap (120 s) is honoured only up to the cap."""
    assert compute_delay(NO_JITTER, 1, retry_after=retry_after, now=NOW) == seconds(expected)


def test_retry_after_cap_is_configurable():
    """A policy with a larger cap honours a longer Retry-After, up to that cap."""
    patient = RetryPolicy(jitter=0, retry_after_cap=timedelta(minutes=10))
    assert compute_delay(patient, 1, retry_after="3600") == timedelta(minutes=10)
    assert compute_delay(patient, 1, retry_after="300") == timedelta(minutes=5)


def test_retry_after_wins_when_longer_than_backoff():
    """Retry 1 (30 s backoff) with Retry-After 90 s or one minute away waits the Retry-After."""
    assert compute_delay(NO_JITTER, 1, retry_after="90") == seconds(90)
    assert compute_delay(NO_JITTER, 1, retry_after=ONE_MINUTE_AFTER_NOW, now=NOW) == seconds(60)


def test_backoff_wins_when_longer_than_retry_after():
    """Retry 4 (240 s backoff) ignores a shorter Retry-After: it never shortens a delay."""
    assert compute_delay(NO_JITTER, 4, retry_after="100") == seconds(240)
    assert compute_delay(DEFAULTS, 4, retry_after="100", random=LOWEST) == seconds(192)


@pytest.mark.parametrize("retry_after", ["garbage", "-60", "nan", ""])
def test_invalid_retry_after_leaves_the_backoff_alone(retry_after):
    """An unparsable Retry-After is ignored and the jittered backoff is the delay."""
    assert compute_delay(DEFAULTS, 2, retry_after=retry_after, random=LOWEST) == seconds(48)


# --- worst-case window --------------------------------------------------------------------------


def test_max_retry_window_of_the_defaults_is_672_seconds():
    """Retries 1..4 at the top of jitter (36, 72, 144, 288 s), each at least the 120 s bound."""
    assert max_retry_window(DEFAULTS) == seconds(120 + 120 + 144 + 288)


def test_max_retry_window_without_retries_is_zero():
    """A policy with a single attempt never retries, so its window is empty."""
    assert max_retry_window(RetryPolicy(max_attempts=1)) == timedelta(0)


def test_max_retry_window_counts_capped_retries_at_max_delay():
    """Retries past the cap each add max_delay, even for a huge max_attempts."""
    ten_attempts = 120 + 120 + 144 + 288 + 576 + 1152 + 2304 + 3600 + 3600
    assert max_retry_window(RetryPolicy(max_attempts=10)) == seconds(ten_attempts)
    huge = RetryPolicy(max_attempts=10**9)
    assert max_retry_window(huge) == seconds(ten_attempts) + (10**9 - 10) * timedelta(hours=1)


def test_max_retry_window_bounds_every_drawn_schedule():
    """No schedule drawn from any random source, with any Retry-After, exceeds the window."""
    source = random.Random(7)
    for _ in range(200):
        drawn = sum(
            (compute_delay(DEFAULTS, k, retry_after="3600", random=source.random) for k in range(1, 5)),
            timedelta(0),
        )
        assert drawn <= max_retry_window(DEFAULTS)


@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(max_attempts=10**18),  # overflows among the retries capped at max_delay
        RetryPolicy(
            max_attempts=50, base_delay=timedelta(days=999_999), max_delay=timedelta(days=999_999_999)
        ),  # before the cap
    ],
)
def test_unrepresentable_window_is_reported_naming_max_attempts(policy):
    """A window longer than any timedelta is a configuration error, not an OverflowError."""
    with pytest.raises(RetryPolicyError, match="max_attempts"):
        max_retry_window(policy)


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"base_delay": timedelta(0)}, "base_delay"),
        ({"base_delay": 30}, "base_delay"),
        ({"max_delay": timedelta(seconds=29)}, "max_delay"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": float("nan")}, "jitter"),
        ({"retry_after_cap": timedelta(seconds=-1)}, "retry_after_cap"),
    ],
)
def test_invalid_policy_is_rejected_naming_the_field(overrides, field):
    """Each out-of-range or mistyped option raises RetryPolicyError that names it."""
    with pytest.raises(RetryPolicyError, match=field) as raised:
        RetryPolicy(**overrides)
    assert raised.value.field == field
    assert isinstance(raised.value, ValueError)


def test_defaults_follow_j_b3_and_r_2():
    """Defaults: 5 attempts (4 retries), base 30 s, cap 1 h, jitter ±20 %, Retry-After bound 120 s."""
    assert (DEFAULTS.max_attempts, DEFAULTS.max_retries) == (5, 4)
    assert (DEFAULTS.base_delay, DEFAULTS.max_delay) == (seconds(30), timedelta(hours=1))
    assert (DEFAULTS.jitter, DEFAULTS.retry_after_cap) == (0.2, seconds(120))


def test_schedule_table_in_the_module_docstring_matches_the_code():
    """The operator's manual shows the schedule the code actually computes."""
    rows = re.findall(r"^ {4}(\d)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", harness.consumer.retry.__doc__, re.M)
    assert [int(row[0]) for row in rows] == list(range(1, DEFAULTS.max_retries + 1))
    for k, nominal, low, high, worst in (map(int, row) for row in rows):
        assert compute_delay(NO_JITTER, k) == seconds(nominal)
        assert compute_delay(DEFAULTS, k, random=LOWEST) == seconds(low)
        assert compute_delay(DEFAULTS, k, random=lambda: 1.0) == seconds(high)
        assert max(seconds(high), DEFAULTS.retry_after_cap) == seconds(worst)
    terms = " + ".join(row[4] for row in rows)
    window = int(max_retry_window(DEFAULTS).total_seconds())
    assert f"max_retry_window = {terms} = {window} s" in harness.consumer.retry.__doc__
