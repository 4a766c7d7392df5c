"""What a run of the alert feed will page: the due items scanned, grouped by key, capped, and composed into incidents.

The text is what the on-call person reads: which key (queue or consumer), how many items, since
when, why (the most frequent reasons), samples, and what to do. For dead letters: review them,
replay once the cause is fixed or discard with a reason. For executions: check each write at the
provider and resolve the execution — the harness never resends an uncertain write by itself.

What one incident covers is an :class:`AlertGroup`: a group of *items* (dead letters or executions) under one *key*.
An item is one row a source pages about (sources.py): a dead letter pending review, or one episode of an execution
left RECONCILIATION_REQUIRED. Items are grouped by their source's key — the queue of a dead letter, the consumer of
an execution — and each group becomes one incident, unless a storm folds the smallest groups into one (``key`` None,
``folded`` says which).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from alerts.settings import AlertsFields
from alerts.sources import DEAD_LETTERS, EXECUTIONS, SOURCES, AlertSource, source_of

_ERROR_CHARS = 200  # of each reason's first line
TOP_ERRORS = 3  # the most frequent reasons an incident lists
SAMPLES = 3  # the items an incident names

RESOLVE_HINT = (
    "Check each one at the provider, then resolve it: `core-jobs executions show ID` shows its checkpoints; "
    "POST /v1/core/executions/{id}/resolve with RESUME (the write did not happen, or its result is known) "
    "or CLOSE_WITHOUT_TRANSITION. The harness never resends an uncertain write by itself."
)


# --- the groups and the incidents they become --------------------------------------------------
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


# --- planning: scan, group, cap, compose --------------------------------------------------------
def plan_incidents(
    conn: psycopg.Connection, now: datetime, settings: AlertsFields, installation: str
) -> list[PlannedIncident]:
    """The incidents this run would post, composed (name, summary, description), keyed for ``installation``."""
    return [compose_incident(group, now, settings, installation) for group in scan(conn, now, settings)]


def scan(conn: psycopg.Connection, now: datetime, settings: AlertsFields) -> list[AlertGroup]:
    """Every group due for an incident — dead letters new, then stale; then executions new, then
    stale — capped per kind and with details."""
    cutoff = now - settings.dead_letter_stale_after
    groups: list[AlertGroup] = []
    for source in SOURCES:
        found_here: list[AlertGroup] = []
        for kind, query in ((source.new_kind, source.scan_new), (source.stale_kind, source.scan_stale)):
            rows = conn.execute(query, {"stale_cutoff": cutoff}).fetchall()
            found = [AlertGroup(kind, row[0], tuple(row[1]), row[2], row[3], episodes=_episodes(row)) for row in rows]
            found_here += _cap(found, settings.alerts_max_incidents_per_run)
        groups += _with_details(conn, source, found_here)
    return groups


def _episodes(row: tuple[Any, ...]) -> tuple[datetime, ...]:
    """An execution scan's fifth column: when each entered RECONCILIATION_REQUIRED; none for dead letters."""
    return tuple(row[4]) if len(row) > 4 else ()


def _cap(groups: list[AlertGroup], limit: int) -> list[AlertGroup]:
    """At most ``limit`` groups: the largest keep their own incident, the rest fold into one."""
    groups = sorted(groups, key=lambda g: (-len(g.items), g.key or ""))
    if len(groups) <= limit:
        return groups
    keep, fold = groups[: limit - 1], groups[limit - 1 :]
    # Executions carry their episodes: kept beside their ids, in the ids' order.
    rows = sorted((i, g.episodes[n] if g.episodes else None) for g in fold for n, i in enumerate(g.items))
    folded = AlertGroup(
        kind=fold[0].kind,
        key=None,
        items=tuple(i for i, _ in rows),
        first_at=min(g.first_at for g in fold),
        last_at=max(g.last_at for g in fold),
        folded=tuple((g.key or "", len(g.items)) for g in fold),
        episodes=tuple(e for _, e in rows if e is not None),
    )
    return [*keep, folded]


def _with_details(conn: psycopg.Connection, source: AlertSource, groups: list[AlertGroup]) -> list[AlertGroup]:
    """Add the top errors and the samples of each group.

    Samples: one query for all groups. Top errors: one query per group, by primary key; a
    single grouped query over all groups measured 3.5x slower (bench/alerts_scan.py).
    """
    if not groups:
        return []
    detailed = []
    sample_ids = [i for g in groups for i in g.items[:SAMPLES]]
    samples = {row[0]: (row[1], row[2]) for row in conn.execute(source.samples, {"ids": sample_ids})}
    for group in groups:
        params = {"ids": list(group.items), "chars": _ERROR_CHARS, "top": TOP_ERRORS}
        errors = [(error, n) for error, n in conn.execute(source.top_errors, params)]
        detailed.append(
            AlertGroup(
                group.kind,
                group.key,
                group.items,
                group.first_at,
                group.last_at,
                errors=tuple(errors),
                samples=tuple(samples[i] for i in group.items[:SAMPLES]),
                folded=group.folded,
                episodes=group.episodes,
            )
        )
    return detailed


