"""Small PostgreSQL helpers shared by every layer: connections, the server clock and advisory locks.

Every connection of core-jobs is opened by :func:`connect` (``maintenance.runtime.db.Database`` and
``core-jobs migrate`` call it too), which pins the session settings the code relies on,
whatever the server, database or role defaults say (``ALTER DATABASE … SET DateStyle``):

- ``DateStyle = ISO`` — psycopg parses ``timestamptz`` and ``date`` results only in ISO style
  (``SQL, DMY`` fails every job with "can't parse timestamptz");
- ``IntervalStyle = postgres`` — psycopg parses ``interval`` results only in that style;
- ``TimeZone = UTC`` — ``now() + interval '7 days'`` adds calendar days in the session's time
  zone, so across a summer-time change a fence TTL or retry delay would be an hour short or
  long; in UTC a day is always 24 hours. Results are instants either way;
- ``synchronous_commit`` at least ``on`` — every commit waits for its WAL to reach the disk
  unless its own transaction says otherwise. An inherited ``off`` (``ALTER DATABASE … SET
  synchronous_commit = off``, a common tuning, or the role's, the server's, the URL's
  ``options``) would make every commit asynchronous: it returns before its WAL is written, and
  a server crash forgets it. The guarantees rest on commits: a NON_IDEMPOTENT_WRITE's STARTED
  checkpoint (the proof that nothing was sent: forgotten, the next worker sends again), the
  fence with the work, a dead letter, a resolution, an alert intent. ``off`` becomes ``on``;
  ``local``, ``remote_write``, ``on`` and ``remote_apply`` all flush locally and are kept, so a
  DBA's stronger choice (a synchronous standby's ``remote_apply``) is never weakened. The
  commits that are cheap to lose (claims, acks, the execution's take, the purge's batches) turn
  it off with ``set_config(…, true)``: for their own transaction only, the session's pin is back
  at its end (docs/durable-actions.md, "Durable commits").

They are set by one statement right after connecting (about 1 ms more per connection than a
bare connect, measured), not by libpq ``options`` in the startup packet: PgBouncer before 1.20
refuses an ``options`` startup parameter unless told to ignore it, while it carries these
settings (the server reports them) across its pooled server connections. The URL's own
``options`` still apply, except an ``off`` ``synchronous_commit``. (PostgreSQL does not report
``synchronous_commit``, so a pooler in *transaction* mode would not carry its pin from one
transaction to the next: use session pooling, as the jobs' session advisory locks need anyway.) A connection handed to the harness from elsewhere (``PgQueue(conn)``,
``list_dead_letters(conn)``) should be opened with :func:`connect` too, or pinned with
:func:`pin_session` (the operations API's pool does so for each of its connections).

A connection opened with ``primary_only`` (the worker's) is refused, :class:`ServerInRecovery`, when it lands on
a server in recovery (``pg_is_in_recovery()``, read by the same statement): a decision read there — a fence, a
lease, a dead letter's status, a resolution — would be a standby's, behind the primary. libpq's
``target_session_attrs=read-write`` in the URL makes a multi-host URL find the primary instead.

Statement-level settings stay with the statements that need them (``SET LOCAL`` in the
purge's batches, the asynchronous commit of claims, acks and takes, READ COMMITTED in the
metrics job); a ``statement_timeout`` or ``lock_timeout`` the database sets is the DBA's and applies.

Decisions about expiry, staleness and retry schedules use PostgreSQL's clock, never the
worker's: read it once per run with :func:`server_now` and pass it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

# The session settings every connection pins (see the module docstring), in one round trip.
# synchronous_commit: an inherited 'off' becomes 'on'; every other value already flushes locally
# and is kept (current_setting gives the canonical name whatever the spelling: 'false', 'no', '0').
PIN_SESSION_SETTINGS = """
SELECT set_config('DateStyle', 'ISO', false),
       set_config('IntervalStyle', 'postgres', false),
       set_config('TimeZone', 'UTC', false),
       set_config('synchronous_commit',
                  CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on'
                       ELSE current_setting('synchronous_commit') END,
                  false),
       pg_is_in_recovery()
