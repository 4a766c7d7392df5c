"""Operator actions on dead letters: list, replay, discard, release — in bulk, audited (J-B6, J-B8).

- **Replay** republishes each dead letter to its queue with the **same job_id** (and its
  payload, tenant and correlation id) and marks it ``replayed``, in one transaction: a replayed
  job whose work already succeeded elsewhere is absorbed by the fence, so replay is safe in
  bulk (J-AC5). The republished message starts a fresh attempt budget and carries
  ``replay_of`` = the dead letter's id. The replay is then *outstanding* (``replay_outcome``
  NULL) until the harness handles that delivery with a final outcome; meanwhile the purge keeps
  the job's fences, however long the message waits (harness/queue/port.py, "Replays"). The
  message is published through the queue port (``PgQueue.publish_many``) in the replay's
  transaction: for a queue on a broker ``core.queue_messages`` is the outbox, and a relay
  publishes it there (harness/queue/relay.py, docs/outbox.md).
- **Discard** marks each dead letter ``discarded`` with a reason; a blank reason is refused
  before anything is touched (the database refuses it too, J-AC7).
- **Release** ends the outstanding state of replays whose delivery will never be handled (the
  broker lost the message, or it was deleted by hand): ``replay_outcome = 'released'``, with a
  required reason. The fences are then kept margin x retry window more, like after a handled
  delivery, and then purged normally — so release only a replay whose message is truly gone: a
  later delivery could apply the work twice. A replay whose message still waits in the
  reference queue — or in the outbox, for a queue on a broker — is refused (it will be handled).
- A dead letter whose payload Python cannot decode (too deep, an integer over 4 300 digits: the
  worker's poison, kept as stored) is listed and shown with its stored text
  (maintenance/operations/stored.py), and its **replay is refused** naming it
  (``undecodable``), nothing changed: republished, it would only be dead-lettered again (and a
  dead letter's payload never changes). Discard it.
- Replay and discard act on ``pending_review`` dead letters (by ids, or every pending one of a
  queue — a **filter**, capped: one matching more than ``max_rows`` (the caller's, required with a
  filter: ``CORE_JOBS_DEAD_LETTERS_BULK_MAX`` for the CLI and the API) is refused with the count,
  nothing changed, so a slip of the queue name cannot republish a whole backlog in one
  transaction; act by ids, or raise the cap deliberately), release on outstanding replays; each acts on every id given or on none: an id that
  does not exist or is in the wrong state refuses the whole request (:class:`OperationRefused`,
  with the missing ids and the current statuses), nothing changed.
- All three are written to ``core.dead_letter_actions``, the append-only audit ledger, by
  database triggers on the change: who (the ``operator`` given here, set as the transaction's
  ``core_jobs.operator``), when, what, and the reason. The ledger is complete even for changes
  made from psql.
- **Pages** (:func:`list_page`, the operations API's list): newest first, filtered by status
  (always one), queue, consumer, tenant, job id, correlation id and a ``created_at`` range, in
  **keyset** order — each page continues strictly after the last row of the previous one,
  ``(created_at, id) < (position)``, so page 100 costs what page 1 costs and a row written
  meanwhile neither repeats nor skips a row. No free-text search: every filter is an index.
- **Lists** (:func:`list_dead_letters`, the CLI's; :func:`list_page`, the API's) have one default:
  ``pending_review`` letters, newest first (:data:`DEFAULT_STATUS`) — what is waiting for a decision,
  the latest failure on top.
- **Error groups** (:func:`error_groups`, ``dead-letters errors`` and ``GET …/dead-letters/errors``):
  the letters counted by the first line of their ``last_error``, biggest group first, as
  ServicePulse groups failures — one decision per cause rather than per letter.
- **Detail** (:func:`get_dead_letter`): one dead letter, its payload, its failure's stack trace
  (``traceback``, harness/errors.py) and its audit history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from harness.enumerations import DEAD_LETTER_STATUSES
from harness.queue.pgqueue import PgQueue
from harness.queue.port import NO_TENANT, Envelope, UndecodablePayload
from maintenance.operations.keyset import fetch_page

__all__ = [
    "Action",
    "DeadLetterDetail",
    "DeadLetterFilter",
    "DeadLetterRow",
    "ErrorGroup",
    "OperationRefused",
    "Page",
    "Position",
    "discard",
    "error_groups",
    "get_dead_letter",
    "get_row",
    "list_dead_letters",
    "list_page",
    "release",
    "replay",
]

STATUSES = DEAD_LETTER_STATUSES  # harness/enumerations.py
MAX_BULK_IDS = 1000  # ids one action by id may name: the CLI's and the API's cap


class OperationRefused(Exception):
    """The request was refused as a whole; nothing changed. One problem per line.

    ``missing`` lists the ids that do not exist and ``not_pending`` maps the ids that are not
    ``pending_review`` to their current status; ``matched`` (with ``max_rows``) is how many a
    filter matched beyond the cap; ``undecodable`` lists the letters a replay refused because
    their payload cannot be decoded — for callers that answer each case differently (the API: 404,
    409, 422).
    """

    def __init__(
        self,
        problems: Sequence[str],
        *,
        missing: Sequence[int] = (),
        not_pending: dict[int, str] | None = None,
        matched: int | None = None,
        max_rows: int | None = None,
        undecodable: Sequence[int] = (),
    ) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)
        self.missing = list(missing)
        self.undecodable = list(undecodable)
        self.not_pending = dict(not_pending or {})
        self.matched, self.max_rows = matched, max_rows


@dataclass(frozen=True)
class DeadLetterRow:
    id: int
    job_id: UUID
    queue: str
    consumer: str | None
    status: str
    attempts: int
    last_error: str
    traceback: str | None  # the failure's stack trace (migration 0022); None when it has none, and on a page
    correlation_id: str | None
    tenant_id: UUID | None
    payload: Any  # an UndecodablePayload when Python cannot decode it (maintenance/operations/stored.py)
    discard_reason: str | None
    created_at: datetime
    status_changed_at: datetime | None
    replay_outcome: str | None  # NULL on a replayed letter: its delivery is outstanding
    replay_handled_at: datetime | None
    traceparent: str | None  # the job's W3C trace context (harness/tracing.py): a replay carries it
    tracestate: str | None

    @property
    def outstanding(self) -> bool:
        """Replayed, and the republished delivery not handled yet: the job's fences are held."""
        return self.status == "replayed" and self.replay_outcome is None


