"""Errors of the operations API as RFC 9457 problem details (``application/problem+json``).

Every error has a stable ``type`` (``urn:core-jobs:problem:<slug>``), a ``title`` fixed per
type, the HTTP ``status``, a human ``detail`` and, where it helps a client, extra members
(``missing_permission``, ``status`` of the dead letter, ``missing_ids`` …). Clients branch on
``type``, never on ``detail``. The types, by status:

====== ================================= ==========================================================
status type slug                         when
====== ================================= ==========================================================
400    ``malformed-request``             unparseable JSON, a bad query parameter or cursor, an
                                         unknown query parameter, a bad ``Idempotency-Key``
401    ``unauthenticated``               no bearer token, or one that fails verification
403    ``missing-permission``            the token lacks the endpoint's permission
403    ``missing-role``                  resolve: the token's ``roles`` lack ``EXECUTION_OPERATOR``
403    ``missing-business-scope``        resolve: the token names none of the scopes served here
404    ``not-found``                     no such route
404    ``dead-letter-not-found``         an id that does not exist (bulk: every missing id listed)
404    ``execution-not-found``           an execution id that does not exist (``missing_ids``); resolve:
                                         also one outside the caller's business scopes
405    ``method-not-allowed``            the route exists, the method does not
409    ``not-pending-review``            the dead letter is replayed/discarded already (its status)
409    ``idempotency-key-reused``        the key was used for another request or by another operator
409    ``not-reconciliation-required``   resolve: the execution is in another state (resolved)
409    ``consumer-not-published``        resolve: this service has no definition of its consumer
409    ``definition-mismatch``           resolve: its checkpoints do not fit the published definition
413    ``payload-too-large``             the body exceeds ``CORE_JOBS_API_MAX_BODY_BYTES``
415    ``unsupported-media-type``        a body that is not ``application/json``
422    ``invalid-request``               well-formed but invalid: a blank or over-long reason, too
                                         many ids, a wrong field
422    ``invalid-command``               resolve: the definition refuses the command (``problems``)
422    ``filter-too-broad``              a bulk filter matches more than ``CORE_JOBS_DEAD_LETTERS_BULK_MAX``
                                         dead letters (``matched``, ``max``); nothing changed
422    ``undecodable-payload``           replay: a dead letter's stored payload cannot be decoded
                                         (``undecodable_ids``); nothing changed — discard it
431    ``request-headers-too-large``     more than 32 KB or 100 fields of headers (the server
                                         answers before the app runs; :mod:`maintenance.api.server`)
500    ``internal-error``                a bug; the detail says nothing about it, the log does
503    ``database-unavailable``          the database cannot be reached or no connection is free
503    ``keys-unavailable``              the issuer's JWKS cannot be fetched (and none is cached)
====== ================================= ==========================================================
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:core-jobs:problem:"

TITLES = {
    "malformed-request": "Malformed request",
    "unauthenticated": "Missing or invalid bearer token",
    "missing-permission": "Missing permission",
    "not-found": "Not found",
    "dead-letter-not-found": "Dead letter not found",
    "execution-not-found": "Execution not found",
    "method-not-allowed": "Method not allowed",
    "not-pending-review": "Dead letter is not pending review",
    "idempotency-key-reused": "Idempotency key reused for another request",
    "payload-too-large": "Request body too large",
    "request-headers-too-large": "Request headers too large",
    "request-timeout": "Request not received in time",
    "unsupported-media-type": "Unsupported media type",
    "invalid-request": "Invalid request",
    "filter-too-broad": "Bulk filter matches more than the cap",
    "undecodable-payload": "Dead letter payload cannot be decoded",
    "internal-error": "Internal error",
    "database-unavailable": "Database unavailable",
    "keys-unavailable": "Token keys unavailable",
    "missing-role": "Missing role",
    "missing-business-scope": "Missing business scope",
    "not-reconciliation-required": "Execution is not RECONCILIATION_REQUIRED",
    "consumer-not-published": "Consumer definition not published",
    "definition-mismatch": "Checkpoints do not match the published definition",
    "invalid-command": "Command refused by the published definition",
}


class Problem(Exception):
    """Raise anywhere in a request to answer with this problem.

    ``recorded``: the problem is an idempotent action's own answer (the action ran and refused), which the
    ``Idempotency-Key`` ledger keeps like a success (:mod:`maintenance.api.idempotency`); every other problem
    comes before the action or is a failure, and is not recorded: the request may be sent again with its key.
    """

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        recorded: bool = False,
        **extra: Any,
    ) -> None:
        if slug not in TITLES:
            raise ValueError(f"unknown problem type {slug!r}")
        super().__init__(detail)
        self.status, self.slug, self.detail, self.headers, self.extra = status, slug, detail, headers or {}, extra
        self.recorded = recorded

    def body(self) -> dict[str, Any]:
        return {
            "type": TYPE_PREFIX + self.slug,
            "title": TITLES[self.slug],
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers, media_type=PROBLEM_MEDIA_TYPE)


class ProblemModel(BaseModel):
    """The problem body, for the OpenAPI document. Extra members depend on the type."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field(description="Stable identifier of the problem, urn:core-jobs:problem:<slug>.")
    title: str
    status: int
    detail: str


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: each status documented as a problem+json body."""
    descriptions = {
        400: "Malformed request",
        401: "Missing or invalid bearer token",
        403: "Missing permission",
        404: "Not found",
        409: "Conflict",
        413: "Request body too large",
        415: "Unsupported media type",
        422: "Invalid request",
        503: "Database or token keys unavailable",
    }
    schema = {"$ref": "#/components/schemas/Problem"}
    return {s: {"description": descriptions[s], "content": {PROBLEM_MEDIA_TYPE: {"schema": schema}}} for s in statuses}
