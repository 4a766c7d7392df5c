"""This installation's alert identity, and how a copy of the database notices it is one.

The identity (``core.installation``, a random UUID) scopes every alert key and Better Stack
lookup. It is stored data, so a database restored from a backup or made with ``CREATE DATABASE
… TEMPLATE`` carries its origin's — and, without more, its feed would post, adopt and resolve
the origin's incidents under the origin's keys (it resolves an open alert by the incident id in
its rows). So the identity is **bound to where it lives** (migration
``0015_installation_copies``): the cluster's ``system_identifier`` (``pg_control_system()``)
and the database's oid; the name is kept for people, not compared (a rename keeps the oid).
Every feed run, under its lock, compares the binding with ``core.installation_location()``:

* **Bound here** → the run goes on.
* **Elsewhere, and this database never recorded an alert** → a new identity, automatically
  (``bound_how = renewed``, ``bound_by = core-jobs alerts (automatic)``, warning
  ``alerts.identity.renewed``). Nothing at Better Stack can carry the old one *from this
  database*, so there is nothing to lose or to take: a fresh database made from a template, a
  copy of one that never alerted.
* **Elsewhere, with alerts** → the run **refuses**: it sends Better Stack nothing, logs
  ``alerts.identity.unconfirmed`` (error) naming both places, and fails
  (:class:`IdentityUnconfirmed`: ``alerts.feed.error``, ``core-jobs run-once`` exits 1, the
  heartbeat pings ``/fail``, ``core_jobs_job_runs{outcome="failure"}``) until an operator says
  which it is:

  - ``core-jobs alerts identity adopt --reason …`` — *the same installation, moved*
    (``pg_upgrade`` to a new cluster, a dump and restore as the upgrade path, a logical-replication
    cut-over): the identity is kept and bound here; its open incidents are still its own.
  - ``core-jobs alerts identity renew --reason …`` — *a copy* (staging restored from prod): a new
    identity; the origin's open alerts are recorded ``resolved`` with ``resolution = inherited``
    and its pending intents ``cancelled`` (``inherited``) — nothing is sent to Better Stack, the
    origin's incidents stay the origin's. A cancelled intent releases its items still pending, and
    the copy pages them under its own identity; rows an origin's open incident covered are not
    paged again as new (they escalate, once, if still pending past ``stale_after``).

  Both are recorded with who, why and when (``core.installation_history``, append-only).

Why refuse rather than renew by itself when there are alerts: a false "copy" is a production
database moved on purpose (``pg_upgrade`` gives it a new system identifier, a dump and restore a
new oid). Renewing it would orphan every open incident (never auto-resolved) and page every
pending intent again; adopting a real copy by itself is the defect this closes. Neither can be
told from inside the database, and a failed job is loud (exit 1, heartbeat ``/fail``), while a
wrong guess is silent.

What is **not** detected: a *physical* copy — a base backup or disk snapshot restored elsewhere,
a promoted streaming replica, PITR — keeps the system identifier and the oid: inside, it *is*
the origin (a promoted replica, the same installation failing over, must keep its identity, and
a timeline change is the same for both). After restoring a physical backup as another
environment, run ``renew`` on it before it gets a Better Stack token (docs/runbook.md). A copy
made before 0015 that was migrated where it is now is bound there: ``renew`` it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from maintenance.jobs.alerts.sources import cancel_intent
from maintenance.jobs.alerts.sql import PENDING_INTENTS, READ_IDENTITY, REBIND_INSTALLATION, RESOLVE_INHERITED

ADOPTED, RENEWED = "adopted", "renewed"
AUTOMATIC = "core-jobs alerts (automatic)"
AUTOMATIC_REASON = "bound elsewhere, and this database never recorded an alert: a new identity loses nothing"
INHERITED = "inherited"


@dataclass(frozen=True)
class Location:
    """Where a database lives: its cluster's system identifier, its oid, its name."""

    system_identifier: int
    database_oid: int
    database_name: str

    def __str__(self) -> str:
        return f"database {self.database_name} (oid {self.database_oid}) of cluster {self.system_identifier}"