_COLUMNS = (
    "id, job_id, queue, consumer, status, attempts, last_error, traceback, correlation_id, tenant_id, payload,"
    " discard_reason, created_at, status_changed_at, replay_outcome, replay_handled_at, traceparent, tracestate"
)

LIST = f"""
SELECT {_COLUMNS}
  FROM core.dead_letters
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (NOT %(outstanding)s OR (status = 'replayed' AND replay_outcome IS NULL))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s
"""

# The letters grouped by their error's first line, biggest group first (a ServicePulse "failure group"):
# what broke, how often, since when, on which queues, and the newest letter to look at.
ERROR_GROUPS = """
SELECT split_part(last_error, E'\\n', 1) AS error, count(*) AS count, array_agg(DISTINCT queue ORDER BY queue) AS queues,
       min(created_at) AS oldest, max(created_at) AS newest, max(id) AS latest_id
  FROM core.dead_letters
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
 GROUP BY 1
 ORDER BY count(*) DESC, max(created_at) DESC
 LIMIT %(limit)s
"""

# The rows an action targets, locked so that two operators cannot act on one letter at once —
# both in id order, so that a replay by ids and one of a whole queue cannot deadlock.
LOCK_BY_ID = f"SELECT {_COLUMNS} FROM core.dead_letters WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE"
# A filter's rows: one more than the cap at most, so a filter over the cap locks no backlog to learn it.
LOCK_PENDING_OF_QUEUE = f"""
SELECT {_COLUMNS} FROM core.dead_letters
 WHERE queue = %(queue)s AND status = 'pending_review'
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE
"""
# How many a refused filter matched, for the refusal (dead_letters_queue_status_created_idx, 0009).
COUNT_PENDING_OF_QUEUE = "SELECT count(*) FROM core.dead_letters WHERE queue = %(queue)s AND status = 'pending_review'"