"""


class ServerInRecovery(psycopg.OperationalError):
    """The connection landed on a server in recovery (a standby): no decision of the harness is read there."""


def connect(
    conninfo: str,
    *,
    autocommit: bool = False,
    role: str | None = None,
    primary_only: bool = False,
    **kwargs: Any,
) -> psycopg.Connection:
    """``psycopg.connect`` with the session settings pinned; idle, in the ``autocommit`` mode asked for.

    ``role``: the session switches to it (:func:`set_role`), as the worker and the relay do to theirs.
    ``primary_only``: a server in recovery is refused (:class:`ServerInRecovery`).
    """
    conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
    return prepare(conn, autocommit=autocommit, role=role, primary_only=primary_only)


def prepare(
    conn: psycopg.Connection, *, autocommit: bool = False, role: str | None = None, primary_only: bool = False
) -> psycopg.Connection:
    """What :func:`connect` does once connected: on ``conn`` (autocommit, idle, just opened), the session settings
    pinned, ``role`` switched to, then ``autocommit`` as asked; ``conn`` is closed if any of it fails.

    Apart from the connecting, for a caller that must tell a server it could not reach from a connection lost while
    being set up (the worker: harness/worker.py).
    """
    try:
        if primary_only:
            pin_primary_session(conn)
        else:
            pin_session(conn)
        if role:
            set_role(conn, role)
        conn.autocommit = autocommit
    except BaseException:
        conn.close()
        raise
    return conn


def pin_session(conn: psycopg.Connection) -> bool:
    """Pin the session settings on ``conn`` (autocommit, idle), one round trip: what :func:`connect` does; whether
    the server is in recovery (a standby).

    For a connection opened elsewhere, e.g. by a pool (the operations API's ``configure``).
    """
    row = conn.execute(PIN_SESSION_SETTINGS).fetchone()
    return bool(row and row[4])


def pin_primary_session(conn: psycopg.Connection) -> None:
    """:func:`pin_session`, and :class:`ServerInRecovery` when ``conn`` reached a standby (same round trip): for
    every connection that reads decisions — the worker's, the relay's, the operations API's pool."""
    if pin_session(conn):
        raise ServerInRecovery(
            f"the server at {conn.info.host}:{conn.info.port} is in recovery (a standby): core-jobs reads its"
            " decisions from the primary only; give a URL that reaches it (a multi-host URL with"
            " target_session_attrs=read-write, or the cluster's read-write service)"
        )


def set_role(conn: psycopg.Connection, role: str) -> None:
    """``SET ROLE role`` on ``conn`` (autocommit, idle): the session's grants become the role's.

    The least-privilege roles the migrations create (``core_jobs_worker``, ``core_jobs_relay``,
    ``core_jobs_api``: docs/schema.md) are NOLOGIN; a deployment's login is a member of one and
    switches to it here. A login that is not a member fails now, with PostgreSQL's permission error.
    """
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))


def server_now(conn: psycopg.Connection) -> datetime:
    """PostgreSQL's ``now()``: the start of the current transaction on the server's clock."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


@contextmanager
def advisory_lock(conn: psycopg.Connection, name: str) -> Iterator[bool]:
    """Hold the session-level advisory lock called ``name`` for the block, if it is free.

    Yields True when this session got the lock, False when another session holds it (the
    caller then skips its run). The lock dies with the session, so a crashed runner never
    leaves it behind. ``conn`` should be in autocommit mode: the lock outlives transactions.
    """
    row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (name,)).fetchone()
    acquired = bool(row and row[0])
    try:
        yield acquired
    finally:
        if acquired and not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))


# The tables every worker, relay and producer of the harness reads or writes (migrations/, docs/schema.md).
HARNESS_TABLES = ("core.queue_messages", "core.processed_jobs", "core.dead_letters")

# Which of them the database lacks: to_regclass is NULL for a table that does not exist (never an error).
MISSING_TABLES = "SELECT t FROM unnest(%(tables)s::text[]) AS t WHERE to_regclass(t) IS NULL ORDER BY t"

MIGRATE_HINT = "run `core-jobs migrate` (or `alembic upgrade head` with the bundle's migrations) against it first"


class SchemaNotMigrated(Exception):
    """The database has not been migrated: the harness's tables are missing. Says which, and what to run.

    Raised by :func:`require_schema` (the worker's and the relay's first statement on a connection) and
    in place of PostgreSQL's ``UndefinedTable`` where the harness first touches a table (the claim, a publish).
    """

    def __init__(self, missing: tuple[str, ...] | list[str]) -> None:
        self.missing = tuple(missing)
        super().__init__(
            f"the database has no {', '.join(self.missing)}: its schema is not migrated for core-jobs' harness; "
            + MIGRATE_HINT
        )

    @classmethod
    def from_error(cls, exc: psycopg.errors.UndefinedTable) -> SchemaNotMigrated:
        """PostgreSQL's ``relation "core.x" does not exist`` as the table it names (the table part only)."""
        message = exc.diag.message_primary or str(exc)
        name = message.split('"')[1] if message.count('"') >= 2 else "the harness's tables"
        return cls([name if "." in name or name.startswith("the ") else f"core.{name}"])


def require_schema(conn: psycopg.Connection, tables: tuple[str, ...] = HARNESS_TABLES) -> None:
    """Raise :class:`SchemaNotMigrated` naming every one of ``tables`` the database of ``conn`` lacks.

    One catalog read, in its own transaction or the caller's; for a worker or a relay once per connection,
    before its first claim, so an unmigrated database is one clear sentence rather than ``UndefinedTable``.
    """
    missing = [row[0] for row in conn.execute(MISSING_TABLES, {"tables": list(tables)}).fetchall()]
    if missing:
        raise SchemaNotMigrated(missing)
