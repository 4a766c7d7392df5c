"""Operator actions on dead letters: list, replay, discard — in bulk, audited (J-B6, J-B8).

- **Replay** republishes each dead letter to its queue with the **same job_id** (and its
  payload, tenant and correlation id) and marks it ``replayed``, in one transaction: a replayed
  job whose work already succeeded elsewhere is absorbed by the fence, so replay is safe in
  bulk (J-AC5). The republished message starts a fresh attempt budget.
- **Discard** marks each dead letter ``discarded`` with a reason; a blank reason is refused
  before anything is touched (the database refuses it too, J-AC7).
- Both act on every id given or on none: any id that does not exist or is not
  ``pending_review`` refuses the whole request (:class:`OperationRefused`), nothing changed.
- Both are written to ``core.dead_letter_actions``, the append-only audit ledger, by a
  database trigger on the status change: who (the ``operator`` given here, set as the
  transaction's ``core_jobs.operator``), when, what, and the reason. The ledger is complete
  even for changes made from psql.
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

__all__ = ["DeadLetterRow", "OperationRefused", "discard", "list_dead_letters", "replay"]

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


_COLUMNS = ("id, job_id, queue, consumer, status, attempts, last_error, correlation_id, tenant_id, payload,"
            " discard_reason, created_at, status_changed_at")

LIST = f"""
SELECT {_COLUMNS}
  FROM core.dead_letters
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
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

SET_ACTOR = "SELECT set_config('core_jobs.operator', %(operator)s, true), set_config('core_jobs.reason', %(reason)s, true)"
MARK_REPLAYED = "UPDATE core.dead_letters SET status = 'replayed' WHERE id = ANY(%(ids)s)"
MARK_DISCARDED = "UPDATE core.dead_letters SET status = 'discarded', discard_reason = %(reason)s WHERE id = ANY(%(ids)s)"


def list_dead_letters(conn: psycopg.Connection, *, queue: str | None = None, status: str | None = None,
                      limit: int = 1000) -> list[DeadLetterRow]:
    """Dead letters, oldest first, optionally of one queue and/or one status."""
    if status is not None and status not in STATUSES:
        raise OperationRefused([f"unknown status {status!r}; valid: {', '.join(STATUSES)}"])
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        return cur.execute(LIST, {"queue": queue, "status": status, "limit": limit}).fetchall()


def replay(conn: psycopg.Connection, ids: Sequence[int] = (), *, queue: str | None = None,
           operator: str, reason: str | None = None) -> list[DeadLetterRow]:
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
                envelope = Envelope(job_id=row.job_id, payload=row.payload,
                                    tenant_id=row.tenant_id or NO_TENANT, correlation_id=row.correlation_id)
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


def _lock(conn: psycopg.Connection, ids: Sequence[int], queue: str | None, action: str) -> list[DeadLetterRow]:
    with conn.cursor(row_factory=class_row(DeadLetterRow)) as cur:
        if queue is not None:
            return cur.execute(LOCK_PENDING_OF_QUEUE, {"queue": queue}).fetchall()
        rows = cur.execute(LOCK_BY_ID, {"ids": sorted(set(ids))}).fetchall()
    found = {r.id: r for r in rows}
    problems = [f"dead letter {i} does not exist" for i in sorted(set(ids)) if i not in found]
    problems += [
        f"dead letter {r.id} is {r.status}, not pending_review: only pending dead letters can be {action}"
        for r in rows if r.status != "pending_review"
    ]
    if problems:
        raise OperationRefused(problems + ["nothing was changed"])
    return rows


def _set_actor(conn: psycopg.Connection, operator: str, reason: str | None) -> None:
    conn.execute(SET_ACTOR, {"operator": operator.strip(), "reason": (reason or "").strip()})


def _check_operator(operator: str) -> None:
    if not (operator or "").strip():
        raise OperationRefused(["the operator is unknown: pass --operator NAME (or set $USER)"])