SET_ACTOR = (
    "SELECT set_config('core_jobs.operator', %(operator)s, true), set_config('core_jobs.reason', %(reason)s, true)"
)
# Each action answers the rows as it left them, the triggers' stamps (status_changed_at, replay_handled_at)
# included, in id order as they were locked: no caller reads them a second time.
MARK_REPLAYED = f"""
WITH changed AS (UPDATE core.dead_letters SET status = 'replayed' WHERE id = ANY(%(ids)s) RETURNING {_COLUMNS})
SELECT * FROM changed ORDER BY id
"""
MARK_DISCARDED = f"""
WITH changed AS (
    UPDATE core.dead_letters SET status = 'discarded', discard_reason = %(reason)s WHERE id = ANY(%(ids)s)
    RETURNING {_COLUMNS}
)
SELECT * FROM changed ORDER BY id
"""
MARK_RELEASED = f"""
WITH changed AS (UPDATE core.dead_letters SET replay_outcome = 'released' WHERE id = ANY(%(ids)s) RETURNING {_COLUMNS})
SELECT * FROM changed ORDER BY id
"""
# Replays whose republished message still waits in core.queue_messages: the reference queue, or the outbox of
# a queue on a broker before the relay published it (harness/queue/relay.py). Either way it will be delivered
# and handled. (Once relayed, the message is on the broker, where this read cannot see it.)
STILL_QUEUED = "SELECT DISTINCT replay_of FROM core.queue_messages WHERE replay_of = ANY(%(ids)s) ORDER BY replay_of"


DEFAULT_STATUS: Final = (
    "pending_review"  # what a list shows unless asked otherwise: the CLI's and the API's one default
)


@dataclass(frozen=True)
class ErrorGroup:
    """The dead letters that failed with one error (the first line of ``last_error``)."""

    error: str
    count: int
    queues: list[str]
    oldest: datetime
    newest: datetime
    latest_id: int  # the newest letter of the group: `dead-letters show` it


def list_dead_letters(
    conn: psycopg.Connection,
    *,
    queue: str | None = None,
    status: str | None = DEFAULT_STATUS,
    outstanding: bool = False,
    limit: int = 1000,
) -> list[DeadLetterRow]:
    """Dead letters, newest first, ``pending_review`` ones unless ``status`` says otherwise (None: every status),
    optionally of one queue, or only outstanding replays."""
    _check_status(status)
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        return cur.execute(
            LIST, {"queue": queue, "status": status, "outstanding": outstanding, "limit": limit}
        ).fetchall()


def error_groups(
    conn: psycopg.Connection, *, status: str | None = DEFAULT_STATUS, queue: str | None = None, limit: int = 100
) -> list[ErrorGroup]:
    """The dead letters grouped and counted by error, biggest group first (None ``status``: every status)."""
    _check_status(status)
    if limit < 1:
        raise OperationRefused([f"limit must be at least 1, got {limit}"])
    with conn.cursor(row_factory=class_row(ErrorGroup)) as cur:
        return cur.execute(ERROR_GROUPS, {"status": status, "queue": queue, "limit": limit}).fetchall()


def _check_status(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise OperationRefused([f"unknown status {status!r}; valid: {', '.join(STATUSES)}"])


def replay(
    conn: psycopg.Connection,
    ids: Sequence[int] = (),
    *,
    queue: str | None = None,
    operator: str,
    reason: str | None = None,
    max_rows: int | None = None,
) -> list[DeadLetterRow]:
    """Replay the given ids, or every pending dead letter of ``queue`` (at most ``max_rows``, required with it); the
    rows, replayed."""
    if bool(ids) == bool(queue):
        raise OperationRefused(["give dead-letter ids, or a queue to replay all its pending dead letters"])
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, queue, "replayed", max_rows)
        _refuse_undecodable(rows)
        if rows:
            _set_actor(conn, operator, reason)
            # Marked first: the API role may publish only the replay of a letter whose audit row
            # this transaction wrote (migration 0014's guard of core.queue_messages).
            rows = _mark(conn, MARK_REPLAYED, {"ids": [r.id for r in rows]})
            PgQueue(conn).publish_many(  # one statement for the lot, not one per message
                [
                    (
                        row.queue,
                        Envelope(
                            job_id=row.job_id,
                            payload=row.payload,
                            tenant_id=row.tenant_id or NO_TENANT,
                            correlation_id=row.correlation_id,
                            replay_of=row.id,
                            # The letter's trace, unchanged: the second attempt joins the first's trace
                            # (and the publish guard of migration 0017 holds the API role to it).
                            traceparent=row.traceparent,
                            tracestate=row.tracestate,
                        ),
                    )
                    for row in rows
                ]
            )
    return rows


