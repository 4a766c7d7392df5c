"""What the alert feed pages about: its two sources of *items*, each grouped by a *key*.

=============  ==========================================  =========  =============================
source         an item                                     its key    alert kinds (new, escalation)
=============  ==========================================  =========  =============================
dead letters   a dead letter ``pending_review``            queue      ``new``, ``stale``
executions     one episode of an execution left            consumer   ``reconciliation``,
               RECONCILIATION_REQUIRED (sql.py)                       ``reconciliation_stale``
=============  ==========================================  =========  =============================

Both go through the same machinery (feed.py: intents, keys with the installation id, lookup
before posting, cancel and release, escalation, auto-resolve); an :class:`AlertSource` is what
differs — its alert kinds, its named SQL, and the words of its incidents' metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from alerts import sql


@dataclass(frozen=True)
class AlertSource:
    """One kind of item the feed pages about; its statements take the same parameters as the other source's."""

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
    # The incident's metadata: core_jobs_kind of a first page and of an escalation, and the names
    # under which it carries the group's key and its number of items.
    metadata_new: str
    metadata_stale: str
    key_name: str
    count_name: str

    @property
    def kinds(self) -> tuple[str, str]:
        return (self.new_kind, self.stale_kind)


DEAD_LETTERS = AlertSource(
    name="dead_letters",
    new_kind="new",
    stale_kind="stale",
    scan_new=sql.SCAN_NEW,
    scan_stale=sql.SCAN_STALE,
    top_errors=sql.TOP_ERRORS,
    samples=sql.SAMPLES,
    count_unalerted=sql.COUNT_UNALERTED,
    record_coverage=sql.RECORD_COVERAGE,
    record_new_coverage_of_escalation=sql.RECORD_NEW_COVERAGE_OF_ESCALATION,
    intent_standing=sql.INTENT_STANDING,
    release_coverage=sql.RELEASE_COVERAGE,
    cover_released_by_escalation=sql.COVER_RELEASED_BY_ESCALATION,
    resolved_open_alerts=sql.HANDLED_OPEN_ALERTS,
    metadata_new="new_dead_letters",
    metadata_stale="escalation",
    key_name="queue",
    count_name="dead_letters",
)

EXECUTIONS = AlertSource(
    name="executions",
    new_kind="reconciliation",
    stale_kind="reconciliation_stale",
    scan_new=sql.SCAN_NEW_EXECUTIONS,
    scan_stale=sql.SCAN_STALE_EXECUTIONS,
    top_errors=sql.TOP_EXECUTION_REASONS,
    samples=sql.EXECUTION_SAMPLES,
    count_unalerted=sql.COUNT_UNALERTED_EXECUTIONS,
    record_coverage=sql.RECORD_EXECUTION_COVERAGE,
    record_new_coverage_of_escalation=sql.RECORD_NEW_EXECUTION_COVERAGE_OF_ESCALATION,
    intent_standing=sql.EXECUTION_INTENT_STANDING,
    release_coverage=sql.RELEASE_EXECUTION_COVERAGE,
    cover_released_by_escalation=sql.COVER_RELEASED_EXECUTIONS_BY_ESCALATION,
    resolved_open_alerts=sql.RESOLVED_OPEN_EXECUTION_ALERTS,
    metadata_new="reconciliation_required",
    metadata_stale="reconciliation_escalation",
    key_name="consumer",
    count_name="executions",
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
    transaction: its items still pending are released for the next scan, those an escalation already
    covers are covered by it as new. Returns the released items' ids."""
    source = source_of(kind)
    with conn.transaction():
        conn.execute(sql.CANCEL_INTENT, {"id": alert_id, "reason": reason, "now": now})
        released = [row[0] for row in conn.execute(source.release_coverage, {"id": alert_id})]
        conn.execute(source.cover_released_by_escalation, {"ids": released})
    return released
