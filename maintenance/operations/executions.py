"""The read surface of durable-action executions: pages and the detail, for the CLI and the API.

``core-jobs executions list|show`` and ``GET /v1/core/executions[/{id}]`` both call this module,
so both show the same rows in the same order. It only reads; resolving an execution in
``RECONCILIATION_REQUIRED`` is an operator's resolution (R-5, ``POST /v1/core/executions/{id}/resolve``,
docs/durable-actions.md).

- **Pages** (:func:`list_executions`): always one status (default ``RECONCILIATION_REQUIRED``,
  what an operator triages), optionally one consumer, job id and business scope; **oldest
  ``status_changed_at`` first** — the execution that has waited longest in its state is the
  first to look at — in keyset order: each page continues strictly after the last row of the
  previous one, ``(status_changed_at, id) > (position)``, read on ``executions_status_idx``
  ``(status, status_changed_at, id)`` (0010), so page 100 costs what page 1 costs. A row that
  enters the state while an operator pages sorts after the rows already there: it shows up on
  a later page, and no row is repeated or skipped. (``status_changed_at`` is the start of the
  transaction that moved it: only one still open when the walk already passed that moment could
  land behind the cursor — a worker's transactions last milliseconds. A row that leaves the
  state and comes back meanwhile is listed again, at the time it came back: a new stay.) Pages
  carry no payload; the detail has it.
- **Business scopes**: both take the reader's ``scopes``. The API passes the token's
  ``business_scopes`` claim: a reader sees only the executions of those scopes — another scope's
  (or an unscoped one's, of a consumer declaring none) is absent from pages and its detail is
  None, the same as a missing id, so a payload never crosses scopes and nobody learns what another
  scope holds (as for a resolution, maintenance/operations/resolution.py). The CLI passes None: it runs with
  the database's credentials, which read every row anyway.
- **Detail** (:func:`get_execution`): one execution with its payload, its checkpoints in
  action order (effect, status, attempts, result, last error, started/finished, and the
  external key the action sends, ``job_id:consumer:action``, to look the write up at the
  provider) and its history events, oldest first — read in **one statement**, so the row, its
  checkpoints and its events are one snapshot even while a worker writes.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from harness.consumer.actions import idempotency_key
from harness.enumerations import EXECUTION_STATUSES
from harness.queue.port import decode_payload
from maintenance.operations.dead_letters import OperationRefused
from maintenance.operations.keyset import fetch_page

__all__ = [
    "EXECUTION_STATUSES",
    "Checkpoint",
    "ExecutionDetail",
    "ExecutionEvent",
    "ExecutionFilter",
    "ExecutionPage",
    "ExecutionPosition",
    "ExecutionRow",
    "get_execution",
    "list_executions",
]

DEFAULT_STATUS = "RECONCILIATION_REQUIRED"


@dataclass(frozen=True)
class ExecutionRow:
    """An execution as a page lists it: its state and why, without its payload."""

    id: int
    job_id: UUID
    consumer: str
    queue: str
    tenant_id: UUID
    correlation_id: str | None
    business_scope: str | None
    status: str
    reason: str | None
    reason_action: str | None
    takes: int
    fencing_token: int
    run_at: datetime
    lease_expires_at: datetime | None
    leased_by: str | None
    created_at: datetime
    status_changed_at: datetime


@dataclass(frozen=True)
class Checkpoint:
    """One action's checkpoint; ``idempotency_key`` is what the action sends its provider (R-3)."""

    action: str
    position: int
    effect: str
    status: str
    attempts: int
    result: Any  # an UndecodablePayload when Python cannot decode it (maintenance/operations/stored.py)
    last_error: str | None
    fencing_token: int
    started_at: datetime
    finished_at: datetime | None
    idempotency_key: str


@dataclass(frozen=True)
class ExecutionEvent:
    """One entry of the execution's history (``core.execution_events``)."""

    id: int
    kind: str
    action: str | None
    attempt: int | None
    fencing_token: int
    run_at: datetime | None
    detail: str | None
    at: datetime


@dataclass(frozen=True)
class ExecutionDetail:
    row: ExecutionRow
    payload: Any  # an UndecodablePayload when Python cannot decode it (maintenance/operations/stored.py)
    checkpoints: list[Checkpoint]
    events: list[ExecutionEvent]


@dataclass(frozen=True)
class ExecutionFilter:
    """Which executions a page lists: one status (default ``RECONCILIATION_REQUIRED``) and any of the rest."""

    status: str = DEFAULT_STATUS
    consumer: str | None = None
    job_id: UUID | None = None
    business_scope: str | None = None


@dataclass(frozen=True)
class ExecutionPosition:
    """Where a page ended: the last row's ``(status_changed_at, id)``; the next page starts strictly after it."""

    status_changed_at: datetime
    id: int


@dataclass(frozen=True)
class ExecutionPage:
    rows: list[ExecutionRow]
    next: ExecutionPosition | None  # None: this was the last page


_COLUMNS = (
    "id, job_id, consumer, queue, tenant_id, correlation_id, business_scope, status, reason, reason_action,"
    " takes, fencing_token, run_at, lease_expires_at, leased_by, created_at, status_changed_at"
)

