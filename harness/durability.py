"""The durability tier of the database the harness commits to, read from the primary, and what it means.

A failover keeps what a standby had. Which commits that is depends on how the primary replicates
(docs/high-availability.md):

- **single** — no standby streams and none is required: nothing to fail over to (what a lost
  server had is the backups' to bring back);
- **asynchronous** (n standbys) — a commit returns once it is on the primary's disk; a failover
  may lose any commit the promoted standby had not received. On the reference queue a job's work,
  fence and ack are lost together and the job runs again; on a broker the ack is not lost: **the
  job vanishes**; a ``NON_IDEMPOTENT_WRITE`` whose ``STARTED`` checkpoint is lost is **sent twice**;
- **synchronous** (``ANY``/``FIRST`` k of n) — a commit returns once k standbys have it
  (``synchronous_standby_names``, with a ``synchronous_commit`` that waits): a failover to one of
  them loses none. A commit whose wait was cancelled is uncertain, never a success
  (harness/replication.py).

:func:`read_tier` reads it in one statement (``pg_stat_replication``, ``synchronous_standby_names``,
``synchronous_commit`` of this session). :func:`needs_of` says what a consumer on a queue needs;
:meth:`DurabilityTier.shortfall` says why a tier does not give it — asynchronous standbys under a
broker queue or a ``NON_IDEMPOTENT_WRITE``, with no replication barrier
(``WorkerConfig.await_standby``). The worker refuses to start on a shortfall
(:class:`DurabilityTierTooLow`) unless told to accept it (``WorkerConfig.accept_asynchronous_replication``).

Reading the standbys' states (``sync_state``) needs ``pg_read_all_stats`` (``pg_monitor``); without
it the standbys are counted but not their states (``synchronous_connected`` is None). A logical
replication's walsender is counted as a standby too: it is no failover target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from harness.consumer.actions import Effect
from harness.consumer.consumer import Consumer

__all__ = ["DurabilityTier", "DurabilityTierTooLow", "Needs", "needs_of", "parse_standby_names", "read_tier"]

Kind = Literal["single", "asynchronous", "synchronous"]

READ_TIER = """
SELECT current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       (SELECT count(*) FROM pg_stat_replication WHERE state IS DISTINCT FROM 'backup'),
       (SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) FROM pg_stat_replication),
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
"""

# synchronous_commit values with which a commit does not wait for the synchronous standbys.
NOT_WAITING = ("off", "local")

_NUMBERED = re.compile(r"(?is)\s*(?:(ANY|FIRST)\s+)?(\d+)\s*\((.*)\)\s*")


class DurabilityTierTooLow(Exception):
    """The database's durability tier does not give what the consumer needs, and nothing was accepted instead."""


def parse_standby_names(text: str) -> tuple[str | None, int, tuple[str, ...]]:
    """``synchronous_standby_names`` as (method, number, names): ``ANY 2 (a, b, c)`` → ("ANY", 2, (a, b, c));
    ``2 (a, b)`` and ``a, b`` are FIRST (of 2, of 1); empty → (None, 0, ())."""
    text = text.strip()
    if not text:
        return None, 0, ()
    numbered = _NUMBERED.fullmatch(text)
    method, number, listed = (
        ((numbered[1] or "FIRST").upper(), int(numbered[2]), numbered[3]) if numbered else ("FIRST", 1, text)
    )
    names = tuple(name.strip().strip('"') for name in listed.split(",") if name.strip())
    return method, number, names


@dataclass(frozen=True)
class Needs:
    """What a consumer needs of the tier: whether something outside PostgreSQL acts on its commits."""

    broker: bool  # its queue acks outside the database (a broker): a lost commit is a vanished job
    non_idempotent: tuple[str, ...]  # its NON_IDEMPOTENT_WRITE actions: a lost STARTED is a second send

    @property
    def failover_safe_commits(self) -> bool:
        return self.broker or bool(self.non_idempotent)

    def describe(self) -> str:
        parts = (["a broker queue (its ack outlives a lost commit)"] if self.broker else []) + [
            f"NON_IDEMPOTENT_WRITE {name} (a lost STARTED checkpoint sends it again)" for name in self.non_idempotent
        ]
        return " and ".join(parts) or "nothing beyond the reference queue (a lost commit loses the job's ack with it)"