@dataclass(frozen=True)
class Identity:
    """The identity, where it was bound (and how), and where the database is now."""

    id: str
    bound: Location
    bound_at: datetime
    bound_how: str
    bound_by: str
    bound_reason: str | None
    here: Location
    has_alerts: bool

    @property
    def bound_here(self) -> bool:
        """The same cluster and the same database; the name is not compared (a rename keeps the oid)."""
        return (self.bound.system_identifier, self.bound.database_oid) == (
            self.here.system_identifier,
            self.here.database_oid,
        )

    @property
    def state(self) -> str:
        """``bound_here``, ``renews_itself`` (elsewhere, no alert ever) or ``unconfirmed`` (the feed refuses)."""
        if self.bound_here:
            return "bound_here"
        return "unconfirmed" if self.has_alerts else "renews_itself"

    def explain(self) -> str:
        """One paragraph for the operator: where it was bound, where it is, what to run."""
        what = "another cluster" if self.bound.system_identifier != self.here.system_identifier else "another database"
        return (
            f"the alert identity {self.id} was bound to {self.bound} ({self.bound_how} by {self.bound_by}, "
            f"{self.bound_at.isoformat()}), but this is {self.here} ({what}): a copy (a restored backup, CREATE "
            "DATABASE … TEMPLATE) or the same installation moved (pg_upgrade, dump and restore). The alert feed sends "
            "Better Stack nothing until an operator says which: `core-jobs alerts identity renew --reason …` (a copy: "
            "a new identity, the origin's incidents left alone) or `core-jobs alerts identity adopt --reason …` "
            "(moved: keep it)"
        )

    def log_fields(self) -> dict[str, Any]:
        return {
            "installation": self.id,
            "bound_system_identifier": str(self.bound.system_identifier),
            "bound_database_oid": self.bound.database_oid,
            "bound_database": self.bound.database_name,
            "system_identifier": str(self.here.system_identifier),
            "database_oid": self.here.database_oid,
            "database": self.here.database_name,
        }


class IdentityUnconfirmed(RuntimeError):
    """The database is not where its identity was bound, and it has alerts: the feed refuses to alert."""

    def __init__(self, identity: Identity) -> None:
        super().__init__(identity.explain())
        self.identity = identity


@dataclass(frozen=True)
class Rebound:
    """What an adopt or renew did."""

    previous: Identity
    installation: str
    how: str
    resolved_inherited: int = 0
    cancelled_inherited: int = 0


def read_identity(conn: psycopg.Connection) -> Identity:
    row = conn.execute(READ_IDENTITY).fetchone()
    if row is None:
        raise RuntimeError("core.installation has no row: the alert feed has no identity; run `core-jobs migrate`")
    (id_, sysid, oid, name, at, how, by, reason, here_sysid, here_oid, here_name, has_alerts) = row
    return Identity(
        id_, Location(sysid, oid, name), at, how, by, reason, Location(here_sysid, here_oid, here_name), has_alerts
    )


def settle_identity(conn: psycopg.Connection, now: datetime, log: Any) -> str:
    """The identity this feed run may alert under (the caller holds the feed's lock), or IdentityUnconfirmed."""
    identity = read_identity(conn)
    if identity.bound_here:
        return identity.id
    if identity.has_alerts:
        log.error("alerts.identity.unconfirmed", **identity.log_fields())
        raise IdentityUnconfirmed(identity)
    rebound = rebind(conn, RENEWED, by=AUTOMATIC, reason=AUTOMATIC_REASON, now=now)
    log.warning("alerts.identity.renewed", **identity.log_fields(), renewed_to=rebound.installation, automatic=True)
    return rebound.installation


def rebind(conn: psycopg.Connection, how: str, *, by: str, reason: str, now: datetime) -> Rebound:
    """Adopt (keep the identity) or renew (a new one, the origin's unfinished alerts finished as
    ``inherited``) and bind it here, in one transaction; ``now`` stamps the inherited alerts."""
    with conn.transaction():
        previous = read_identity(conn)
        resolved, cancelled = 0, 0
        if how == RENEWED:
            for intent in conn.execute(PENDING_INTENTS).fetchall():
                cancel_intent(conn, intent[0], intent[2], INHERITED, now)
                cancelled += 1
            resolved = len(conn.execute(RESOLVE_INHERITED, {"now": now}).fetchall())
        rebound = conn.execute(REBIND_INSTALLATION, {"how": how, "by": by, "reason": reason}).fetchone()
        assert rebound is not None  # the one row
    return Rebound(previous, rebound[0], how, resolved, cancelled)