def discard(
    conn: psycopg.Connection,
    ids: Sequence[int] = (),
    *,
    queue: str | None = None,
    operator: str,
    reason: str,
    max_rows: int | None = None,
) -> list[DeadLetterRow]:
    """Discard the given ids, or every pending dead letter of ``queue`` (at most ``max_rows``, required with it), with
    ``reason`` (J-AC7); the rows, discarded."""
    if not (reason or "").strip():
        raise OperationRefused(["a discard needs a non-blank --reason (J-AC7); nothing was discarded"])
    if bool(ids) == bool(queue):
        raise OperationRefused(
            ["give the ids of the dead letters to discard, or a queue to discard all its pending ones"]
        )
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, queue, "discarded", max_rows)
        _set_actor(conn, operator, reason.strip())
        return _mark(conn, MARK_DISCARDED, {"ids": [r.id for r in rows], "reason": reason.strip()})


def release(conn: psycopg.Connection, ids: Sequence[int], *, operator: str, reason: str) -> list[DeadLetterRow]:
    """Release the outstanding replays ``ids`` with ``reason`` (required); the rows, released.

    Only for a replay whose message will never be delivered: see the module docstring.
    """
    if not (reason or "").strip():
        raise OperationRefused(["a release needs a non-blank --reason; nothing was released"])
    if not ids:
        raise OperationRefused(["give the ids of the replayed dead letters to release"])
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, None, "released", None)
        queued = [r[0] for r in conn.execute(STILL_QUEUED, {"ids": [r.id for r in rows]})]
        if queued:
            raise OperationRefused(
                [
                    f"dead letter {i}: its replayed message still waits in the queue, and its"
                    " delivery will mark the replay handled"
                    for i in queued
                ]
                + ["nothing was changed"]
            )
        _set_actor(conn, operator, reason.strip())
        return _mark(conn, MARK_RELEASED, {"ids": [r.id for r in rows]})


def _lock(
    conn: psycopg.Connection, ids: Sequence[int], queue: str | None, action: str, max_rows: int | None
) -> list[DeadLetterRow]:
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        if queue is not None:
            if max_rows is None:  # the caller's cap, CORE_JOBS_DEAD_LETTERS_BULK_MAX: no default here to drift from it
                raise TypeError("a bulk action by filter needs max_rows (CORE_JOBS_DEAD_LETTERS_BULK_MAX)")
            rows = cur.execute(LOCK_PENDING_OF_QUEUE, {"queue": queue, "limit": max_rows + 1}).fetchall()
            if len(rows) > max_rows:
                (matched,) = conn.execute(COUNT_PENDING_OF_QUEUE, {"queue": queue}).fetchone()  # type: ignore[misc]
                raise OperationRefused(
                    [
                        f"{matched} pending dead letters match the filter, more than the {max_rows} one bulk action "
                        f"may touch (CORE_JOBS_DEAD_LETTERS_BULK_MAX): act by ids, or raise the cap deliberately",
                        "nothing was changed",
                    ],
                    matched=matched,
                    max_rows=max_rows,
                )
            return rows
        if len(set(ids)) > MAX_BULK_IDS:  # the API's request model has the same cap
            raise OperationRefused(
                [f"{len(set(ids))} ids given: one action may name at most {MAX_BULK_IDS}", "nothing was changed"]
            )
        rows = cur.execute(LOCK_BY_ID, {"ids": sorted(set(ids))}).fetchall()
    found = {r.id: r for r in rows}
    missing = [i for i in sorted(set(ids)) if i not in found]
    problems = [f"dead letter {i} does not exist" for i in missing]
    if action == "released":
        not_pending = {}
        problems += [
            f"dead letter {r.id} is {r.status}, not replayed: only an outstanding replay can be released"
            if r.status != "replayed"
            else f"dead letter {r.id}: its replay was already handled ({r.replay_outcome}), there is nothing to release"
            for r in rows
            if not r.outstanding
        ]
    else:
        not_pending = {r.id: r.status for r in rows if r.status != "pending_review"}
        problems += [
            f"dead letter {i} is {status}, not pending_review: only pending dead letters can be {action}"
            for i, status in not_pending.items()
        ]
    if problems:
        raise OperationRefused([*problems, "nothing was changed"], missing=missing, not_pending=not_pending)
    return rows


