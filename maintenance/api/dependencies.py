"""What every resource of the operations API shares: the pool, ids and text, idempotency, the problems it may answer.

Each resource (``maintenance/api/resources/``: dead letters, executions, resolutions) is thin
HTTP over ``maintenance/operations/``, and takes from here, never from a sibling:

- **the pool** (:data:`PoolDep`): the application's connection pool, made at startup
  (``maintenance/api/server.py``; each connection as the least-privileged API role);
- **the caller** (:data:`Reader`, :data:`Replayer`, :data:`Discarder`, :data:`ExecutionsReader`):
  the token's principal, when it grants the route's one permission (:func:`maintenance.api.auth.require`);
- **ids and text**: ``MAX_ID`` (a ``bigint``: a larger id is a 422, not a database error),
  :data:`Text` and :data:`Timestamp`, which refuse what PostgreSQL cannot store (NUL, lone
  surrogates) or would misread (a number as a Unix time) before it reaches the database;
- **idempotency**: the ``Idempotency-Key`` header (:data:`IdempotencyKey`) and
  :func:`run_idempotent`, which runs an action through the ledger of
  :mod:`maintenance.api.idempotency` — the same key and request answer the original response
  (``Idempotent-Replayed: true``);
- **stored JSON Python cannot decode** (maintenance/operations/stored.py): :class:`UndecodableOut`,
  the ``<name>_undecodable`` beside a ``null`` payload or result, and :func:`recorded_response`,
  which answers a recorded response body as its stored text when it cannot be decoded;
- **problem mapping**: the statuses a route may answer besides its own (:data:`AUTH_ERRORS`,
  :data:`ACTION_ERRORS`), declared in the OpenAPI with :func:`maintenance.api.problems.problem_responses`;
  every error is ``application/problem+json`` (:mod:`maintenance.api.problems`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

import psycopg
from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import ConnectionPool
from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, Field, StringConstraints

from maintenance.api import idempotency, pages
from maintenance.api.auth import DISCARD, EXECUTIONS_READ, READ, REPLAY, Principal, require
from maintenance.operations.stored import UndecodablePayload

__all__ = [
    "ACTION_ERRORS",
    "AUTH_ERRORS",
    "DEFAULT_LIMIT",
    "MAX_ID",
    "MAX_LIMIT",
    "Discarder",
    "ExecutionsReader",
    "IdempotencyKey",
    "PoolDep",
    "Reader",
    "Replayer",
    "Text",
    "Timestamp",
    "run_idempotent",
    "storable",
]

MAX_ID = pages.MAX_ID
MAX_LIMIT = 500
DEFAULT_LIMIT = 50

AUTH_ERRORS = (400, 401, 403, 503)
ACTION_ERRORS = (*AUTH_ERRORS, 404, 409, 413, 415, 422)


async def app_pool(request: Request) -> ConnectionPool:
    """The application's connection pool (``app.state.pool``, opened by the app's lifespan).

    Async, so FastAPI runs it on the event loop: a sync dependency would cost every request a thread
    handoff for an attribute read (see :func:`maintenance.api.auth.authenticate`)."""
    return request.app.state.pool


# What a route declares, as the FastAPI template's SessionDep and CurrentUser: one name per dependency.
PoolDep = Annotated[ConnectionPool, Depends(app_pool)]
Reader = Annotated[Principal, Depends(require(READ))]
Replayer = Annotated[Principal, Depends(require(REPLAY))]
Discarder = Annotated[Principal, Depends(require(DISCARD))]
ExecutionsReader = Annotated[Principal, Depends(require(EXECUTIONS_READ))]


def storable(text: str) -> str:
    """PostgreSQL text holds neither NUL nor lone surrogates: refuse them here, not as a database error."""
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return text


def _iso_timestamp(value: Any) -> Any:
    """Only an ISO-8601 date-time string (pydantic would take a number as a Unix time)."""
    if not isinstance(value, str) or not re.match(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}", value):
        raise ValueError("must be an ISO-8601 date-time with a time zone, e.g. 2026-12-01T08:00:00Z")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_iso_timestamp)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(storable)]

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", description="Retry-safe key of this action (1-255 visible ASCII characters)."),
]


def run_idempotent(
    request: Request,
    pool: ConnectionPool,
    principal: Principal,
    key: str | None,
    body: BaseModel | None,
    action: Callable[[psycopg.Connection], tuple[int, dict[str, Any]]],
) -> Response:
    """Run ``action(conn) -> (status, body)`` through the idempotency ledger; the JSON response."""
    key = idempotency.check_key(key)
    route = request.scope["route"].path_format  # the template, e.g. /v1/core/dead-letters/{id}/replay
    canonical = body.model_dump(mode="json") if body is not None else None
    fingerprint = idempotency.fingerprint(request.method, route, dict(request.path_params), canonical)
    with pool.connection() as conn:
        outcome = idempotency.run(
            conn,
            key=key,
            operator=principal.subject,
            method=request.method,
            route=route,
            request_fingerprint=fingerprint,
            action=action,
        )
    return recorded_response(outcome.status, outcome.body, replayed=outcome.replayed)


class UndecodableOut(BaseModel):
    """A stored JSON value Python cannot decode (written by SQL or an older version), shown as stored."""

    text: str = Field(description="The value as PostgreSQL prints it (jsonb's text), unchanged.")
    reason: str = Field(
        description="Why it cannot be decoded: nested deeper than 100 levels, or an integer of more than 4 300 digits."
    )


def recorded_response(status: int, body: Any, *, replayed: bool) -> Response:
    """A response as recorded (or just made); a recorded body Python cannot decode is answered as its stored text."""
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    media_type = "application/problem+json" if status >= 400 else "application/json"
    if isinstance(body, UndecodablePayload):
        return Response(body.text, status_code=status, headers=headers, media_type=media_type)
    return JSONResponse(body, status_code=status, headers=headers, media_type=media_type)
