"""What one incident of the alert feed covers: a group of *items* (dead letters or executions) under one *key*.

An item is one row a source pages about (sources.py): a dead letter pending review, or one
episode of an execution left RECONCILIATION_REQUIRED. Items are grouped by their source's key —
the queue of a dead letter, the consumer of an execution — and each group becomes one incident,
unless a storm folds the smallest groups into one (``key`` None, ``folded`` says which).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class AlertGroup:
    """The items one incident will cover: one key's, or (``key`` None) a folded storm's."""

    kind: str
    key: str | None
    items: tuple[int, ...]  # the items' ids, ascending
    first_at: datetime  # when the oldest item became due (written, or became uncertain)
    last_at: datetime  # when the newest did
    errors: tuple[tuple[str, int], ...] = ()  # the most frequent reasons, with counts
    samples: tuple[tuple[str, str | None], ...] = ()  # (job_id, correlation_id) of the first items
    folded: tuple[tuple[str, int], ...] = ()  # a folded storm: each key and its count
    # Executions only: when each entered RECONCILIATION_REQUIRED (its episode), in the items' order.
    episodes: tuple[datetime, ...] = ()

    def alert_key(self, installation: str) -> str:
        """Deterministic within one installation: the same kind and items (and, for executions,
        episodes) always give the same key; another installation (another database, or this one
        after ``downgrade base``) gives another key for the same ids."""
        ids = ",".join(map(str, self.items))
        covered = f"{installation}|{self.kind}|{ids}"
        if self.episodes:  # an execution uncertain again is another episode: another key
            covered += "|" + ",".join(moment.astimezone(UTC).isoformat() for moment in self.episodes)
        digest = hashlib.sha256(covered.encode()).hexdigest()[:16]
        return f"core-jobs:{installation}:{self.kind}:{self.items[0]}-{self.items[-1]}:{len(self.items)}:{digest}"


@dataclass(frozen=True)
class PlannedIncident:
    """An incident composed from a group, before its intent is recorded."""

    kind: str
    key: str | None
    alert_key: str
    name: str
    summary: str
    description: str
    items: tuple[int, ...]


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