def _mark(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> list[DeadLetterRow]:
    """Run one of the MARK_* statements; the rows as it changed them."""
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        return cur.execute(statement, params).fetchall()


def _refuse_undecodable(rows: Sequence[DeadLetterRow]) -> None:
    """Refuse a replay of letters whose payload cannot be decoded: they would only be dead-lettered again."""
    bad = [r for r in rows if isinstance(r.payload, UndecodablePayload)]
    if bad:
        raise OperationRefused(
            [
                f"dead letter {r.id}: its payload cannot be decoded ({r.payload.reason}): a replay would only be"
                " dead-lettered again as poison; discard it"
                for r in bad
            ]
            + ["nothing was changed"],
            undecodable=[r.id for r in bad],
        )


def _set_actor(conn: psycopg.Connection, operator: str, reason: str | None) -> None:
    conn.execute(SET_ACTOR, {"operator": operator.strip(), "reason": (reason or "").strip()})


def _check_operator(operator: str) -> None:
    if not (operator or "").strip():
        raise OperationRefused(["the operator is unknown: no name was given"])  # each surface says how to give one


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a page lists: one status (default ``pending_review``) and any of the rest."""

    status: str = DEFAULT_STATUS
    queue: str | None = None
    consumer: str | None = None
    tenant_id: UUID | None = None
    job_id: UUID | None = None
    correlation_id: str | None = None
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive


@dataclass(frozen=True)
class Position:
    """Where a page ended: the last row's ``(created_at, id)``; the next page starts strictly after it."""

    created_at: datetime
    id: int


@dataclass(frozen=True)
class Page:
    rows: list[DeadLetterRow]
    next: Position | None  # None: this was the last page


@dataclass(frozen=True)
class Action:
    """One row of the audit ledger ``core.dead_letter_actions``."""

    id: int
    action: str
    operator: str
    reason: str | None
    acted_at: datetime


@dataclass(frozen=True)
class DeadLetterDetail:
    row: DeadLetterRow
    actions: list[Action]


# A keyset page, newest first, without payloads or tracebacks (the detail has them: a page of 500
# would carry and parse every one). Each absent filter folds away in the custom plan (executed
# unprepared, so never a generic plan), leaving an index range read backwards on one of
# 0009's (<filter>, status, created_at, id) indexes from the cursor on: page 100 costs page 1.
LIST_PAGE = f"""
SELECT {_COLUMNS.replace(" payload,", " NULL::jsonb AS payload,").replace(" traceback,", " NULL::text AS traceback,")}
  FROM core.dead_letters
 WHERE status = %(status)s
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
   AND (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s)
   AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s)
   AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
   AND (%(after_created_at)s::timestamptz IS NULL OR (created_at, id) < (%(after_created_at)s, %(after_id)s::bigint))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s
"""

GET_ONE = f"SELECT {_COLUMNS} FROM core.dead_letters WHERE id = %(id)s"
GET_ACTIONS = """
SELECT id, action, operator, reason, acted_at FROM core.dead_letter_actions WHERE dead_letter_id = %(id)s ORDER BY id
"""


def list_page(
    conn: psycopg.Connection,
    where: DeadLetterFilter = DeadLetterFilter(),
    *,
    after: Position | None = None,
    limit: int = 50,
) -> Page:
    """Up to ``limit`` dead letters matching ``where``, newest first, strictly after ``after``; ``payload`` is None."""
    if where.status not in STATUSES:
        raise OperationRefused([f"unknown status {where.status!r}; valid: {', '.join(STATUSES)}"])
    if limit < 1:
        raise OperationRefused([f"limit must be at least 1, got {limit}"])
    params = {
        **where.__dict__,
        "after_created_at": after.created_at if after else None,
        "after_id": after.id if after else None,
    }
    rows, more = fetch_page(conn, DeadLetterRow, LIST_PAGE, params, limit)
    return Page(rows=rows, next=Position(created_at=rows[-1].created_at, id=rows[-1].id) if more else None)


def get_row(conn: psycopg.Connection, dead_letter_id: int) -> DeadLetterRow | None:
    """One dead letter as it is now (no audit history); None when unknown."""
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        return cur.execute(GET_ONE, {"id": dead_letter_id}).fetchone()


def get_dead_letter(conn: psycopg.Connection, dead_letter_id: int) -> DeadLetterDetail | None:
    """One dead letter with its payload and its audit history (oldest action first); None when unknown."""
    row = get_row(conn, dead_letter_id)
    if row is None:
        return None
    with conn.cursor(row_factory=class_row(Action)) as cur:
        actions = cur.execute(GET_ACTIONS, {"id": dead_letter_id}).fetchall()
    return DeadLetterDetail(row=row, actions=actions)
