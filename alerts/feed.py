"""The alerts job: the feed's run (:class:`AlertFeed`), its result and SPEC. The manual is docs/alerts.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import psycopg
import structlog

from alerts.betterstack import BetterStackClient, BetterStackError, IncidentNotFound, betterstack_client
from alerts.identity import settle_identity
from alerts.incidents import PlannedIncident, plan_incidents
from alerts.settings import AlertsFields
from alerts.sources import DEAD_LETTERS, EXECUTIONS, SOURCES, cancel_intent, source_of
from alerts.sql import (
    MARK_OPEN,
    MARK_RESOLVED,
    PENDING_INTENTS,
    READ_INSTALLATION,
    RECORD_INTENT,
)
from harness.pg import advisory_lock
from maintenance.jobs.base import JobEnv, JobSpec, ResultMetric
from maintenance.runtime.logs import get_logger
from maintenance.runtime.progress import Progress, Report

__all__ = ["SPEC", "AlertFeed", "AlertFeedResult"]

LOCK_NAME = "core_jobs.alerts"
METADATA_KEY = "core_jobs_alert_key"
INSTALLATION_METADATA_KEY = "core_jobs_installation"
# How a resolved alert ended (core.dead_letter_alerts.resolution).
RESOLVED, ALREADY_RESOLVED, GONE = "resolved", "already_resolved", "gone"
# Why an intent was cancelled (core.dead_letter_alerts.cancel_reason).
CANCELLED_HANDLED, CANCELLED_SUPERSEDED = "handled", "superseded"
# A 4xx with one of these says nothing about one incident: the token or the account is wrong.
_STOP_STATUSES = frozenset({401, 403})


@dataclass
class AlertFeedResult:
    """One run's outcome; ``fields()`` are the stop event's fixed numeric keys, named in EVENT_FIELDS."""

    EVENT_FIELDS: ClassVar[tuple[str, ...]] = (
        "incidents_posted",
        "escalations_posted",
        "incidents_recovered",
        "incidents_resolved",
        "incidents_gone",
        "intents_cancelled",
        "dead_letters_alerted",
        "dead_letters_unalerted",
        "dead_letters_unescalated",
        "executions_alerted",
        "executions_unalerted",
        "executions_unescalated",
        "post_failures",
        "resolve_failures",
        "skipped",
        "dry_run",
        "dry_run_incidents",
    )

    incidents_posted: int = 0
    escalations_posted: int = 0
    incidents_recovered: int = 0
    incidents_resolved: int = 0
    incidents_gone: int = 0
    intents_cancelled: int = 0
    dead_letters_alerted: int = 0
    dead_letters_unalerted: int = 0
    dead_letters_unescalated: int = 0
    executions_alerted: int = 0
    executions_unalerted: int = 0
    executions_unescalated: int = 0
    post_failures: int = 0
    resolve_failures: int = 0
    skipped: int = 0
    dry_run: int = 0
    dry_run_incidents: int = 0
    # What a dry run would post (not an event field: each is its own alerts.feed.dry_run_incident event).
    planned: list[PlannedIncident] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.post_failures == 0 and self.resolve_failures == 0

    def fields(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.EVENT_FIELDS}

    @classmethod
    def zero_fields(cls) -> dict[str, int]:
        return cls().fields()


@dataclass(frozen=True)
class _Intent:
    """An alert recorded ``pending`` (PENDING_INTENTS' columns, in order)."""

    id: int
    alert_key: str
    kind: str
    key: str | None
    name: str
    summary: str
    description: str
    num_items: int


class _Stop(Exception):
    """Better Stack is unreachable or refuses us: leave the rest of the work to the next run."""


class AlertFeed:
    """The alert feed: a database and, unless dry, a Better Stack client."""

    def __init__(
        self,
        settings: AlertsFields,
        connect: Callable[[], psycopg.Connection],
        client: BetterStackClient | None,
        *,
        log: Any = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.connect = connect
        self.client = client
        self.log = log or structlog.get_logger(job="alerts")
        self.monotonic = monotonic  # progress's clock (alerts.feed.progress)

    @property
    def dry_run(self) -> bool:
        return self.client is None

    def run_once(self, now: datetime) -> AlertFeedResult:
        with closing(self.connect()) as conn:
            conn.autocommit = True
            with advisory_lock(conn, LOCK_NAME) as acquired:
                if not acquired:
                    self.log.info("alerts.feed.skipped", reason="another run holds the lock", lock=LOCK_NAME)
                    return AlertFeedResult(skipped=1, dry_run=int(self.dry_run))
                try:
                    return self._run_locked(conn, now)
                finally:
                    if self.client is not None:
                        self.client.close()

    # --- the run ------------------------------------------------------------------------------
    def _run_locked(self, conn: psycopg.Connection, now: datetime) -> AlertFeedResult:
        result = AlertFeedResult(dry_run=int(self.dry_run))
        installation = settle_identity(conn, now, self.log, self.settings.alerts_environment)  # a copy refuses here
        stale_cutoff = now - self.settings.dead_letter_stale_after
        if self.dry_run:
            self._dry_run(conn, plan_incidents(conn, now, self.settings, installation), result)
        else:
            # Earlier intents first: the items a cancelled one releases are planned again below.
            unsettled: set[int] | None
            try:
                unsettled = self._settle_earlier(conn, now, installation, stale_cutoff, result)
            except _Stop:
                unsettled = None  # Better Stack is unreachable: record this run's intents, send nothing more
            for incident in plan_incidents(conn, now, self.settings, installation):
                self._record_intent(conn, incident, now)
            if unsettled is not None:
                try:
                    self._deliver(conn, now, installation, unsettled, result)
                    self._resolve_handled(conn, now, installation, result)
                except _Stop:
                    pass
            result.post_failures = len(_pending_intents(conn))
        counts = {
            source: conn.execute(source.count_unalerted, {"stale_cutoff": stale_cutoff}).fetchone()
            for source in SOURCES
        }
        result.dead_letters_unalerted, result.dead_letters_unescalated = counts[DEAD_LETTERS] or (0, 0)
        result.executions_unalerted, result.executions_unescalated = counts[EXECUTIONS] or (0, 0)
        return result

    def _dry_run(self, conn: psycopg.Connection, planned: list[PlannedIncident], result: AlertFeedResult) -> None:
        pending = _pending_intents(conn)
        for intent in pending:
            self.log.info(
                "alerts.feed.dry_run_incident",
                kind=intent.kind,
                queue=intent.key,
                name=intent.name,
                summary=intent.summary,
                num_dead_letters=intent.num_items,
                alert_key=intent.alert_key,
            )
        for incident in planned:
            self.log.info(
                "alerts.feed.dry_run_incident",
                kind=incident.kind,
                queue=incident.key,
                name=incident.name,
                summary=incident.summary,
                num_dead_letters=len(incident.items),
                alert_key=incident.alert_key,
            )
        for row in _resolved_open_alerts(conn):
            self.log.info(
                "alerts.feed.dry_run_resolve", incident_id=row[1], alert_key=row[2], kind=row[3], queue=row[4]
            )
        result.dry_run_incidents = len(pending) + len(planned)
        result.planned = planned

    def _record_intent(self, conn: psycopg.Connection, incident: PlannedIncident, now: datetime) -> None:
        """Intent and coverage in one transaction, before anything is sent."""
        ids = list(incident.items)
        with conn.transaction():
            row = conn.execute(
                RECORD_INTENT,
                {
                    "alert_key": incident.alert_key,
                    "kind": incident.kind,
                    "queue": incident.key,
                    "name": incident.name,
                    "summary": incident.summary,
                    "description": incident.description,
                    "num": len(ids),
                    "now": now,
                },
            ).fetchone()
            assert row is not None  # an upsert's RETURNING: always one row
            alert_id = row[0]
            source = source_of(incident.kind)
            conn.execute(source.record_coverage, {"kind": incident.kind, "alert_id": alert_id, "ids": ids})
            if incident.kind == source.stale_kind:
                conn.execute(source.record_new_coverage_of_escalation, {"alert_id": alert_id, "ids": ids})
        self.log.info(
            "alerts.feed.intent_recorded",
            alert_id=alert_id,
            alert_key=incident.alert_key,
            kind=incident.kind,
            queue=incident.key,
            num_dead_letters=len(ids),
        )

    def _settle_earlier(
        self,
        conn: psycopg.Connection,
        now: datetime,
        installation: str,
        stale_cutoff: datetime,
        result: AlertFeedResult,
    ) -> set[int]:
        """Settle the intents earlier runs left pending, before this run plans anything.

        Each may have reached Better Stack (a crash, a lost answer), so it is looked up by its
        key first: found → open (recovered). Absent and moot → cancelled, never posted: all its
        items were handled meanwhile (``handled``), or it is a first-page intent one of whose
        pending items is stale now (``superseded``: the escalation planned next pages them, and
        its still fresh ones go into a new incident). Returns the ids whose lookup
        failed: they are not posted this run.
        """
        assert self.client is not None
        scope = {INSTALLATION_METADATA_KEY: installation}
        unsettled: set[int] = set()
        for intent in _pending_intents(conn):
            try:
                incident = self.client.find_incident(METADATA_KEY, intent.alert_key, scope=scope)
            except BetterStackError as exc:
                self.log.error(
                    "alerts.feed.post_failed",
                    alert_key=intent.alert_key,
                    kind=intent.kind,
                    queue=intent.key,
                    status=exc.status,
                    error=str(exc),
                )
                unsettled.add(intent.id)
                _stop_unless_about_this_one(exc)
                continue
            if incident is not None:
                self._confirmed(conn, intent, incident.id, now, recovered=True, result=result)
                continue
            source = source_of(intent.kind)
            standing = conn.execute(
                source.intent_standing, {"id": intent.id, "kind": intent.kind, "stale_cutoff": stale_cutoff}
            ).fetchone()
            assert standing is not None  # counts: always one row
            pending, stale = standing
            if pending == 0:
                self._cancel(conn, intent, CANCELLED_HANDLED, now, result)
            elif intent.kind == source.new_kind and stale > 0:
                self._cancel(conn, intent, CANCELLED_SUPERSEDED, now, result)
        return unsettled

    def _cancel(
        self, conn: psycopg.Connection, intent: _Intent, reason: str, now: datetime, result: AlertFeedResult
    ) -> None:
        """Cancel an intent that never reached Better Stack, releasing its items still pending."""
        released = cancel_intent(conn, intent.id, intent.kind, reason, now)
        result.intents_cancelled += 1
        self.log.info(
            "alerts.feed.intent_cancelled",
            alert_id=intent.id,
            alert_key=intent.alert_key,
            kind=intent.kind,
            queue=intent.key,
            reason=reason,
            num_dead_letters=intent.num_items,
            released=len(released),
        )

    def _deliver(
        self, conn: psycopg.Connection, now: datetime, installation: str, unsettled: set[int], result: AlertFeedResult
    ) -> None:
        """Post every pending intent (the earlier ones were looked up already), except ``unsettled``."""
        assert self.client is not None
        scope = {INSTALLATION_METADATA_KEY: installation}
        due = [intent for intent in _pending_intents(conn) if intent.id not in unsettled]
        progress = self._progress(len(due))
        for done, intent in enumerate(due):
            if done:
                self._log_progress("post", progress.due(done))
            try:
                incident = self.client.create_incident(
                    self.incident_fields(intent), key_name=METADATA_KEY, key_value=intent.alert_key, scope=scope
                )
            except BetterStackError as exc:
                self.log.error(
                    "alerts.feed.post_failed",
                    alert_key=intent.alert_key,
                    kind=intent.kind,
                    queue=intent.key,
                    status=exc.status,
                    error=str(exc),
                )
                _stop_unless_about_this_one(exc)
                continue
            # recovered: found by the client's lookup after a retried POST, not confirmed by it.
            self._confirmed(conn, intent, incident.id, now, recovered=incident.recovered, result=result)

    def _confirmed(
        self,
        conn: psycopg.Connection,
        intent: _Intent,
        incident_id: str,
        now: datetime,
        *,
        recovered: bool,
        result: AlertFeedResult,
    ) -> None:
        """Better Stack has the incident: record it open, count and log how we know."""
        record_posted(conn, intent.id, incident_id, now)
        source = source_of(intent.kind)
        if source is EXECUTIONS:
            result.executions_alerted += intent.num_items
        else:
            result.dead_letters_alerted += intent.num_items
        fields_ = {
            "alert_key": intent.alert_key,
            "incident_id": incident_id,
            "kind": intent.kind,
            "queue": intent.key,
            "num_dead_letters": intent.num_items,
            "name": intent.name,
        }
        if recovered:
            result.incidents_recovered += 1
            self.log.info("alerts.feed.incident_recovered", **fields_)
        elif intent.kind == source.stale_kind:
            result.escalations_posted += 1
            self.log.info("alerts.feed.escalation_posted", **fields_)
        else:
            result.incidents_posted += 1
            self.log.info("alerts.feed.incident_posted", **fields_)

    def _resolve_handled(
        self, conn: psycopg.Connection, now: datetime, installation: str, result: AlertFeedResult
    ) -> None:
        assert self.client is not None
        due = _resolved_open_alerts(conn)
        progress = self._progress(len(due))
        for position, (alert_id, incident_id, alert_key, kind, key) in enumerate(due):
            if position:
                self._log_progress("resolve", progress.due(position))
            try:
                outcome = self._resolve(incident_id, alert_key, installation)
            except BetterStackError as exc:
                self.log.error(
                    "alerts.feed.resolve_failed",
                    incident_id=incident_id,
                    alert_key=alert_key,
                    status=exc.status,
                    error=str(exc),
                )
                result.resolve_failures += 1
                try:
                    _stop_unless_about_this_one(exc)
                except _Stop:
                    result.resolve_failures += len(due) - position - 1
                    raise
                continue
            conn.execute(
                MARK_RESOLVED, {"id": alert_id, "now": now, "resolution": GONE if outcome == GONE else RESOLVED}
            )
            if outcome == GONE:
                result.incidents_gone += 1
                self.log.warning(
                    "alerts.feed.incident_gone", incident_id=incident_id, alert_key=alert_key, kind=kind, queue=key
                )
            else:
                result.incidents_resolved += 1
                self.log.info(
                    "alerts.feed.incident_resolved",
                    incident_id=incident_id,
                    alert_key=alert_key,
                    kind=kind,
                    queue=key,
                    already_resolved=outcome == ALREADY_RESOLVED,
                )

    def _progress(self, total: int) -> Progress:
        """Progress of posting or resolving ``total`` incidents, each a rate-limited, retried request."""
        return Progress(
            total=total, interval_s=self.settings.alerts_progress_interval.total_seconds(), monotonic=self.monotonic
        )

    def _log_progress(self, step: str, report: Report | None) -> None:
        if report is not None:
            self.log.info(
                "alerts.feed.progress",
                step=step,
                items_done=report.items_done,
                items_total=report.items_total,
                elapsed_s=report.elapsed_s,
                rate=report.rate,
                estimate_left_s=report.estimate_left_s,
            )

    def _resolve(self, incident_id: str, alert_key: str, installation: str) -> str:
        """Resolve one incident at Better Stack: RESOLVED, ALREADY_RESOLVED (409) or GONE.

        A 404 means the incident was deleted there — once the incident list confirms it: that
        list must answer (a wrong API URL answers 404 to everything) and no longer have the
        incident. Otherwise a BetterStackError, and the alert stays open.
        """
        assert self.client is not None
        try:
            resolved_now = self.client.resolve_incident(
                incident_id, resolved_by=self.settings.betterstack_requester_email or "core-jobs"
            )
        except IncidentNotFound as exc:
            listed = self.client.find_incident(METADATA_KEY, alert_key, scope={INSTALLATION_METADATA_KEY: installation})
            if listed is not None and listed.id == incident_id:
                raise BetterStackError(
                    f"resolve of incident {incident_id} answered 404, yet the incident list still has it: {exc}",
                    status=404,
                ) from exc
            return GONE
        return RESOLVED if resolved_now else ALREADY_RESOLVED

    def incident_fields(self, intent: _Intent) -> dict[str, Any]:
        """The POST body of an intent (the client adds the key to ``metadata`` and ``team_name``)."""
        settings = self.settings
        source = source_of(intent.kind)
        escalation = intent.kind == source.stale_kind
        policy = settings.betterstack_policy_id
        if escalation:
            policy = settings.betterstack_escalation_policy_id or policy
        body: dict[str, Any] = {
            "name": intent.name,
            "summary": intent.summary,
            "description": intent.description,
            **settings.channels("escalation" if escalation else "incident"),
            "metadata": {
                "core_jobs_kind": [source.metadata_stale if escalation else source.metadata_new],
                source.key_name: [intent.key or "(several)"],
                source.count_name: [str(intent.num_items)],
            },
        }
        if settings.betterstack_requester_email:
            body["requester_email"] = settings.betterstack_requester_email
        if policy:
            body["policy_id"] = policy
        return body


def read_installation(conn: psycopg.Connection) -> str:
    """This installation's id, which scopes every alert key and lookup (read once per run)."""
    row = conn.execute(READ_INSTALLATION).fetchone()
    if row is None:
        raise RuntimeError("core.installation has no row: the alert feed has no identity; run `core-jobs migrate`")
    return row[0]


def record_posted(conn: psycopg.Connection, alert_id: int, incident_id: str, now: datetime) -> None:
    """Better Stack confirmed the incident: the intent becomes an open alert with its id."""
    conn.execute(MARK_OPEN, {"id": alert_id, "incident_id": incident_id, "now": now})


def _stop_unless_about_this_one(exc: BetterStackError) -> None:
    if exc.status is None or exc.status in _STOP_STATUSES or exc.status == 429 or exc.status >= 500:
        raise _Stop from exc


def _pending_intents(conn: psycopg.Connection) -> list[_Intent]:
    return [_Intent(*row) for row in conn.execute(PENDING_INTENTS).fetchall()]


def _resolved_open_alerts(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Open incidents due for auto-resolve, of every source, in id order."""
    rows = [row for source in SOURCES for row in conn.execute(source.resolved_open_alerts).fetchall()]
    return sorted(rows, key=lambda row: row[0])


def build(settings: AlertsFields, env: JobEnv) -> AlertFeed:  # one pass: no batch loop to stop
    return AlertFeed(
        settings,
        connect=lambda: env.db.connect(autocommit=True),
        client=betterstack_client(settings, retry_after_max=env.retry_after_max),
        log=get_logger(job="alerts"),
        monotonic=env.monotonic,
    )


SPEC = JobSpec[AlertsFields](
    name="alerts",
    summary="Better Stack incidents for new dead letters and RECONCILIATION_REQUIRED executions, escalations, auto-resolve",
    settings=AlertsFields,
    build=build,
    zero_fields=AlertFeedResult.zero_fields,
    event_prefix="alerts.feed",
    result_metrics=(
        ResultMetric(
            "core_jobs_alerts_incidents_opened",
            "incidents_posted",
            "Better Stack incidents the last alerts run opened.",
        ),
        ResultMetric(
            "core_jobs_alerts_incidents_resolved",
            "incidents_resolved",
            "Better Stack incidents the last alerts run resolved.",
        ),
        ResultMetric(
            "core_jobs_alerts_escalations",
            "escalations_posted",
            "Escalations the last alerts run posted to Better Stack.",
        ),
        # A feed without a token pages nobody: CoreJobsAlertFeedDryRun fires on this (docs/alerts.md).
        ResultMetric(
            "core_jobs_alerts_dry_run",
            "dry_run",
            "1 when the last alerts run was a dry run (no CORE_JOBS_BETTERSTACK_API_TOKEN): nothing reached Better Stack.",
        ),
    ),
)
