"""Operator actions on dead letters: list, replay, discard, release — in bulk, audited (J-B6, J-B8).

- **Replay** republishes each dead letter to its queue with the **same job_id** (and its
  payload, tenant and correlation id) and marks it ``replayed``, in one transaction: a replayed
  job whose work already succeeded elsewhere is absorbed by the fence, so replay is safe in
  bulk (J-AC5). The republished message starts a fresh attempt budget and carries
  ``replay_of`` = the dead letter's id. The replay is then *outstanding* (``replay_outcome``
  NULL) until the harness handles that delivery with a final outcome; meanwhile the purge keeps
  the job's fences, however long the message waits (harness/queue.py, "Replays").
- **Discard** marks each dead letter ``discarded`` with a reason; a blank reason is refused
  before anything is touched (the database refuses it too, J-AC7).
- **Release** ends the outstanding state of replays whose delivery will never be handled (the
  broker lost the message, or it was deleted by hand): ``replay_outcome = 'released'``, with a
  required reason. The fences are then kept margin x retry window more, like after a handled
  delivery, and then purged normally — so release only a replay whose message is truly gone: a
  later delivery could apply the work twice. A replay whose message still waits in the
  reference queue is refused (it will be handled).
- Replay and discard act on ``pending_review`` dead letters, release on outstanding replays; each
  acts on every id given or on none: an id that does not exist or is in the wrong state refuses
  the whole request (:class:`OperationRefused`), nothing changed.
- All three are written to ``core.dead_letter_actions``, the append-only audit ledger, by
  database triggers on the change: who (the ``operator`` given here, set as the transaction's
  ``core_jobs.operator``), when, what, and the reason. The ledger is complete even for changes
  made from psql.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from harness.pgqueue import PgQueue
from harness.queue import NO_TENANT, Envelope

__all__ = ["DeadLetterRow", "OperationRefused", "discard", "list_dead_letters", "release", "replay"]

STATUSES = ("pending_review", "replayed", "discarded")


class OperationRefused(Exception):
    """The request was refused as a whole; nothing changed. One problem per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class DeadLetterRow:
    id: int
    job_id: UUID
    queue: str
    consumer: str | None
    status: str
    attempts: int
    last_error: str
    correlation_id: str | None
    tenant_id: UUID | None
    payload: Any
    discard_reason: str | None
    created_at: datetime
    status_changed_at: datetime | None
    replay_outcome: str | None  # NULL on a replayed letter: its delivery is outstanding
    replay_handled_at: datetime | None

    @property
    def outstanding(self) -> bool:
        """Replayed, and the republished delivery not handled yet: the job's fences are held."""
        return self.status == "replayed" and self.replay_outcome is None


_COLUMNS = (
    "id, job_id, queue, consumer, status, attempts, last_error, correlation_id, tenant_id, payload,"
    " discard_reason, created_at, status_changed_at, replay_outcome, replay_handled_at"
)

LIST = f"""
SELECT {_COLUMNS}
  FROM core.dead_letters
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (NOT %(outstanding)s OR (status = 'replayed' AND replay_outcome IS NULL))
 ORDER BY created_at, id
 LIMIT %(limit)s
"""

# The rows an action targets, locked so that two operators cannot act on one letter at once —
# both in id order, so that a replay by ids and one of a whole queue cannot deadlock.
LOCK_BY_ID = f"SELECT {_COLUMNS} FROM core.dead_letters WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE"
LOCK_PENDING_OF_QUEUE = f"""
SELECT {_COLUMNS} FROM core.dead_letters
 WHERE queue = %(queue)s AND status = 'pending_review'
 ORDER BY id
   FOR UPDATE
"""

SET_ACTOR = (
    "SELECT set_config('core_jobs.operator', %(operator)s, true), set_config('core_jobs.reason', %(reason)s, true)"
)
MARK_REPLAYED = "UPDATE core.dead_letters SET status = 'replayed' WHERE id = ANY(%(ids)s)"
MARK_DISCARDED = (
    "UPDATE core.dead_letters SET status = 'discarded', discard_reason = %(reason)s WHERE id = ANY(%(ids)s)"
)
MARK_RELEASED = "UPDATE core.dead_letters SET replay_outcome = 'released' WHERE id = ANY(%(ids)s)"
# Replays whose republished message still waits in the reference queue: they will be handled.
STILL_QUEUED = "SELECT DISTINCT replay_of FROM core.queue_messages WHERE replay_of = ANY(%(ids)s) ORDER BY replay_of"


