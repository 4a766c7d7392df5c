"""The alert feed: Better Stack incidents for new dead letters, escalations for stale
ones, and auto-resolve once they are handled — each exactly once, across crashes and overlapping runs.

The same machinery pages durable executions left RECONCILIATION_REQUIRED (issue 12): one
incident per consumer per run for new ones, an escalation for ones left unresolved past
``stale_after``, auto-resolve once the executions it covers were resolved. What differs — kinds,
SQL, words — is an :class:`~alerts.sources.AlertSource` (alerts/sources.py); below, read
"dead letter" as "execution", "queue" as "consumer" and "pending review" as
"RECONCILIATION_REQUIRED in the episode paged" (alerts/execution_sql.py) for them.

What one run does (``run_once(now)``; ``now`` is PostgreSQL's clock, read once by the caller)
--------------------------------------------------------------------------------------------
1. Takes the advisory lock ``core_jobs.alerts``. If another runner holds it, the run is
   skipped (``alerts.feed.skipped``, ``skipped=1``): one runner at a time.
2. **Earlier intents first** (see 6): each intent an earlier run left ``pending`` is looked up
   at Better Stack; found → ``open``; absent and moot → **cancelled**, never posted:
   ``handled`` when all its dead letters were handled meanwhile (no page about nothing), or
   ``superseded`` when it is a ``new`` intent one of whose pending dead letters is stale now.
   A cancelled intent releases its dead letters still pending, and the scan below plans them
   again: the stale ones into the escalation, the fresh ones into a new incident — each dead
   letter is paged once, and none is left out. The database knows the state (``pending →
   open → resolved``, ``pending → cancelled``) and allows deleting only a cancelled alert's
   coverage.
3. **New dead letters** (``pending_review``, younger than ``stale_after``, not yet covered by an
   alert) → one incident **per queue**, e.g. ``12 new dead letters in points.credit``, with the
   time range, the most frequent ``last_error`` values with counts, sample ``job_id`` /
   ``correlation_id`` and a link from ``ops_url_template``; routed with ``policy_id``.
4. **Stale dead letters** (still ``pending_review`` at ``now − stale_after``, not yet escalated)
   → one escalation incident per queue, routed with ``escalation_policy_id``. A dead letter that
   was never alerted because it was already stale when first seen is covered by the escalation
   alone (one page, not two).
5. **Storms**: at most ``max_incidents_per_run`` incidents per kind; the smallest groups beyond
   that are folded into one summary incident (``312 new dead letters in 281 queues``).
   Nothing is dropped.
6. **Exactly once**: each incident is first recorded as an *intent* (``state='pending'``) with
   a deterministic ``alert_key`` (this installation's id + kind + the dead-letter ids it covers)
   and its coverage rows, in one transaction; then POSTed with the key and the installation id
   in its ``metadata`` (``core_jobs_alert_key``, ``core_jobs_installation``); only a ``201``
   with ``data.id`` moves it to ``open``. An intent left ``pending`` by an earlier run (crash
   between POST and record, or Better Stack down) is first looked up by that metadata (2):
   found → recorded, not posted again; absent → posted, unless cancelled. A lookup adopts an
   incident only when its metadata has both our key and our installation id, so databases
   sharing one Better Stack team never take each other's incidents. The dead-letter table is
   never written.

   **The installation** (``core.installation``, migration ``0006_alert_identity``) is one row
   with a random UUID made by the migration, read once per run; the database refuses to change
   it but by a rebind. ``downgrade base`` + ``migrate`` makes a new one, so incidents of the
   database's earlier life (same ids) are never adopted. It is bound to where the database lives
   (cluster system identifier, database oid; migration ``0015_installation_copies``): a copy
   (restored dump, ``CREATE DATABASE … TEMPLATE``) that has alerts refuses to run until an
   operator adopts or renews it; one that never alerted takes a new identity by itself
   (alerts/identity.py).
7. **Auto-resolve**: an ``open`` incident none of whose dead letters is still pending review is
   resolved at Better Stack (``409`` already resolved counts as done) and marked ``resolved``
   (``resolution='resolved'``). A ``404`` means someone deleted the incident there: once the
   incident list confirms it (it answers, without that incident — a wrong API URL answers 404
   to everything and stays a failure), the alert is marked ``resolved`` with
   ``resolution='gone'`` (``alerts.feed.incident_gone``) and the run moves on.
8. After the first failure that says Better Stack is unreachable (or refuses the token), the
   rest is left for the next run (this run's intents are still recorded); a ``4xx`` about one
   incident's content skips only that one.

Without a Better Stack client (no token) the run is **dry**: it logs each incident it would post
(``alerts.feed.dry_run_incident`` with ``name`` and ``summary``) and writes nothing, so that
configuring a token later still alerts everything.

Options (:class:`AlertFeedConfig`)
----------------------------------
- ``stale_after``           duration, default 3 days: a pending dead letter older than this escalates.
- ``max_incidents_per_run`` count ≥ 1, default 20: incidents per run and kind before folding.
- ``policy_id``             Better Stack escalation policy of new-dead-letter incidents; default none.
- ``escalation_policy_id``  policy of escalations; default none (then ``policy_id``).
- ``requester_email``       ``requester_email`` of incidents and ``resolved_by``; default none.
- ``ops_url_template``      link with ``{queue}``, e.g. ``https://ops.example/dead-letters?queue={queue}``.
- ``top_errors``            count, default 3: most frequent errors listed per incident.
- ``samples``               count, default 3: sample ``job_id`` / ``correlation_id`` per incident.

Result (fixed keys, all numbers; the runner logs them in ``alerts.feed.stop``)
------------------------------------------------------------------------------
``incidents_posted``, ``escalations_posted``, ``incidents_recovered`` (found by metadata instead
of confirmed by our POST: after a crash, or by the lookup after a retried POST),
``incidents_resolved``, ``incidents_gone`` (deleted at Better Stack, recorded ``gone``),
``intents_cancelled`` (``handled`` or ``superseded``, never posted), ``dead_letters_alerted``
(covered by incidents confirmed this run), ``dead_letters_unalerted`` (pending, not covered by a
confirmed incident), ``dead_letters_unescalated`` (stale, not covered by a confirmed
escalation), ``executions_alerted``, ``executions_unalerted``, ``executions_unescalated`` (the
same three for RECONCILIATION_REQUIRED executions), ``post_failures`` (intents still unconfirmed after the run), ``resolve_failures``,
``skipped``, ``dry_run``, ``dry_run_incidents``. ``ok`` is false when anything could not be
posted or resolved.

Events: ``alerts.identity.unconfirmed`` (error: the run refuses), ``alerts.identity.renewed``
(warning), ``alerts.feed.skipped``, ``alerts.feed.intent_recorded``, ``alerts.feed.intent_cancelled``
(``reason``, ``released``), ``alerts.feed.incident_posted``, ``alerts.feed.escalation_posted``,
``alerts.feed.incident_recovered``, ``alerts.feed.post_failed``, ``alerts.feed.incident_resolved``,
``alerts.feed.incident_gone`` (warning), ``alerts.feed.resolve_failed``,
``alerts.feed.dry_run_incident``, ``alerts.feed.dry_run_resolve``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import quote

import psycopg
import structlog

from alerts.betterstack import BetterStackClient, BetterStackError, IncidentNotFound
from alerts.groups import AlertGroup, DeadLetterGroup, PlannedIncident, human, reason_and_sample_lines, when
from alerts.identity import settle_identity
from alerts.reconciliation import compose_executions
from alerts.sources import DEAD_LETTERS, EXECUTIONS, SOURCES, AlertSource, cancel_intent, source_of
from alerts.sql import (
    MARK_OPEN,
    MARK_RESOLVED,
    PENDING_INTENTS,
    READ_INSTALLATION,
    RECORD_INTENT,
)
from harness.pg import advisory_lock

__all__ = ["AlertFeed", "AlertFeedConfig", "AlertFeedResult", "AlertGroup", "DeadLetterGroup", "PlannedIncident"]

LOCK_NAME = "core_jobs.alerts"
METADATA_KEY = "core_jobs_alert_key"
INSTALLATION_METADATA_KEY = "core_jobs_installation"
NEW, STALE = DEAD_LETTERS.kinds
# How a resolved alert ended (core.dead_letter_alerts.resolution).
RESOLVED, ALREADY_RESOLVED, GONE = "resolved", "already_resolved", "gone"
# Why an intent was cancelled (core.dead_letter_alerts.cancel_reason).
CANCELLED_HANDLED, CANCELLED_SUPERSEDED = "handled", "superseded"
# A 4xx with one of these says nothing about one incident: the token or the account is wrong.
_STOP_STATUSES = frozenset({401, 403})
_ERROR_CHARS = 200


@dataclass(frozen=True)
class AlertFeedConfig:
    """The feed's options; see the module docstring for each one's unit and default."""

    stale_after: timedelta = timedelta(days=3)
    max_incidents_per_run: int = 20
    policy_id: str | None = None
    escalation_policy_id: str | None = None
    requester_email: str | None = None
    ops_url_template: str | None = None
    top_errors: int = 3
    samples: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.stale_after, timedelta) or self.stale_after <= timedelta(0):
            raise ValueError(f"stale_after must be a positive duration, got {self.stale_after!r}")
        for name in ("max_incidents_per_run", "top_errors", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
        if self.ops_url_template is not None and "{queue}" not in self.ops_url_template:
            raise ValueError("ops_url_template must contain the placeholder {queue}")

    def ops_url(self, queue: str) -> str | None:
        return self.ops_url_template.format(queue=quote(queue, safe="")) if self.ops_url_template else None


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
    id: int
    alert_key: str
    kind: str
    queue: str | None
    name: str
    summary: str
    description: str
    num_dead_letters: int


class _Stop(Exception):
    """Better Stack is unreachable or refuses us: leave the rest of the work to the next run."""


class AlertFeed:
    """One dead-letter alert feed: a database and, unless dry, a Better Stack client."""

    def __init__(
        self,
        config: AlertFeedConfig,
        connect: Callable[[], psycopg.Connection],
        client: BetterStackClient | None,
        *,
        log: Any = None,
    ) -> None:
        self.config = config
        self.connect = connect
        self.client = client
        self.log = log or structlog.get_logger(job="alerts")

    @property
    def dry_run(self) -> bool:
        return self.client is None

    def run_once(self, now: datetime) -> AlertFeedResult:
        with closing(self.connect()) as conn:
            conn.autocommit = True
            with advisory_lock(conn, LOCK_NAME) as acquired:
                if not acquired:
                    self.log.info("alerts.feed.skipped", reason="another run holds the lock", lock=LOCK_NAME)
                    return AlertFeedResult(skipped=1)
                try:
                    return self._run_locked(conn, now)
                finally:
                    if self.client is not None:
                        self.client.close()

    # --- the run ------------------------------------------------------------------------------
    def _run_locked(self, conn: psycopg.Connection, now: datetime) -> AlertFeedResult:
        result = AlertFeedResult(dry_run=int(self.dry_run))
        installation = settle_identity(conn, now, self.log)  # a copy of another database refuses here
        stale_cutoff = now - self.config.stale_after
        if self.dry_run:
            self._dry_run(conn, plan_incidents(conn, now, self.config, installation), result)
        else:
            # Earlier intents first: the dead letters a cancelled one releases are planned again below.
            unsettled: set[int] | None
            try:
                unsettled = self._settle_earlier(conn, now, installation, stale_cutoff, result)
            except _Stop:
                unsettled = None  # Better Stack is unreachable: record this run's intents, send nothing more
            for incident in plan_incidents(conn, now, self.config, installation):
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
                queue=intent.queue,
                name=intent.name,
                summary=intent.summary,
                num_dead_letters=intent.num_dead_letters,
                alert_key=intent.alert_key,
            )
        for incident in planned:
            self.log.info(
                "alerts.feed.dry_run_incident",
                kind=incident.kind,
                queue=incident.queue,
                name=incident.name,
                summary=incident.summary,
                num_dead_letters=len(incident.dead_letter_ids),
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
        ids = list(incident.dead_letter_ids)
        with conn.transaction():
            row = conn.execute(
                RECORD_INTENT,
                {
                    "alert_key": incident.alert_key,
                    "kind": incident.kind,
                    "queue": incident.queue,
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
            queue=incident.queue,
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
        dead letters were handled meanwhile (``handled``), or it is a ``new`` intent one of whose
        pending dead letters is stale now (``superseded``: the escalation planned next pages
        them, and its still fresh ones go into a new incident). Returns the ids whose lookup
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
                    queue=intent.queue,
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
        """Cancel an intent that never reached Better Stack, releasing its dead letters still pending."""
        released = cancel_intent(conn, intent.id, intent.kind, reason, now)
        result.intents_cancelled += 1
        self.log.info(
            "alerts.feed.intent_cancelled",
            alert_id=intent.id,
            alert_key=intent.alert_key,
            kind=intent.kind,
            queue=intent.queue,
            reason=reason,
            num_dead_letters=intent.num_dead_letters,
            released=len(released),
        )

    def _deliver(
        self, conn: psycopg.Connection, now: datetime, installation: str, unsettled: set[int], result: AlertFeedResult
    ) -> None:
        """Post every pending intent (the earlier ones were looked up already), except ``unsettled``."""
        assert self.client is not None
        scope = {INSTALLATION_METADATA_KEY: installation}
        for intent in _pending_intents(conn):
            if intent.id in unsettled:
                continue
            try:
                incident = self.client.create_incident(
                    self.incident_fields(intent), key_name=METADATA_KEY, key_value=intent.alert_key, scope=scope
                )
            except BetterStackError as exc:
                self.log.error(
                    "alerts.feed.post_failed",
                    alert_key=intent.alert_key,
                    kind=intent.kind,
                    queue=intent.queue,
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
            result.executions_alerted += intent.num_dead_letters
        else:
            result.dead_letters_alerted += intent.num_dead_letters
        fields_ = {
            "alert_key": intent.alert_key,
            "incident_id": incident_id,
            "kind": intent.kind,
            "queue": intent.queue,
            "num_dead_letters": intent.num_dead_letters,
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
        for position, (alert_id, incident_id, alert_key, kind, queue) in enumerate(due):
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
                    "alerts.feed.incident_gone", incident_id=incident_id, alert_key=alert_key, kind=kind, queue=queue
                )
            else:
                result.incidents_resolved += 1
                self.log.info(
                    "alerts.feed.incident_resolved",
                    incident_id=incident_id,
                    alert_key=alert_key,
                    kind=kind,
                    queue=queue,
                    already_resolved=outcome == ALREADY_RESOLVED,
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
                incident_id, resolved_by=self.config.requester_email or "core-jobs"
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
        config = self.config
        source = source_of(intent.kind)
        escalation = intent.kind == source.stale_kind
        policy = (config.escalation_policy_id or config.policy_id) if escalation else config.policy_id
        body: dict[str, Any] = {
            "name": intent.name,
            "summary": intent.summary,
            "description": intent.description,
            "email": True,
            "push": True,
            "call": False,
            "sms": False,
            "critical_alert": False,
            "metadata": {
                "core_jobs_kind": [source.metadata_stale if escalation else source.metadata_new],
                source.group_key: [intent.queue or "(several)"],
                source.count_key: [str(intent.num_dead_letters)],
            },
        }
        if config.requester_email:
            body["requester_email"] = config.requester_email
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


# --- planning: scan, group, cap, compose --------------------------------------------------------
def scan(conn: psycopg.Connection, now: datetime, config: AlertFeedConfig) -> list[AlertGroup]:
    """Every group due for an incident — dead letters new, then stale; then executions new, then
    stale — capped per kind and with details."""
    cutoff = now - config.stale_after
    groups: list[AlertGroup] = []
    for source in SOURCES:
        found_here: list[AlertGroup] = []
        for kind, query in ((source.new_kind, source.scan_new), (source.stale_kind, source.scan_stale)):
            rows = conn.execute(query, {"stale_cutoff": cutoff}).fetchall()
            found = [AlertGroup(kind, row[0], tuple(row[1]), row[2], row[3], episodes=_episodes(row)) for row in rows]
            found_here += _cap(found, config.max_incidents_per_run)
        groups += _with_details(conn, source, found_here, config)
    return groups


def _episodes(row: tuple[Any, ...]) -> tuple[datetime, ...]:
    """An execution scan's fifth column: when each entered RECONCILIATION_REQUIRED; none for dead letters."""
    return tuple(row[4]) if len(row) > 4 else ()