# A keyset page, oldest in its state first. Each absent filter folds away in the custom plan
# (executed unprepared, so never a generic plan), leaving a forward range read of
# executions_status_idx (status, status_changed_at, id) from the cursor on; a job_id goes to
# the (job_id, consumer) unique index instead.
LIST_PAGE = f"""
SELECT {_COLUMNS}
  FROM core.executions
 WHERE status = %(status)s
   AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
   AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s)
   AND (%(business_scope)s::text IS NULL OR business_scope = %(business_scope)s)
   AND (%(scopes)s::text[] IS NULL OR business_scope = ANY(%(scopes)s::text[]))
   AND (%(after_at)s::timestamptz IS NULL
        OR (status_changed_at, id) > (%(after_at)s, %(after_id)s::bigint))
 ORDER BY status_changed_at, id
 LIMIT %(limit)s
"""

# One execution, its payload, its checkpoints (action order) and its events (oldest first), in
# one statement: one snapshot, however a worker writes meanwhile. Each result travels as its
# text, decoded on its own (decode_payload): one that Python cannot read is shown as such, and
# the nesting it adds inside the aggregate cannot make the whole detail unreadable. No row: the
# id is unknown, or the execution is of a business scope outside the reader's (the same answer:
# nothing leaks).
GET_DETAIL = f"""
SELECT {_COLUMNS}, payload,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'action', c.action, 'position', c.position, 'effect', c.effect, 'status', c.status,
                     'attempts', c.attempts, 'result', c.result::text, 'last_error', c.last_error,
                     'fencing_token', c.fencing_token, 'started_at', c.started_at, 'finished_at', c.finished_at)
                     ORDER BY c.position, c.action)
                   FROM core.execution_checkpoints AS c WHERE c.execution_id = e.id), '[]') AS checkpoints,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', v.id, 'kind', v.kind, 'action', v.action, 'attempt', v.attempt,
                     'fencing_token', v.fencing_token, 'run_at', v.run_at, 'detail', v.detail, 'at', v.at)
                     ORDER BY v.id)
                   FROM core.execution_events AS v WHERE v.execution_id = e.id), '[]') AS events
  FROM core.executions AS e
 WHERE e.id = %(id)s
   AND (%(scopes)s::text[] IS NULL OR e.business_scope = ANY(%(scopes)s::text[]))
"""


def list_executions(
    conn: psycopg.Connection,
    where: ExecutionFilter = ExecutionFilter(),
    after: ExecutionPosition | None = None,
    limit: int = 50,
    *,
    scopes: Collection[str] | None = None,
) -> ExecutionPage:
    """Up to ``limit`` executions matching ``where``, oldest in their state first, strictly after ``after``.

    ``scopes``: only executions of these business scopes (an API reader's); None: every one (the CLI's).
    """
    if where.status not in EXECUTION_STATUSES:
        raise OperationRefused([f"unknown execution status {where.status!r}; valid: {', '.join(EXECUTION_STATUSES)}"])
    if limit < 1:
        raise OperationRefused([f"limit must be at least 1, got {limit}"])
    params = {
        **where.__dict__,
        "scopes": _scope_list(scopes),
        "after_at": after.status_changed_at if after else None,
        "after_id": after.id if after else None,
    }
    rows, more = fetch_page(conn, ExecutionRow, LIST_PAGE, params, limit)
    last = ExecutionPosition(status_changed_at=rows[-1].status_changed_at, id=rows[-1].id) if more else None
    return ExecutionPage(rows=rows, next=last)


def get_execution(
    conn: psycopg.Connection, execution_id: int, *, scopes: Collection[str] | None = None
) -> ExecutionDetail | None:
    """One execution with its payload, checkpoints and history; None when there is none with that id.

    ``scopes``: None too when it is of a business scope outside these (an API reader's); None: any.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(GET_DETAIL, {"id": execution_id, "scopes": _scope_list(scopes)}).fetchone()
    if found is None:
        return None
    payload, checkpoints, events = found.pop("payload"), found.pop("checkpoints"), found.pop("events")
    row = ExecutionRow(**found)
    return ExecutionDetail(
        row=row,
        payload=payload,
        checkpoints=[
            Checkpoint(
                **_with_times(c, "started_at", "finished_at")
                | {"result": decode_payload(c["result"]) if c["result"] is not None else None},
                idempotency_key=idempotency_key(row.job_id, row.consumer, c["action"]),
            )
            for c in checkpoints
        ],
        events=[ExecutionEvent(**_with_times(v, "run_at", "at")) for v in events],
    )


def _scope_list(scopes: Collection[str] | None) -> list[str] | None:
    return None if scopes is None else sorted(scopes)


def _with_times(item: dict[str, Any], *names: str) -> dict[str, Any]:
    """``item`` with its timestamps (ISO-8601 text inside jsonb, offset included) as datetimes again."""
    return item | {n: datetime.fromisoformat(item[n]) if item[n] is not None else None for n in names}
