"""The replication barrier: nothing outside PostgreSQL acts on a commit before a standby has it.

PostgreSQL's streaming replication is asynchronous by default: a commit the primary acknowledged
can be missing on the standby a failover promotes. On the reference queue that loses work, fence
and message together and the job runs again. Where something *outside* the database acts on the
commit — a broker ack (the job's message is gone), a ``NON_IDEMPOTENT_WRITE``'s request (sent
because its ``STARTED`` checkpoint committed) — the lost commit means a vanished job or a write
sent twice. Synchronous replication narrows this but keeps two documented holes (a cancelled wait
returns success; a primary restarted while commits wait marks them committed).

A connection registered with a :class:`ReplicationBarrier` (:func:`register`, the worker does it
for ``WorkerConfig.await_standby``) makes :func:`after_commit` wait, after such a commit, until a
standby has flushed the WAL up to this session's current insert position (``pg_stat_replication``,
one statement per poll, a batch's commits covered by one wait). Past the barrier's timeout it
raises :class:`NotReplicated` and the caller does not act: the worker releases the batch instead
of acking it (a copy, the fence decides), a dead letter's ack becomes a retry, a write is not
sent. An unregistered connection waits for nothing. docs/failover.md.

**A cancelled synchronous-replication wait is uncertain, never a success.** With
``synchronous_standby_names`` set, a COMMIT whose wait for the standbys is cancelled
(``pg_cancel_backend``, a statement timeout, the backend terminated) is committed locally and returns
*success* with ``WARNING: canceling wait for synchronous replication … The transaction has already
committed locally, but might not have been replicated to the standby`` (postgres
``src/backend/replication/syncrep.c``): a failover may still lose it. :func:`watch` (which
:func:`register` calls) counts those warnings per connection with a notice handler;
:func:`uncertain_commits` reads the count before a commit, and :func:`after_commit` given it raises
:class:`CommitUncertain` (a :class:`NotReplicated`) when a warning came since — before any barrier
wait. The worker then releases the batch instead of acking it on a broker (the fence decides the
copy); a ``NON_IDEMPOTENT_WRITE`` whose ``STARTED`` checkpoint came back uncertain is not sent: it
becomes ``RECONCILIATION_REQUIRED`` (harness/durable/run.py). The warning is matched by its English
text (and the terminating variant by its SQLSTATE ``57P01`` too): a server whose ``lc_messages`` is
not English translates the cancelling variant, and it is then missed (docs/high-availability.md).

Reading a standby's positions needs ``pg_read_all_stats`` (``pg_monitor``) or a superuser:
:func:`register` refuses a role that cannot see them.
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta

import psycopg

__all__ = [
    "CommitUncertain",
    "NotReplicated",
    "ReplicationBarrier",
    "after_commit",
    "register",
    "registered",
    "uncertain_commits",
    "watch",
]

# Where this session's WAL is now: at or past the end of every commit it made.
CURRENT_LSN = "SELECT pg_current_wal_insert_lsn()::text"

# How many standbys have flushed up to a position, of how many stream.
STANDBYS_AT = """
SELECT count(*) FILTER (WHERE flush_lsn >= %(lsn)s::pg_lsn), count(*)
  FROM pg_stat_replication
"""

# Whether this role can read the standbys' positions (else pg_stat_replication shows them NULL).
CAN_SEE_STANDBYS = "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')"

_POLL_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)


class NotReplicated(Exception):
    """No standby flushed a commit within the barrier's timeout: whatever would act on it outside PostgreSQL must not."""


class CommitUncertain(NotReplicated):
    """A commit came back with the cancelled synchronous-replication wait's warning: committed on the primary, maybe
    on no standby. Neither a success to act on nor a failure: whatever would act on it outside PostgreSQL must not."""


# syncrep.c's two warnings: a cancel (SQLSTATE 01000, the generic warning) and a terminated backend (57P01).
CANCELLED_WAIT_TEXT = ("synchronous replication", "committed locally")
TERMINATED_WAIT_SQLSTATE = "57P01"