def plan_incidents(
    conn: psycopg.Connection, now: datetime, config: AlertFeedConfig, installation: str
) -> list[PlannedIncident]:
    """The incidents this run would post, composed (name, summary, description), keyed for ``installation``."""
    return [compose_incident(group, now, config, installation) for group in scan(conn, now, config)]


def compose_incident(group: AlertGroup, now: datetime, config: AlertFeedConfig, installation: str) -> PlannedIncident:
    """The incident of a group, in its source's words."""
    source = source_of(group.kind)
    if source is EXECUTIONS:
        escalation = group.kind == source.stale_kind
        return compose_executions(group, now, config.stale_after, installation, escalation=escalation)
    return compose(group, now, config, installation)


def _cap(groups: list[AlertGroup], limit: int) -> list[AlertGroup]:
    """At most ``limit`` groups: the largest keep their own incident, the rest fold into one."""
    groups = sorted(groups, key=lambda g: (-len(g.ids), g.queue or ""))
    if len(groups) <= limit:
        return groups
    keep, fold = groups[: limit - 1], groups[limit - 1 :]
    # Executions carry their episodes: kept beside their ids, in the ids' order.
    rows = sorted((i, g.episodes[n] if g.episodes else None) for g in fold for n, i in enumerate(g.ids))
    folded = AlertGroup(
        kind=fold[0].kind,
        queue=None,
        ids=tuple(i for i, _ in rows),
        first_created=min(g.first_created for g in fold),
        last_created=max(g.last_created for g in fold),
        queues=tuple((g.queue or "", len(g.ids)) for g in fold),
        episodes=tuple(e for _, e in rows if e is not None),
    )
    return [*keep, folded]


