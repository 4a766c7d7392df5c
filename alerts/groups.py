"""What one incident of the alert feed covers and says: a group of dead letters or executions, and its text's helpers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class AlertGroup:
    """Rows one incident will cover: one queue's dead letters, one consumer's executions, or
    (``queue`` None) a folded storm. ``queue`` is the group: a queue, or a consumer."""

    kind: str
    queue: str | None
    ids: tuple[int, ...]
    first_created: datetime
    last_created: datetime
    errors: tuple[tuple[str, int], ...] = ()
    samples: tuple[tuple[str, str | None], ...] = ()
    queues: tuple[tuple[str, int], ...] = ()  # the folded groups and their counts
    # Executions only: when each entered RECONCILIATION_REQUIRED (its episode), in ids' order.
    episodes: tuple[datetime, ...] = ()

    def alert_key(self, installation: str) -> str:
        """Deterministic within one installation: the same kind and rows (and, for executions,
        episodes) always give the same key; another installation (another database, or this one
        after ``downgrade base``) gives another key for the same ids."""
        ids = ",".join(map(str, self.ids))
        covered = f"{installation}|{self.kind}|{ids}"
        if self.episodes:  # an execution uncertain again is another episode: another key
            covered += "|" + ",".join(moment.astimezone(UTC).isoformat() for moment in self.episodes)
        digest = hashlib.sha256(covered.encode()).hexdigest()[:16]
        return f"core-jobs:{installation}:{self.kind}:{self.ids[0]}-{self.ids[-1]}:{len(self.ids)}:{digest}"


# The name the dead-letter feed gave it first.
DeadLetterGroup = AlertGroup


@dataclass(frozen=True)
class PlannedIncident:
    kind: str
    queue: str | None
    alert_key: str
    name: str
    summary: str
    description: str
    dead_letter_ids: tuple[int, ...]  # the covered rows' ids: dead letters or executions


def reason_and_sample_lines(group: AlertGroup, reasons_title: str) -> list[str]:
    """The description's shared middle: the most frequent reasons, then sample jobs, each a block."""
    lines: list[str] = []
    if group.errors:
        lines.append(reasons_title)
        lines += [f"  {count} × {error}" for error, count in group.errors]
        lines.append("")
    if group.samples:
        lines.append("Samples (job_id / correlation_id):")
        lines += [f"  {job_id} / {correlation_id or '-'}" for job_id, correlation_id in group.samples]
        lines.append("")
    return lines


def when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def human(delta: timedelta) -> str:
    """3 days, 5 days 2 hours, 40 minutes: the two largest units."""
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts[:2]) or "less than a minute"
