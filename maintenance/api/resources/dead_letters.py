"""The dead letters of the operations API: thin HTTP over :mod:`maintenance.operations.dead_letters`.

Each route authenticates (its one permission), validates the request, calls the operations
layer that the CLI's ``dead-letters`` commands call too, and turns its answer (or its
:class:`~maintenance.operations.dead_letters.OperationRefused`) into JSON or a problem
(:func:`_refusal`: 404, 409 or 422). The four actions take one path (:func:`_act`) through the
idempotency ledger (:func:`maintenance.api.dependencies.run_idempotent`) and answer the rows as the
action left them; the operator is the token's ``sub``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import psycopg
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from psycopg_pool import ConnectionPool
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from harness.enumerations import DeadLetterAction, DeadLetterStatus, ReplayOutcome
from maintenance.api import pages
from maintenance.api.auth import Principal
from maintenance.api.dependencies import (
    ACTION_ERRORS,
    AUTH_ERRORS,
    DEFAULT_LIMIT,
    MAX_ID,
    MAX_LIMIT,
    Discarder,
    IdempotencyKey,
    PoolDep,
    Reader,
    Replayer,
    Text,
    Timestamp,
    UndecodableOut,
    run_idempotent,
    storable,
)
from maintenance.api.problems import Problem, problem_responses
from maintenance.operations import dead_letters as operations
from maintenance.operations.dead_letters import (
    DEFAULT_STATUS,
    MAX_BULK_IDS,
    DeadLetterFilter,
    DeadLetterRow,
    OperationRefused,
    Position,
)
from maintenance.operations.stored import shown

MAX_REASON_CHARS = 1000
LIST_PARAMETERS = frozenset(
    {
        "status",
        "queue",
        "consumer",
        "tenant_id",
        "job_id",
        "correlation_id",
        "created_after",
        "created_before",
        "cursor",
        "limit",
    }
)
ERROR_GROUP_PARAMETERS = frozenset({"status", "queue", "limit"})


Reason = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_CHARS), AfterValidator(storable)
]
DeadLetterId = Annotated[int, Field(ge=1, le=MAX_ID)]
Status = DeadLetterStatus


# --- response bodies --------------------------------------------------------------------------
class DeadLetterOut(BaseModel):
    """A dead letter, without its payload (the detail has it)."""

    id: int
    job_id: UUID
    queue: str
    consumer: str | None
    tenant_id: UUID | None
    status: Status
    attempts: int
    last_error: str
    correlation_id: str | None
    discard_reason: str | None
    created_at: datetime
    status_changed_at: datetime | None
    replay_outcome: ReplayOutcome | None = Field(
        description="Set once the replayed delivery was handled (or released); "
        "null on a replayed dead letter means its replay is outstanding."
    )
    replay_handled_at: datetime | None

    @classmethod
    def of(cls, row: DeadLetterRow) -> DeadLetterOut:
        # The row's types are the database's, already what the model declares: no second validation.
        return cls.model_construct(**{name: getattr(row, name) for name in DeadLetterOut.model_fields})


class ActionOut(BaseModel):
    """One entry of the audit ledger: who replayed, discarded or released it, when, why."""

    action: DeadLetterAction
    operator: str
    reason: str | None
    acted_at: datetime


class DeadLetterDetailOut(DeadLetterOut):
    traceback: str | None = Field(
        description="The failure's stack trace (frames with their source lines, chained causes; credentials "
        "masked, never a frame's locals; at most 8 000 characters, the middle cut); null when it has none (a "
        "poison payload, a letter written before migration 0022). last_error is its one-line summary."
    )
    payload: Any = Field(
        description="The job's full payload, as the consumer received it; null when it cannot be decoded "
        "(payload_undecodable)."
    )
    payload_undecodable: UndecodableOut | None = Field(
        description="Set only when the stored payload cannot be decoded (too deep, an integer over 4 300 digits): "
        "its text as stored and why. Such a dead letter cannot be replayed (422 undecodable-payload): discard it."
    )
    actions: list[ActionOut] = Field(description="The audit history, oldest first.")


class PageOut(BaseModel):
    items: list[DeadLetterOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")
    limit: int


class ErrorGroupOut(BaseModel):
    """The dead letters that failed with one error: the first line of their ``last_error``."""

    error: str
    count: int
    queues: list[str]
    oldest: datetime
    newest: datetime
    latest_id: int = Field(description="The newest dead letter of the group: GET /v1/core/dead-letters/{id}.")


class ErrorGroupsOut(BaseModel):
    items: list[ErrorGroupOut] = Field(description="Biggest group first, then the most recent.")
    limit: int


class BulkOut(BaseModel):
    action: DeadLetterAction
    count: int
    ids: list[int]


# --- request bodies ---------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplayIn(_Body):
    reason: Reason | None = Field(default=None, description="Why, for the audit ledger (optional).")


class DiscardIn(_Body):
    reason: Reason = Field(description="Why it must never run (required, non-blank; J-AC7).")


class BulkFilterIn(_Body):
    queue: Text
    status: Literal["pending_review"] = "pending_review"


class _BulkIn(_Body):
    ids: list[DeadLetterId] | None = Field(
        default=None, min_length=1, max_length=MAX_BULK_IDS, description=f"Up to {MAX_BULK_IDS} dead-letter ids."
    )
    filter: BulkFilterIn | None = Field(
        default=None, description="Instead of ids: every pending dead letter of a queue."
    )

    @model_validator(mode="after")
    def _ids_or_filter(self) -> _BulkIn:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give either ids or filter, not both")
        return self


class BulkReplayIn(_BulkIn):
    reason: Reason | None = None


class BulkDiscardIn(_BulkIn):
    reason: Reason


# --- the cursor (maintenance/api/pages.py) ----------------------------------------------------
def encode_cursor(position: Position, where: DeadLetterFilter) -> str:
    return pages.encode_position(position.created_at, position.id, where)


def decode_cursor(cursor: str, where: DeadLetterFilter) -> Position:
    """The position a cursor encodes; 400 when it is not one of ours or belongs to other filters."""
    created_at, dead_letter_id = pages.decode_position(cursor, where)
    return Position(created_at=created_at, id=dead_letter_id)


def _refusal(exc: OperationRefused) -> Problem:
    if exc.undecodable:
        return Problem(
            422,
            "undecodable-payload",
            "; ".join(exc.problems),
            undecodable_ids=exc.undecodable,
        )
    if exc.matched is not None:
        return Problem(
            422,
            "filter-too-broad",
            f"the filter matches {exc.matched} pending dead letters, more than the {exc.max_rows} one bulk action "
            "may touch (CORE_JOBS_DEAD_LETTERS_BULK_MAX); act by ids or narrow it; nothing was changed",
            matched=exc.matched,
            max=exc.max_rows,
        )
    if exc.missing:
        return Problem(
            404,
            "dead-letter-not-found",
            f"no dead letter with id {', '.join(map(str, exc.missing))}; nothing was changed",
            recorded=True,  # the action's own answer: the idempotency ledger keeps it like a success
            missing_ids=exc.missing,
        )
    if exc.not_pending:
        if len(exc.not_pending) == 1:
            ((dead_letter_id, status),) = exc.not_pending.items()
            return Problem(
                409,
                "not-pending-review",
                f"dead letter {dead_letter_id} is {status}, not pending_review; nothing was changed",
                recorded=True,
                id=dead_letter_id,
                current_status=status,
            )
        return Problem(
            409,
            "not-pending-review",
            f"{len(exc.not_pending)} dead letters are not pending_review; nothing was changed",
            recorded=True,
            not_pending=[{"id": i, "current_status": s} for i, s in exc.not_pending.items()],
        )
    return Problem(422, "invalid-request", "; ".join(exc.problems))


_json = pages.as_json


router = APIRouter(prefix="/v1/core/dead-letters", tags=["dead letters"])


@router.get(
    "",
    response_model=PageOut,
    responses=problem_responses(*AUTH_ERRORS),
    summary="List dead letters, newest first, one keyset page at a time",
)
def list_dead_letters(
    request: Request,
    principal: Reader,
    pool: PoolDep,
    status: Annotated[Status, Query()] = DEFAULT_STATUS,
    queue: Annotated[Text | None, Query()] = None,
    consumer: Annotated[Text | None, Query()] = None,
    tenant_id: Annotated[UUID | None, Query()] = None,
    job_id: Annotated[UUID | None, Query()] = None,
    correlation_id: Annotated[Text | None, Query()] = None,
    created_after: Annotated[Timestamp | None, Query(description="Inclusive, with a time zone.")] = None,
    created_before: Annotated[Timestamp | None, Query(description="Exclusive, with a time zone.")] = None,
    cursor: Annotated[str | None, Query(max_length=500, description="next_cursor of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> Response:
    pages.refuse_unknown_parameters(request, LIST_PARAMETERS)
    where = DeadLetterFilter(
        status=status,
        queue=queue,
        consumer=consumer,
        tenant_id=tenant_id,
        job_id=job_id,
        correlation_id=correlation_id,
        created_after=created_after,
        created_before=created_before,
    )
    after = decode_cursor(cursor, where) if cursor is not None else None
    with pool.connection() as conn:
        page = operations.list_page(conn, where, after=after, limit=limit)
    return _json(
        PageOut(
            items=[DeadLetterOut.of(r) for r in page.rows],
            limit=limit,
            next_cursor=encode_cursor(page.next, where) if page.next else None,
        )
    )


@router.get(
    "/errors",
    response_model=ErrorGroupsOut,
    responses=problem_responses(*AUTH_ERRORS),
    summary="Dead letters grouped and counted by error, biggest group first",
)
def list_error_groups(
    request: Request,
    principal: Reader,
    pool: PoolDep,
    status: Annotated[Status, Query()] = DEFAULT_STATUS,
    queue: Annotated[Text | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> Response:
    pages.refuse_unknown_parameters(request, ERROR_GROUP_PARAMETERS)
    with pool.connection() as conn:
        groups = operations.error_groups(conn, status=status, queue=queue, limit=limit)
    return _json(
        ErrorGroupsOut(items=[ErrorGroupOut.model_validate(g, from_attributes=True) for g in groups], limit=limit)
    )


@router.get(
    "/{id:int}",
    response_model=DeadLetterDetailOut,
    responses=problem_responses(*AUTH_ERRORS, 404),
    summary="One dead letter with its payload and audit history",
)
def get_dead_letter(principal: Reader, pool: PoolDep, id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> Response:
    with pool.connection() as conn:
        detail = operations.get_dead_letter(conn, id)
    if detail is None:
        raise Problem(404, "dead-letter-not-found", f"no dead letter with id {id}", missing_ids=[id])
    return _json(
        DeadLetterDetailOut(
            **DeadLetterOut.of(detail.row).model_dump(),
            traceback=detail.row.traceback,
            **shown("payload", detail.row.payload),
            actions=[ActionOut.model_validate(a, from_attributes=True) for a in detail.actions],
        )
    )


def _act(
    request: Request,
    pool: ConnectionPool,
    principal: Principal,
    key: str | None,
    body: ReplayIn | DiscardIn | BulkReplayIn | BulkDiscardIn,
    operation: Callable[..., list[DeadLetterRow]],
    ids: Sequence[int],
    answer: Callable[[list[DeadLetterRow]], dict[str, Any]],
    *,
    queue: str | None = None,
) -> Response:
    """Every action: ``operation`` (replay or discard) on ``ids`` or every pending letter of ``queue``, all or
    nothing, idempotent per key; ``answer`` makes the body of the rows as the operation left them."""

    def action(conn: psycopg.Connection) -> tuple[int, dict[str, Any]]:
        try:
            rows = operation(
                conn,
                ids,
                queue=queue,
                operator=principal.subject,
                reason=body.reason,
                max_rows=request.app.state.bulk_max,
            )
        except OperationRefused as exc:
            raise _refusal(exc) from None
        return 200, answer(rows)

    return run_idempotent(request, pool, principal, key, body, action)


def _one(rows: list[DeadLetterRow]) -> dict[str, Any]:
    (row,) = rows
    return DeadLetterOut.of(row).model_dump(mode="json")


def _bulk(verb: DeadLetterAction) -> Callable[[list[DeadLetterRow]], dict[str, Any]]:
    return lambda rows: BulkOut(action=verb, count=len(rows), ids=[r.id for r in rows]).model_dump()


@router.post(
    "/replay",
    response_model=BulkOut,
    responses=problem_responses(*ACTION_ERRORS),
    summary="Replay up to 1 000 dead letters, or every pending one of a queue: all or nothing",
)
def replay_many(
    request: Request, principal: Replayer, pool: PoolDep, body: BulkReplayIn, idempotency_key: IdempotencyKey = None
) -> Response:
    queue = body.filter.queue if body.filter else None
    return _act(
        request,
        pool,
        principal,
        idempotency_key,
        body,
        operations.replay,
        body.ids or (),
        _bulk("replayed"),
        queue=queue,
    )


@router.post(
    "/discard",
    response_model=BulkOut,
    responses=problem_responses(*ACTION_ERRORS),
    summary="Discard up to 1 000 dead letters, or every pending one of a queue, with a reason: all or nothing",
)
def discard_many(
    request: Request, principal: Discarder, pool: PoolDep, body: BulkDiscardIn, idempotency_key: IdempotencyKey = None
) -> Response:
    queue = body.filter.queue if body.filter else None
    return _act(
        request,
        pool,
        principal,
        idempotency_key,
        body,
        operations.discard,
        body.ids or (),
        _bulk("discarded"),
        queue=queue,
    )


@router.post(
    "/{id:int}/replay",
    response_model=DeadLetterOut,
    responses=problem_responses(*ACTION_ERRORS),
    summary="Republish one dead letter with the same job_id (J-B6); only from pending_review",
)
def replay_one(
    request: Request,
    principal: Replayer,
    pool: PoolDep,
    id: Annotated[int, Path(ge=1, le=MAX_ID)],
    body: ReplayIn | None = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    return _act(request, pool, principal, idempotency_key, body or ReplayIn(), operations.replay, [id], _one)


@router.post(
    "/{id:int}/discard",
    response_model=DeadLetterOut,
    responses=problem_responses(*ACTION_ERRORS),
    summary="Discard one dead letter with a reason (J-AC7); only from pending_review",
)
def discard_one(
    request: Request,
    principal: Discarder,
    pool: PoolDep,
    id: Annotated[int, Path(ge=1, le=MAX_ID)],
    body: DiscardIn,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    return _act(request, pool, principal, idempotency_key, body, operations.discard, [id], _one)
