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

**Bound to an environment too** (migration ``0016_installation_environment``). A *physical*
copy — a base backup or a disk snapshot restored elsewhere (RDS and Cloud SQL snapshot restores
are physical), a promoted streaming replica, PITR — keeps the system identifier and the oid:
inside, it *is* the origin (a promoted replica, the same installation failing over, must keep
its identity). What tells staging restored from production's snapshot from production is only
what its deployment says it is: ``CORE_JOBS_ALERTS_ENVIRONMENT`` (the Helm chart sets it from
its required ``environment`` value). The identity records the environment it was bound under,
and each run compares it with the configured one too:

* **The same** → the run goes on.
* **None recorded, one configured** → recorded by itself (``bound_how = declared``, warning
  ``alerts.identity.declared``), and the run goes on: an existing production that sets it for
  the first time neither pages again nor stops alerting. Only the first one: a declaration never
  replaces another.
* **Another one, or none configured while one is recorded** → as a copy elsewhere: a new
  identity by itself if this database never recorded an alert, else the run **refuses**
  (``alerts.identity.unconfirmed`` naming both environments) until ``renew`` (a copy: staging
  restored from production's snapshot) or ``adopt`` (the deployment was renamed) — each records
  the environment it is given (``--environment``, by default the configured one).

So a physical copy is detected when it runs with its own deployment's configuration, which is
the only way it reaches its own Better Stack; a copy run with the origin's configuration
(environment and token) is the origin, by every means available. A copy made before 0015 that
was migrated where it is now, under the same environment, is bound there: ``renew`` it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from alerts.sources import cancel_intent
from alerts.sql import PENDING_INTENTS, READ_IDENTITY, REBIND_INSTALLATION, RESOLVE_INHERITED

ADOPTED, RENEWED, DECLARED = "adopted", "renewed", "declared"
AUTOMATIC = "core-jobs alerts (automatic)"
AUTOMATIC_REASON = "bound elsewhere, and this database never recorded an alert: a new identity loses nothing"
DECLARED_REASON = "the first environment declared for this installation (CORE_JOBS_ALERTS_ENVIRONMENT)"
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
    """The identity, where and under which environment it was bound (and how), and where and as what the database
    runs now (``configured``: the environment this process was given)."""

    id: str
    bound: Location
    bound_at: datetime
    bound_how: str
    bound_by: str
    bound_reason: str | None
    here: Location
    has_alerts: bool
    environment: str | None
    configured: str | None

    @property
    def bound_here(self) -> bool:
        """The same cluster and the same database; the name is not compared (a rename keeps the oid)."""
        return (self.bound.system_identifier, self.bound.database_oid) == (
            self.here.system_identifier,
            self.here.database_oid,
        )

    @property
    def same_environment(self) -> bool:
        """The configured environment is the recorded one, or none was recorded yet (the first is declared)."""
        return self.environment is None or self.environment == self.configured

    @property
    def state(self) -> str:
        """``bound_here``, ``declares`` (bound here, the first environment to record), ``renews_itself``
        (elsewhere or another environment, no alert ever) or ``unconfirmed`` (the feed refuses)."""
        if self.bound_here and self.same_environment:
            return "declares" if self.environment is None and self.configured is not None else "bound_here"
        return "unconfirmed" if self.has_alerts else "renews_itself"

    def explain(self) -> str:
        """One paragraph for the operator: where and as what it was bound, where and as what it runs, what to run."""
        bound = f"{self.bound} as environment {self.environment or '(none)'}"
        if not self.bound_here:
            what = (
                "another cluster" if self.bound.system_identifier != self.here.system_identifier else "another database"
            )
            here = f"this is {self.here} ({what}): a copy (a restored backup, CREATE DATABASE … TEMPLATE) or the same installation moved (pg_upgrade, dump and restore)"
        else:
            here = (
                f"this deployment is configured as environment {self.configured or '(none)'} "
                "(CORE_JOBS_ALERTS_ENVIRONMENT): a physical copy (a snapshot or a base backup restored as another "
                "deployment), a deployment renamed, or a configuration that lost its environment"
            )
        return (
            f"the alert identity {self.id} was bound to {bound} ({self.bound_how} by {self.bound_by}, "
            f"{self.bound_at.isoformat()}), but {here}. The alert feed sends Better Stack nothing until an operator "
            "says which: `core-jobs alerts identity renew --reason …` (a copy: a new identity, the origin's incidents "
            "left alone) or `core-jobs alerts identity adopt --reason …` (the same installation, moved or renamed: "
            "keep it); both record the configured environment"
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
            "bound_environment": self.environment,
            "environment": self.configured,
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


def read_identity(conn: psycopg.Connection, *, configured: str | None) -> Identity:
    """The identity as recorded, and where the database is; ``configured``: the environment this process runs as."""
    row = conn.execute(READ_IDENTITY).fetchone()
    if row is None:
        raise RuntimeError("core.installation has no row: the alert feed has no identity; run `core-jobs migrate`")
    (id_, sysid, oid, name, at, how, by, reason, here_sysid, here_oid, here_name, has_alerts, environment) = row
    return Identity(
        id_,
        Location(sysid, oid, name),
        at,
        how,
        by,
        reason,
        Location(here_sysid, here_oid, here_name),
        has_alerts,
        environment,
        configured,
    )


def settle_identity(conn: psycopg.Connection, now: datetime, log: Any, environment: str | None) -> str:
    """The identity this feed run, configured as ``environment``, may alert under (the caller holds the feed's
    lock), or IdentityUnconfirmed."""
    identity = read_identity(conn, configured=environment)
    state = identity.state
    if state == "bound_here":
        return identity.id
    if state == "unconfirmed":
        log.error("alerts.identity.unconfirmed", **identity.log_fields())
        raise IdentityUnconfirmed(identity)
    if state == "declares":
        rebind(conn, DECLARED, by=AUTOMATIC, reason=DECLARED_REASON, now=now, environment=environment)
        log.warning("alerts.identity.declared", **identity.log_fields())
        return identity.id
    rebound = rebind(conn, RENEWED, by=AUTOMATIC, reason=AUTOMATIC_REASON, now=now, environment=environment)
    log.warning("alerts.identity.renewed", **identity.log_fields(), renewed_to=rebound.installation, automatic=True)
    return rebound.installation


def rebind(
    conn: psycopg.Connection, how: str, *, by: str, reason: str, now: datetime, environment: str | None
) -> Rebound:
    """Adopt (keep the identity), declare (keep it, record its first environment) or renew (a new one, the
    origin's unfinished alerts finished as ``inherited``) and bind it here under ``environment``, in one
    transaction; ``now`` stamps the inherited alerts."""
    with conn.transaction():
        previous = read_identity(conn, configured=environment)
        resolved, cancelled = 0, 0
        if how == RENEWED:
            for intent in conn.execute(PENDING_INTENTS).fetchall():
                cancel_intent(conn, intent[0], intent[2], INHERITED, now)
                cancelled += 1
            resolved = len(conn.execute(RESOLVE_INHERITED, {"now": now}).fetchall())
        rebound = conn.execute(
            REBIND_INSTALLATION, {"how": how, "by": by, "reason": reason, "environment": environment}
        ).fetchone()
        assert rebound is not None  # the one row
    return Rebound(previous, rebound[0], how, resolved, cancelled)
