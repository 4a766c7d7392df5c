"""The text of the alert feed's incidents about RECONCILIATION_REQUIRED executions (one consumer, or a folded storm).

What the on-call person reads: which consumer, how many executions, since when, why (the most
frequent reasons, with the action each concerns), samples, and what to do — check each write at
the provider and resolve the execution; the harness never resends an uncertain write by itself.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from alerts.groups import AlertGroup, PlannedIncident, human, reason_and_sample_lines, when

RESOLVE_HINT = (
    "Check each one at the provider, then resolve it: `core-jobs executions show ID` shows its checkpoints; "
    "POST /v1/core/executions/{id}/resolve with RESUME (the write did not happen, or its result is known) "
    "or CLOSE_WITHOUT_TRANSITION. The harness never resends an uncertain write by itself."
)


def compose_executions(
    group: AlertGroup, now: datetime, stale_after: timedelta, installation: str, *, escalation: bool
) -> PlannedIncident:
    """Name, one-line summary and description of one incident about uncertain executions."""
    n = len(group.ids)
    alert_key = group.alert_key(installation)
    executions = "execution" if n == 1 else "executions"
    where = group.queue if group.queue is not None else f"{len(group.queues)} consumers"
    of = f"of {where}" if group.queue is not None else f"in {where}"
    span = f"{when(group.first_created)} – {when(group.last_created)}"
    top = f" Most frequent reason: {group.errors[0][0]} ({group.errors[0][1]}×)." if group.errors else ""
    if not escalation:
        name = f"{n} {executions} {of} {'needs' if n == 1 else 'need'} reconciliation"
        summary = (
            f"{n} {executions} {of} RECONCILIATION_REQUIRED, uncertain since {span}: a write to a provider may "
            f"or may not have happened.{top}"
        )
        opening = (
            f"{n} {executions} {'of consumer ' + where if group.queue else 'in ' + where} went to "
            f"RECONCILIATION_REQUIRED, {span}: a write to a provider may or may not have happened."
        )
    else:
        age = human(stale_after)
        name = f"{n} {executions} {of} unresolved for over {age}"
        summary = (
            f"{n} {executions} {of} still RECONCILIATION_REQUIRED more than {age} later; the oldest since "
            f"{when(group.first_created)} ({human(now - group.first_created)} ago).{top}"
        )
        opening = (
            f"ESCALATION: {n} {executions} {'of consumer ' + where if group.queue else 'in ' + where} still "
            f"RECONCILIATION_REQUIRED more than {age} after {'it' if n == 1 else 'they'} became uncertain ({span})."
        )
    lines = [opening, "", *reason_and_sample_lines(group, "Most frequent reasons (action: reason):")]
    if group.queues:
        lines.append("Consumers:")
        lines += [f"  {count} of {consumer}" for consumer, count in group.queues]
        lines.append("")
    lines.append(RESOLVE_HINT)
    lines.append(f"Execution ids {group.ids[0]}–{group.ids[-1]} ({n}); alert key {alert_key}.")
    return PlannedIncident(group.kind, group.queue, alert_key, name, summary, "\n".join(lines), group.ids)