def needs_of(consumer: Consumer[Any], *, broker: bool) -> Needs:
    """What ``consumer`` needs, on a broker queue (``broker``) or the reference queue."""
    writes = tuple(a.name for a in consumer.actions if a.effect is Effect.NON_IDEMPOTENT_WRITE)
    return Needs(broker=broker, non_idempotent=writes)


@dataclass(frozen=True)
class DurabilityTier:
    kind: Kind
    standbys: int  # streaming from the primary
    method: str | None  # ANY or FIRST, for synchronous
    number: int  # how many synchronous standbys a commit waits for
    names: tuple[str, ...]  # synchronous_standby_names' candidates
    synchronous_commit: str  # this session's
    synchronous_connected: int | None  # standbys streaming as sync/quorum now; None: the role cannot see it

    def describe(self) -> str:
        if self.kind == "single":
            return "single node (no standby)"
        if self.kind == "asynchronous":
            why = (
                f", synchronous_commit {self.synchronous_commit}"
                if self.names and self.synchronous_commit in NOT_WAITING
                else ""
            )
            return f"asynchronous standbys ({self.standbys}{why})"
        listed = ", ".join(self.names)
        connected = "" if self.synchronous_connected is None else f", {self.synchronous_connected} connected"
        weaker = " (written, not flushed, on the standby)" if self.synchronous_commit == "remote_write" else ""
        return f"synchronous ({self.method} {self.number} of {len(self.names)}: {listed}{connected}){weaker}"

    def meaning(self) -> str:
        """What this tier means for the queues and the effect classes."""
        if self.kind == "single":
            return (
                "no failover: every acknowledged commit is this server's (what it loses is the backups' to restore);"
                " every queue and effect class keeps its promise"
            )
        if self.kind == "asynchronous":
            return (
                "a failover may lose commits the primary acknowledged: on the reference queue the job runs again"
                " (work, fence and ack lost together); on a broker queue an acked job is lost; a NON_IDEMPOTENT_WRITE"
                " may be sent twice; an IDEMPOTENT_WRITE is re-sent with its key. The replication barrier"
                " (await_standby) closes it: nothing outside PostgreSQL acts on a commit before a standby has it"
            )
        waiting = (
            f"; only {self.synchronous_connected} of the {self.number} required standbys stream now: commits wait"
            if self.synchronous_connected is not None and self.synchronous_connected < self.number
            else ""
        )
        return (
            f"a commit returns once {self.number} standby(s) have it: a failover to one of them loses none, on every"
            " queue and effect class; a commit whose wait is cancelled is uncertain (not acked, not followed by a"
            f" send){waiting}"
        )

    def shortfall(self, needs: Needs, *, barrier: bool) -> str | None:
        """Why this tier does not give ``needs`` (None: it does)."""
        if self.kind != "asynchronous" or not needs.failover_safe_commits or barrier:
            return None
        return (
            f"the database replicates to {self.describe()}, and {needs.describe()} needs commits a failover keeps:"
            " make the standbys synchronous (synchronous_standby_names, docs/high-availability.md), turn on the"
            " replication barrier (CORE_JOBS_WORKER_AWAIT_STANDBY), or accept the loss"
            " (CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION=true)"
        )

    def fields(self) -> dict[str, Any]:
        """For a structured event and a JSON document."""
        return {
            "tier": self.kind,
            "standbys": self.standbys,
            "synchronous_method": self.method,
            "synchronous_number": self.number,
            "synchronous_names": list(self.names),
            "synchronous_commit": self.synchronous_commit,
            "synchronous_connected": self.synchronous_connected,
        }


def read_tier(conn: psycopg.Connection) -> DurabilityTier:
    """The tier of the primary ``conn`` is on (autocommit), in one statement."""
    row = conn.execute(READ_TIER).fetchone()
    assert row is not None
    names_setting, synchronous_commit, standbys, synchronous, can_see = row
    method, number, names = parse_standby_names(names_setting)
    kind: Kind
    if names and synchronous_commit not in NOT_WAITING:
        kind = "synchronous"
    else:
        kind = "asynchronous" if standbys else "single"
    return DurabilityTier(
        kind=kind,
        standbys=standbys,
        method=method if kind == "synchronous" else None,
        number=number if kind == "synchronous" else 0,
        names=names,
        synchronous_commit=synchronous_commit,
        synchronous_connected=synchronous if can_see else None,
    )