# --- the text -----------------------------------------------------------------------------------
def compose_incident(group: AlertGroup, now: datetime, settings: AlertsFields, installation: str) -> PlannedIncident:
    """The incident of a group, in its source's words."""
    source = source_of(group.kind)
    escalation = group.kind == source.stale_kind
    if source is EXECUTIONS:
        return compose_executions(group, now, settings.dead_letter_stale_after, installation, escalation=escalation)
    assert source is DEAD_LETTERS
    return compose_dead_letters(group, now, settings, installation, escalation=escalation)


def compose_dead_letters(
    group: AlertGroup, now: datetime, settings: AlertsFields, installation: str, *, escalation: bool
) -> PlannedIncident:
    """Name, one-line summary and description of one incident about dead letters pending review."""
    n = len(group.items)
    alert_key = group.alert_key(installation)
    letters = "dead letter" if n == 1 else "dead letters"
    where = group.key if group.key is not None else f"{len(group.folded)} queues"
    span = f"{when(group.first_at)} – {when(group.last_at)}"
    top = f" Most frequent error: {group.errors[0][0]} ({group.errors[0][1]}×)." if group.errors else ""
    if not escalation:
        name = f"{n} new {letters} in {where}"
        summary = f"{n} {letters} in {where} waiting for review, written {span}.{top}"
        opening = f"{n} new {letters} in {'queue ' + where if group.key else where}, pending review, written {span}."
        action = "Review them: replay once the cause is fixed, or discard with a reason."
    else:
        age = human(settings.dead_letter_stale_after)
        name = f"{n} {letters} in {where} unreviewed for over {age}"
        summary = (
            f"{n} {letters} in {where} still pending review more than {age} after they were written; the oldest: "
            f"{when(group.first_at)} ({human(now - group.first_at)} ago).{top}"
        )
        opening = (
            f"ESCALATION: {n} {letters} in {'queue ' + where if group.key else where} still pending review "
            f"more than {age} after they were written ({span})."
        )
        action = "Nobody has reviewed these yet: replay or discard each, with a reason."
    lines = [opening, "", *reason_and_sample_lines(group, "Most frequent errors:")]
    if group.folded:
        lines.append("Queues:")
        for queue, count in group.folded:
            link = settings.ops_url(queue)
            lines.append(f"  {count} in {queue}" + (f": {link}" if link else ""))
        lines.append("")
    elif group.key is not None and (link := settings.ops_url(group.key)):
        lines += [f"Dead letters of this queue: {link}", ""]
    lines.append(action)
    lines.append(f"Dead letter ids {group.items[0]}–{group.items[-1]} ({n}); alert key {alert_key}.")
    return PlannedIncident(group.kind, group.key, alert_key, name, summary, "\n".join(lines), group.items)


def compose_executions(
    group: AlertGroup, now: datetime, stale_after: timedelta, installation: str, *, escalation: bool
) -> PlannedIncident:
    """Name, one-line summary and description of one incident about uncertain executions."""
    n = len(group.items)
    alert_key = group.alert_key(installation)
    executions = "execution" if n == 1 else "executions"
    where = group.key if group.key is not None else f"{len(group.folded)} consumers"
    of = f"of {where}" if group.key is not None else f"in {where}"
    span = f"{when(group.first_at)} – {when(group.last_at)}"
    top = f" Most frequent reason: {group.errors[0][0]} ({group.errors[0][1]}×)." if group.errors else ""
    if not escalation:
        name = f"{n} {executions} {of} {'needs' if n == 1 else 'need'} reconciliation"
        summary = (
            f"{n} {executions} {of} RECONCILIATION_REQUIRED, uncertain since {span}: a write to a provider may "
            f"or may not have happened.{top}"
        )
        opening = (
            f"{n} {executions} {'of consumer ' + where if group.key else 'in ' + where} went to "
            f"RECONCILIATION_REQUIRED, {span}: a write to a provider may or may not have happened."
        )
    else:
        age = human(stale_after)
        name = f"{n} {executions} {of} unresolved for over {age}"
        summary = (
            f"{n} {executions} {of} still RECONCILIATION_REQUIRED more than {age} later; the oldest since "
            f"{when(group.first_at)} ({human(now - group.first_at)} ago).{top}"
        )
        opening = (
            f"ESCALATION: {n} {executions} {'of consumer ' + where if group.key else 'in ' + where} still "
            f"RECONCILIATION_REQUIRED more than {age} after {'it' if n == 1 else 'they'} became uncertain ({span})."
        )
    lines = [opening, "", *reason_and_sample_lines(group, "Most frequent reasons (action: reason):")]
    if group.folded:
        lines.append("Consumers:")
        lines += [f"  {count} of {consumer}" for consumer, count in group.folded]
        lines.append("")
    lines.append(RESOLVE_HINT)
    lines.append(f"Execution ids {group.items[0]}–{group.items[-1]} ({n}); alert key {alert_key}.")
    return PlannedIncident(group.kind, group.key, alert_key, name, summary, "\n".join(lines), group.items)
