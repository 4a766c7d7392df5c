"""Durations: how every duration setting is written, read and shown.

A duration is a number of seconds (``30``, ``0.5``), numbers with units (``2s``, ``500ms``, ``5m``,
``1h30m``, ``7d``, ``2w``: Go's and Kubernetes' way, each unit at most once) or ISO-8601 (``P7D``,
``PT30S``, ``P1DT12H``, ``P2W``). Months and years are refused: their length is ambiguous; a value
in none of these forms is refused with the forms accepted (:data:`ACCEPTED_FORMS`). A leading ``-`` is
read, so that the range check names the real problem ("must be positive"). Durations are shown
back (check-config, the TTL guard) as compact ISO-8601, exact to the microsecond. A duration that
becomes a PostgreSQL parameter (``lock_timeout``, ``statement_timeout``) is a
:data:`PostgresTimeout`: 1 ms to 2 147 483 647 ms (about 24.8 days), PostgreSQL's range, checked at
load rather than refused by the server at the first connection.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

_ISO_DURATION = re.compile(
    r"^P(?!$)(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)

# Numbers with units, largest first or not: 1h30m, 500ms, 2s, 7d. `ms` before `m` (the alternation's order).
_UNIT = re.compile(r"(\d+(?:\.\d+)?)(ms|w|d|h|m|s)")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds", "ms": "milliseconds"}

ACCEPTED_FORMS = (
    "seconds like 30 or 0.5; a number with a unit, or several, like 500ms, 2s, 5m, 1h30m, 7d, 2w "
    "(units ms, s, m, h, d, w); or ISO-8601 like PT30S, P7D, P1DT12H (no months or years)"
)
_REFUSED = f"expected a duration: {ACCEPTED_FORMS}"


def _with_units(text: str) -> dict[str, float] | None:
    """``1h30m`` as ``{"hours": 1, "minutes": 30}``; None when ``text`` is not numbers with units (each once)."""
    parts: dict[str, float] = {}
    end = 0
    for match in _UNIT.finditer(text):
        if match.start() != end:
            return None
        unit = _UNITS[match.group(2)]
        if unit in parts:
            return None
        parts[unit] = float(match.group(1))
        end = match.end()
    return parts if parts and end == len(text) else None


def parse_duration(value: Any) -> timedelta:
    """Parse a duration — seconds (``30``), numbers with units (``2s``, ``500ms``, ``1h30m``) or ISO-8601
    (``P7D``, ``PT30S``) — into a timedelta; anything else is refused naming the accepted forms.

    Months and years are refused: their length is ambiguous. A leading ``-`` is accepted so
    that range checks can name the real problem ("must be positive").
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(_REFUSED)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("duration must be finite")
        return _timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError(_REFUSED)
    text = value.strip()
    sign = 1
    if text.startswith("-"):
        sign, text = -1, text[1:]
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError("duration must be finite")
        return _timedelta(seconds=sign * seconds)
    with_units = _with_units(text)
    if with_units is not None:
        return sign * _timedelta(**with_units)
    match = _ISO_DURATION.match(text.upper())
    if not match:
        raise ValueError(f"{value!r} is not a duration: use {ACCEPTED_FORMS}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return sign * _timedelta(**parts)


def _timedelta(**parts: float) -> timedelta:
    try:
        return timedelta(**parts)
    except OverflowError:  # beyond timedelta's 999 999 999 days: a ValueError names the setting
        raise ValueError("too large: at most 999999999 days") from None


def _must_be_positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


def _must_not_be_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


# PostgreSQL keeps a millisecond parameter (lock_timeout, statement_timeout) in a 32-bit integer.
PG_MAX_MILLISECONDS = 2_147_483_647


def _fits_postgresql(value: timedelta) -> timedelta:
    if value < timedelta(milliseconds=1):
        raise ValueError("must be at least 1 ms: PostgreSQL counts it in milliseconds, and 0 would disable it")
    if value > timedelta(milliseconds=PG_MAX_MILLISECONDS):
        raise ValueError(f"too large for PostgreSQL: at most {PG_MAX_MILLISECONDS} ms (about 24.8 days)")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_must_be_positive)]
NonNegativeDuration = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_must_not_be_negative)]
# A duration that becomes a PostgreSQL millisecond parameter: 1 ms to PG_MAX_MILLISECONDS.
PostgresTimeout = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_fits_postgresql)]


def format_duration(delta: timedelta) -> str:
    """Render a timedelta as a compact ISO-8601 duration (``P7D``, ``PT11M12S``), exact to the microsecond.

    Never rounded: a guard that compares two durations must not print them equal (23.999999 s
    stays ``PT23.999999S``). Integer arithmetic, so huge durations keep their microseconds too.
    """
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    date_part = f"{delta.days}D" if delta.days else ""
    time_part = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    if seconds or delta.microseconds:
        fraction = f".{delta.microseconds:06d}".rstrip("0") if delta.microseconds else ""
        time_part += f"{seconds}{fraction}S"
    if not date_part and not time_part:
        return "PT0S"
    return f"{sign}P{date_part}" + (f"T{time_part}" if time_part else "")


def format_factor(value: float) -> str:
    """A factor as written (``2``, ``1.5``, ``2.0000001``): the shortest text that reads back as exactly ``value``."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
