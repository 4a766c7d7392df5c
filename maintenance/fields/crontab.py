"""Crontab expressions of the ``serve`` schedules (``CORE_JOBS_SCHEDULE_*``), checked as APScheduler 3 reads them.

APScheduler is imported only when an expression is checked, so importing the settings stays light.
"""

from __future__ import annotations

from datetime import UTC
from typing import Annotated

from pydantic import AfterValidator


def check_crontab(expr: str) -> str:
    """A 5-field crontab expression (UTC) that APScheduler 3 accepts; ValueError naming the problem.

    Days of the week must be names (mon-fri, sun): APScheduler 3 numbers them from Monday=0
    while crontab counts from Sunday=0, so a digit there would silently shift the day.
    """
    from apscheduler.triggers.cron import (
        CronTrigger,  # heavy import: only when a schedule is checked
    )

    text = " ".join(str(expr).split())
    fields = text.split(" ") if text else []
    if len(fields) != 5:
        raise ValueError(
            f"not a crontab expression: expected 5 fields (minute hour day month weekday), got {len(fields)}"
        )
    if any(ch.isdigit() for ch in fields[4]):
        raise ValueError(
            "write days of the week as names (mon-fri, sun): APScheduler 3 counts Monday=0, crontab Sunday=0"
        )
    try:
        CronTrigger.from_crontab(text, timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"not a valid crontab expression: {exc}") from None
    return text


# A ``CORE_JOBS_SCHEDULE_<JOB>`` field: each job declares its own with this type.
Crontab = Annotated[str, AfterValidator(check_crontab)]