def _with_details(
    conn: psycopg.Connection, source: AlertSource, groups: list[AlertGroup], config: AlertFeedConfig
) -> list[AlertGroup]:
    """Add the top errors and the samples of each group.

    Samples: one query for all groups. Top errors: one query per group, by primary key; a
    single grouped query over all groups measured 3.5x slower (bench/alerts_scan.py).
    """
    if not groups:
        return []
    detailed = []
    sample_ids = [i for g in groups for i in g.ids[: config.samples]]
    samples = {row[0]: (row[1], row[2]) for row in conn.execute(source.samples, {"ids": sample_ids})}
    for group in groups:
        params = {"ids": list(group.ids), "chars": _ERROR_CHARS, "top": config.top_errors}
        errors = [(error, n) for error, n in conn.execute(source.top_errors, params)]
        detailed.append(
            AlertGroup(
                group.kind,
                group.queue,
                group.ids,
                group.first_created,
                group.last_created,
                errors=tuple(errors),
                samples=tuple(samples[i] for i in group.ids[: config.samples]),
                queues=group.queues,
                episodes=group.episodes,
            )
        )
    return detailed


def compose(group: AlertGroup, now: datetime, config: AlertFeedConfig, installation: str) -> PlannedIncident:
    """What the on-call person reads: name, one-line summary, and the full description."""
    n = len(group.ids)
    alert_key = group.alert_key(installation)
    letters = "dead letter" if n == 1 else "dead letters"
    where = group.queue if group.queue is not None else f"{len(group.queues)} queues"
    span = f"{when(group.first_created)} – {when(group.last_created)}"
    top = f" Most frequent error: {group.errors[0][0]} ({group.errors[0][1]}×)." if group.errors else ""
    if group.kind == NEW:
        name = f"{n} new {letters} in {where}"
        summary = f"{n} {letters} in {where} waiting for review, written {span}.{top}"
        opening = f"{n} new {letters} in {'queue ' + where if group.queue else where}, pending review, written {span}."
        action = "Review them: replay once the cause is fixed, or discard with a reason."
    else:
        age = human(config.stale_after)
        name = f"{n} {letters} in {where} unreviewed for over {age}"
        summary = (
            f"{n} {letters} in {where} still pending review more than {age} after they were written; the oldest: "
            f"{when(group.first_created)} ({human(now - group.first_created)} ago).{top}"
        )
        opening = (
            f"ESCALATION: {n} {letters} in {'queue ' + where if group.queue else where} still pending review "
            f"more than {age} after they were written ({span})."
        )
        action = "Nobody has reviewed these yet: replay or discard each, with a reason."
    lines = [opening, "", *reason_and_sample_lines(group, "Most frequent errors:")]
    if group.queues:
        lines.append("Queues:")
        for queue, count in group.queues:
            link = config.ops_url(queue)
            lines.append(f"  {count} in {queue}" + (f": {link}" if link else ""))
        lines.append("")
    elif group.queue is not None and config.ops_url(group.queue):
        lines += [f"Dead letters of this queue: {config.ops_url(group.queue)}", ""]
    lines.append(action)
    lines.append(f"Dead letter ids {group.ids[0]}–{group.ids[-1]} ({n}); alert key {alert_key}.")
    return PlannedIncident(group.kind, group.queue, alert_key, name, summary, "\n".join(lines), group.ids)
