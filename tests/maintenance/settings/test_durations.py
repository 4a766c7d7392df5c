"""Durations: seconds, numbers with units or ISO-8601 in, compact exact ISO-8601 out (pure: no database)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from maintenance.settings import format_duration, parse_duration

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P7D", timedelta(days=7)),
        ("PT30S", timedelta(seconds=30)),
        ("P1DT12H", timedelta(days=1, hours=12)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("P2W", timedelta(weeks=2)),
        ("30", timedelta(seconds=30)),
        ("0.5", timedelta(milliseconds=500)),
        ("pt5m", timedelta(minutes=5)),
        ("2s", timedelta(seconds=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h", timedelta(hours=1)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("1.5h", timedelta(minutes=90)),
        ("1m30s250ms", timedelta(minutes=1, seconds=30, milliseconds=250)),
        ("-5s", timedelta(seconds=-5)),
    ],
)
def test_durations_accept_seconds_numbers_with_units_or_iso_8601(text, expected):
    """A duration is a number of seconds, numbers with units (Go's 1h30m) or ISO-8601."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["7 days", "P", "PT", "P1M", "P1Y", "", "1y", "5mo", "1h1h", "h", "1 h", "1h 30m", "2S"]
)
def test_unparsable_durations_are_refused_naming_the_accepted_forms(text):
    """Anything else — including months and years, whose length is ambiguous, and a unit twice — is an error that
    says which forms are accepted."""
    with pytest.raises(ValueError, match=r"500ms, 2s, 5m, 1h30m.*PT30S, P7D") as refused:
        parse_duration(text)
    assert "seconds like 30" in str(refused.value)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_durations_that_are_not_finite_are_refused(text):
    """A number of seconds must be finite."""
    with pytest.raises(ValueError, match="finite"):
        parse_duration(text)


def test_format_duration_round_trips():
    """Durations print back as compact ISO-8601."""
    for delta in (
        timedelta(days=7),
        timedelta(seconds=672),
        timedelta(0),
        timedelta(hours=1, seconds=1.5),
        timedelta(minutes=22, seconds=23, microseconds=999999),
        timedelta(days=999999999, microseconds=1),
    ):
        assert parse_duration(format_duration(delta)) == delta


def test_format_duration_shows_exact_microseconds_never_rounded():
    """A duration prints exactly, to the microsecond: 23.999999 s is not shown as 24 s."""
    assert format_duration(timedelta(minutes=22, seconds=23, microseconds=999999)) == "PT22M23.999999S"
    assert format_duration(timedelta(seconds=59, microseconds=999999)) == "PT59.999999S"
    assert format_duration(timedelta(days=123456789, microseconds=1)) == "P123456789DT0.000001S"
    assert format_duration(-timedelta(microseconds=500)) == "-PT0.0005S"
