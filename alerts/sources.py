"""What the alert feed pages about: dead letters pending review, and RECONCILIATION_REQUIRED executions.

Both go through the same machinery (alerts/feed.py: intents, keys with the installation id,
lookup before posting, cancel and release, escalation, auto-resolve); an :class:`AlertSource`
is what differs — its alert kinds, its named SQL, and the words of its incidents' metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from alerts import execution_sql as ex
from alerts import sql as dl


@dataclass(frozen=True)
class AlertSource:
    """One kind of row the feed pages about; every statement takes the same parameters as the dead letters'."""

    name: str
    new_kind: str
    stale_kind: str
    scan_new: str
    scan_stale: str
    top_errors: str
    samples: str
    count_unalerted: str
    record_coverage: str
    record_new_coverage_of_escalation: str
    intent_standing: str
    release_coverage: str
    cover_released_by_escalation: str
    resolved_open_alerts: str
    # The incident's metadata: core_jobs_kind of a first page and of an escalation, and the keys
    # of the group and of the count.
    metadata_new: str
    metadata_stale: str
    group_key: str
    count_key: str

    @property
    def kinds(self) -> tuple[str, str]:
        return (self.new_kind, self.stale_kind)


DEAD_LETTERS = AlertSource(
    name="dead_letters",
    new_kind="new",
    stale_kind="stale",
    scan_new=dl.SCAN_NEW,
    scan_stale=dl.SCAN_STALE,
    top_errors=dl.TOP_ERRORS,
    samples=dl.SAMPLES,
    count_unalerted=dl.COUNT_UNALERTED,
    record_coverage=dl.RECORD_COVERAGE,
    record_new_coverage_of_escalation=dl.RECORD_NEW_COVERAGE_OF_ESCALATION,
    intent_standing=dl.INTENT_STANDING,
    release_coverage=dl.RELEASE_COVERAGE,
    cover_released_by_escalation=dl.COVER_RELEASED_BY_ESCALATION,
    resolved_open_alerts=dl.HANDLED_OPEN_ALERTS,
    metadata_new="new_dead_letters",
    metadata_stale="escalation",
    group_key="queue",
    count_key="dead_letters",
)

EXECUTIONS = AlertSource(
    name="executions",
    new_kind="reconciliation",
    stale_kind="reconciliation_stale",
    scan_new=ex.SCAN_NEW_EXECUTIONS,
    scan_stale=ex.SCAN_STALE_EXECUTIONS,
    top_errors=ex.TOP_EXECUTION_REASONS,
    samples=ex.EXECUTION_SAMPLES,
    count_unalerted=ex.COUNT_UNALERTED_EXECUTIONS,
    record_coverage=ex.RECORD_EXECUTION_COVERAGE,
    record_new_coverage_of_escalation=ex.RECORD_NEW_EXECUTION_COVERAGE_OF_ESCALATION,
    intent_standing=ex.EXECUTION_INTENT_STANDING,
    release_coverage=ex.RELEASE_EXECUTION_COVERAGE,
    cover_released_by_escalation=ex.COVER_RELEASED_EXECUTIONS_BY_ESCALATION,
    resolved_open_alerts=ex.RESOLVED_OPEN_EXECUTION_ALERTS,
    metadata_new="reconciliation_required",
    metadata_stale="reconciliation_escalation",
    group_key="consumer",
    count_key="executions",
)

SOURCES = (DEAD_LETTERS, EXECUTIONS)


def source_of(kind: str) -> AlertSource:
    """The source of an alert kind (core.dead_letter_alerts.kind)."""
    for source in SOURCES:
        if kind in source.kinds:
            return source
    raise ValueError(f"unknown alert kind {kind!r}")


def cancel_intent(conn: psycopg.Connection, alert_id: int, kind: str, reason: str, now: datetime) -> list[int]:
    """Cancel an intent that never reached Better Stack (or, ``inherited``, was its origin's), in one
    transaction: its rows still pending are released for the next scan, those an escalation already
    covers are covered by it as new. Returns the released ids (dead letters or executions)."""
    source = source_of(kind)
    with conn.transaction():
        conn.execute(dl.CANCEL_INTENT, {"id": alert_id, "reason": reason, "now": now})
        released = [row[0] for row in conn.execute(source.release_coverage, {"id": alert_id})]
        conn.execute(source.cover_released_by_escalation, {"ids": released})
    return released
