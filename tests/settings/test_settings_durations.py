"""Durations: ISO-8601 or seconds in, compact exact ISO-8601 out (pure: no database)."""

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
    ],
)
def test_durations_accept_iso_8601_or_seconds(text, expected):
    """A duration is ISO-8601 or a number of seconds."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["7 days", "P", "PT", "P1M", "P1Y", "nan", "inf", "", "1h"])
def test_unparsable_durations_are_refused(text):
    """Anything else — including months and years, whose length is ambiguous — is an error."""
    with pytest.raises(ValueError):
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
