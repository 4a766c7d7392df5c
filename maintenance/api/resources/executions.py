"""The operations API's executions endpoints: thin HTTP over :mod:`maintenance.operations.executions`.

============================== ======================== ==============================================
endpoint                       permission               what
============================== ======================== ==============================================
``GET /v1/core/executions``    ``core.executions.read`` one ``status`` (default
                                                        ``RECONCILIATION_REQUIRED``), oldest in it
                                                        first; filters ``consumer``, ``job_id``,
                                                        ``business_scope``; ``limit`` (50, at most
                                                        500); ``cursor`` = the previous page's
                                                        ``next_cursor`` (keyset, as for dead letters)
``GET /v1/core/executions/{id}`` ``core.executions.read`` one, with payload, checkpoints and history;
                                                        404 ``execution-not-found``
============================== ======================== ==============================================

**Business scopes**: a token sees only the executions of the scopes its ``business_scopes``
claim (a JSON array) names: another scope's execution, or one whose consumer declares no scope,
is absent from the list and its detail is the same 404 as a missing id — the payload of one
business area never reaches another's reader, as a resolution never does. A token without the
claim sees none.

Read-only, as ``core-jobs executions list|show``, which reads the same layer (without the scope
filter: the CLI holds the database's credentials). The API role
``core_jobs_api`` may read the three execution tables (0010) and nothing of them more. The
resolution of an execution (R-5) belongs in this module, with its own permission.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from harness.enumerations import CheckpointStatus, EffectName, EventKind, ExecutionStatus
from maintenance.api import pages
from maintenance.api.dependencies import (
    AUTH_ERRORS,
    DEFAULT_LIMIT,
    MAX_ID,
    MAX_LIMIT,
    ExecutionsReader,
    PoolDep,
    Text,
    UndecodableOut,
)
from maintenance.api.problems import Problem, problem_responses
from maintenance.operations import executions as views
from maintenance.operations.stored import shown

LIST_PARAMETERS = frozenset({"status", "consumer", "job_id", "business_scope", "cursor", "limit"})


# --- response bodies --------------------------------------------------------------------------
class ExecutionOut(BaseModel):
    """An execution, without its payload (the detail has it)."""

    id: int
    job_id: UUID
    consumer: str
    queue: str
    tenant_id: UUID
    correlation_id: str | None
    business_scope: str | None = Field(description="The scope the consumer declares (who may resolve it).")
    status: ExecutionStatus
    reason: str | None = Field(description="Why it is FAILED or RECONCILIATION_REQUIRED.")
    reason_action: str | None = Field(description="The action the reason concerns.")
    takes: int = Field(description="Takes by a worker so far.")
    fencing_token: int = Field(description="The token of the last take or resolution; a worker's writes match on it.")
    run_at: datetime = Field(description="When a RETRY_WAIT execution may run again.")
    lease_expires_at: datetime | None = Field(description="Set while RUNNING.")
    leased_by: str | None
    created_at: datetime
    status_changed_at: datetime = Field(description="When it entered its status; pages are in this order.")

    @classmethod
    def of(cls, row: views.ExecutionRow) -> ExecutionOut:
        # The row's types are the database's, already what the model declares: no second validation.
        return cls.model_construct(**{name: getattr(row, name) for name in ExecutionOut.model_fields})


class CheckpointOut(BaseModel):
    """One action's checkpoint."""

    action: str
    position: int
    effect: EffectName
    status: CheckpointStatus
    attempts: int
    result: Any = Field(
        description="The action's result; only and always when SUCCEEDED (null when it cannot be decoded)."
    )
    result_undecodable: UndecodableOut | None = Field(
        description="Set only when the stored result cannot be decoded: its text as stored and why."
    )
    last_error: str | None
    fencing_token: int
    started_at: datetime
    finished_at: datetime | None
    idempotency_key: str = Field(
        description="The external key job_id:consumer:action the action sends (the same on every attempt, R-3): "
        "look the write up at the provider by it."
    )


class ExecutionEventOut(BaseModel):
    """One entry of the execution's history."""

    id: int
    kind: EventKind
    action: str | None
    attempt: int | None
    fencing_token: int
    run_at: datetime | None = Field(description="RETRY_SCHEDULED: when the retry may run.")
    detail: str | None
    at: datetime


class ExecutionDetailOut(ExecutionOut):
    payload: Any = Field(
        description="The job's business data, as the consumer received it; null when it cannot be decoded "
        "(payload_undecodable)."
    )
    payload_undecodable: UndecodableOut | None = Field(
        description="Set only when the stored payload cannot be decoded (too deep, an integer over 4 300 digits): "
        "its text as stored and why."
    )
    checkpoints: list[CheckpointOut] = Field(description="One per started action, in action order.")
    events: list[ExecutionEventOut] = Field(description="The history, oldest first.")


class ExecutionPageOut(BaseModel):
    items: list[ExecutionOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")
    limit: int


router = APIRouter(prefix="/v1/core/executions", tags=["executions"])


@router.get(
    "",
    response_model=ExecutionPageOut,
    responses=problem_responses(*AUTH_ERRORS),
    summary="List executions in one status, oldest in it first, one keyset page at a time",
)
def list_executions(
    request: Request,
    principal: ExecutionsReader,
    pool: PoolDep,
    status: Annotated[ExecutionStatus, Query()] = "RECONCILIATION_REQUIRED",
    consumer: Annotated[Text | None, Query()] = None,
    job_id: Annotated[UUID | None, Query()] = None,
    business_scope: Annotated[Text | None, Query()] = None,
    cursor: Annotated[str | None, Query(max_length=500, description="next_cursor of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> Response:
    pages.refuse_unknown_parameters(request, LIST_PARAMETERS)
    where = views.ExecutionFilter(status=status, consumer=consumer, job_id=job_id, business_scope=business_scope)
    after = views.ExecutionPosition(*pages.decode_position(cursor, where)) if cursor is not None else None
    with pool.connection() as conn:
        page = views.list_executions(conn, where, after, limit, scopes=principal.business_scopes)
    next_cursor = pages.encode_position(page.next.status_changed_at, page.next.id, where) if page.next else None
    return pages.as_json(
        ExecutionPageOut(items=[ExecutionOut.of(r) for r in page.rows], limit=limit, next_cursor=next_cursor)
    )


@router.get(
    "/{id:int}",
    response_model=ExecutionDetailOut,
    responses=problem_responses(*AUTH_ERRORS, 404),
    summary="One execution with its payload, its checkpoints and its history",
)
def get_execution(
    principal: ExecutionsReader,
    pool: PoolDep,
    id: Annotated[int, Path(ge=1, le=MAX_ID)],
) -> Response:
    with pool.connection() as conn:
        detail = views.get_execution(conn, id, scopes=principal.business_scopes)
    if detail is None:
        raise Problem(
            404,
            "execution-not-found",
            f"no execution with id {id} (a job whose work succeeded keeps only its fence)",
            missing_ids=[id],
        )
    return pages.as_json(
        ExecutionDetailOut(
            **ExecutionOut.of(detail.row).model_dump(),
            **shown("payload", detail.payload),
            checkpoints=[CheckpointOut(**(c.__dict__ | shown("result", c.result))) for c in detail.checkpoints],
            events=[ExecutionEventOut.model_validate(v, from_attributes=True) for v in detail.events],
        )
    )