def is_cancelled_wait(diag: psycopg.errors.Diagnostic) -> bool:
    """Whether a notice is PostgreSQL's warning that a commit's wait for the synchronous standbys was cancelled."""
    if (diag.severity_nonlocalized or diag.severity) != "WARNING":
        return False
    text = f"{diag.message_primary or ''} {diag.message_detail or ''}"
    return diag.sqlstate == TERMINATED_WAIT_SQLSTATE or any(part in text for part in CANCELLED_WAIT_TEXT)


@dataclass
class _Watch:
    uncertain: int = 0  # cancelled-wait warnings this connection received so far

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        if is_cancelled_wait(diag):
            self.uncertain += 1


_WATCHES: weakref.WeakKeyDictionary[psycopg.Connection, _Watch] = weakref.WeakKeyDictionary()


def watch(conn: psycopg.Connection) -> None:
    """Count the cancelled-wait warnings ``conn`` receives from now on (idempotent)."""
    if conn not in _WATCHES:
        _WATCHES[conn] = counter = _Watch()
        conn.add_notice_handler(counter)


def uncertain_commits(conn: psycopg.Connection) -> int:
    """How many commits on ``conn`` came back uncertain so far (0 if it is not watched): read it before a commit,
    give it to :func:`after_commit` after."""
    counter = _WATCHES.get(conn)
    return counter.uncertain if counter is not None else 0


@dataclass(frozen=True)
class ReplicationBarrier:
    """Wait, after a commit, until ``standbys`` standbys have flushed it — at most ``timeout``."""

    timeout: timedelta
    standbys: int = 1

    def __post_init__(self) -> None:
        if self.timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {self.timeout}")
        if self.standbys < 1:
            raise ValueError(f"standbys must be at least 1, got {self.standbys}")

    def wait(self, conn: psycopg.Connection) -> None:
        row = conn.execute(CURRENT_LSN).fetchone()
        assert row is not None
        lsn = row[0]
        deadline = time.monotonic() + self.timeout.total_seconds()
        for poll in itertools.count():
            flushed, streaming = conn.execute(STANDBYS_AT, {"lsn": lsn}).fetchone()  # type: ignore[misc]
            if flushed >= self.standbys:
                return
            if time.monotonic() >= deadline:
                raise NotReplicated(
                    f"{flushed} of {streaming} streaming standbys flushed WAL {lsn} within {self.timeout}"
                    f" ({self.standbys} needed)"
                )
            time.sleep(_POLL_S[min(poll, len(_POLL_S) - 1)])


_BARRIERS: weakref.WeakKeyDictionary[psycopg.Connection, ReplicationBarrier] = weakref.WeakKeyDictionary()


def register(conn: psycopg.Connection, barrier: ReplicationBarrier | None) -> None:
    """Make :func:`after_commit` on ``conn`` wait for ``barrier`` (None: for nothing), and :func:`watch` it either
    way. Refuses a role that cannot read the standbys' positions, with a message saying what to grant."""
    watch(conn)
    if barrier is None:
        _BARRIERS.pop(conn, None)
        return
    row = conn.execute(CAN_SEE_STANDBYS).fetchone()
    if not (row and row[0]):
        raise PermissionError(
            "the replication barrier reads the standbys' positions in pg_stat_replication: "
            "GRANT pg_monitor (or pg_read_all_stats) to the worker's database role"
        )
    _BARRIERS[conn] = barrier


def registered(conn: psycopg.Connection) -> ReplicationBarrier | None:
    return _BARRIERS.get(conn)


def after_commit(conn: psycopg.Connection, since: int | None = None) -> None:
    """After a commit something outside PostgreSQL will act on: :class:`CommitUncertain` if a commit on ``conn``
    came back uncertain since :func:`uncertain_commits` read ``since`` (None: that is not checked), then wait for
    ``conn``'s barrier, if it has one."""
    if since is not None and uncertain_commits(conn) > since:
        raise CommitUncertain(
            "a commit's wait for the synchronous standbys was cancelled: committed on the primary, maybe on no standby"
            " (a failover may lose it)"
        )
    barrier = _BARRIERS.get(conn)
    if barrier is not None:
        barrier.wait(conn)