def list_dead_letters(
    conn: psycopg.Connection,
    *,
    queue: str | None = None,
    status: str | None = None,
    outstanding: bool = False,
    limit: int = 1000,
) -> list[DeadLetterRow]:
    """Dead letters, oldest first, optionally of one queue and/or one status, or only outstanding replays."""
    if status is not None and status not in STATUSES:
        raise OperationRefused([f"unknown status {status!r}; valid: {', '.join(STATUSES)}"])
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        return cur.execute(
            LIST, {"queue": queue, "status": status, "outstanding": outstanding, "limit": limit}
        ).fetchall()


def replay(
    conn: psycopg.Connection,
    ids: Sequence[int] = (),
    *,
    queue: str | None = None,
    operator: str,
    reason: str | None = None,
) -> list[DeadLetterRow]:
    """Replay the given ids, or every pending dead letter of ``queue``; return the rows replayed."""
    if bool(ids) == bool(queue):
        raise OperationRefused(["give dead-letter ids, or a queue to replay all its pending dead letters"])
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, queue, "replayed")
        if rows:
            _set_actor(conn, operator, reason)
            publisher = PgQueue(conn)
            for row in rows:
                envelope = Envelope(
                    job_id=row.job_id,
                    payload=row.payload,
                    tenant_id=row.tenant_id or NO_TENANT,
                    correlation_id=row.correlation_id,
                    replay_of=row.id,
                )
                publisher.publish(row.queue, envelope)
            conn.execute(MARK_REPLAYED, {"ids": [r.id for r in rows]})
    return rows


def discard(conn: psycopg.Connection, ids: Sequence[int], *, operator: str, reason: str) -> list[DeadLetterRow]:
    """Discard the given ids with ``reason`` (required, J-AC7); return the rows discarded."""
    if not (reason or "").strip():
        raise OperationRefused(["a discard needs a non-blank --reason (J-AC7); nothing was discarded"])
    if not ids:
        raise OperationRefused(["give the ids of the dead letters to discard"])
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, None, "discarded")
        _set_actor(conn, operator, reason.strip())
        conn.execute(MARK_DISCARDED, {"ids": [r.id for r in rows], "reason": reason.strip()})
    return rows


def release(conn: psycopg.Connection, ids: Sequence[int], *, operator: str, reason: str) -> list[DeadLetterRow]:
    """Release the outstanding replays ``ids`` with ``reason`` (required); return the rows released.

    Only for a replay whose message will never be delivered: see the module docstring.
    """
    if not (reason or "").strip():
        raise OperationRefused(["a release needs a non-blank --reason; nothing was released"])
    if not ids:
        raise OperationRefused(["give the ids of the replayed dead letters to release"])
    _check_operator(operator)
    with conn.transaction():
        rows = _lock(conn, ids, None, "released")
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
        conn.execute(MARK_RELEASED, {"ids": [r.id for r in rows]})
    return rows


def _lock(conn: psycopg.Connection, ids: Sequence[int], queue: str | None, action: str) -> list[DeadLetterRow]:
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        if queue is not None:
            return cur.execute(LOCK_PENDING_OF_QUEUE, {"queue": queue}).fetchall()
        rows = cur.execute(LOCK_BY_ID, {"ids": sorted(set(ids))}).fetchall()
    found = {r.id: r for r in rows}
    problems = [f"dead letter {i} does not exist" for i in sorted(set(ids)) if i not in found]
    if action == "released":
        problems += [
            f"dead letter {r.id} is {r.status}, not replayed: only an outstanding replay can be released"
            if r.status != "replayed"
            else f"dead letter {r.id}: its replay was already handled ({r.replay_outcome}), there is nothing to release"
            for r in rows
            if not r.outstanding
        ]
    else:
        problems += [
            f"dead letter {r.id} is {r.status}, not pending_review: only pending dead letters can be {action}"
            for r in rows
            if r.status != "pending_review"
        ]
    if problems:
        raise OperationRefused([*problems, "nothing was changed"])
    return rows


def _set_actor(conn: psycopg.Connection, operator: str, reason: str | None) -> None:
    conn.execute(SET_ACTOR, {"operator": operator.strip(), "reason": (reason or "").strip()})


def _check_operator(operator: str) -> None:
    if not (operator or "").strip():
        raise OperationRefused(["the operator is unknown: pass --operator NAME (or set $USER)"])
