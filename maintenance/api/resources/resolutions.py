"""``POST /v1/core/executions/{id}/resolve``: an operator's resolution over HTTP (R-5, R-6).

Served only in admin mode (``CORE_JOBS_ADMIN_ENABLED``, :mod:`maintenance.api.admin`); otherwise
the route does not exist (404). Thin HTTP over :func:`maintenance.operations.resolution.resolve`.

Checks, in this order (each answer leaks nothing the caller may not know):

1. the bearer token (401, :mod:`maintenance.api.auth`); its ``roles`` contain
   ``EXECUTION_OPERATOR`` (403 ``missing-role``); its ``business_scopes`` name at least one of
   ``CORE_JOBS_ADMIN_BUSINESS_SCOPES`` (403 ``missing-business-scope``) — both before any
   execution is looked up;
2. the body, a ``ReconciliationCommand`` (422 ``invalid-request``), and the ``Idempotency-Key``
   header, mandatory (400 ``malformed-request``);
3. the execution, locked: missing **or of a business scope outside the token's scopes within
   the deployment's** → the same 404 ``execution-not-found`` (so no one learns that an execution
   of another scope exists); the key already used on it → the original response
   (``Idempotent-Replayed: true``) for the same command and operator, else 409
   ``idempotency-key-reused``; not ``RECONCILIATION_REQUIRED`` → 409
   ``not-reconciliation-required``; its consumer not among the published definitions → 409
   ``consumer-not-published``; its checkpoints not matching them → 409 ``definition-mismatch``;
   the command refused by the definition → 422 ``invalid-command`` with ``problems``.

The operator recorded is the token's ``sub``. Refusals are not recorded under the key (the
request can be fixed and sent again with it); only an applied resolution is, in the resolution
ledger, in the resolution's own transaction. Logs: ``maintenance.api.execution_resolved``
(``execution_id``, ``command``, ``evidence_kind``, ``subject``, ``fencing_token``, ``replayed``)
and ``maintenance.api.resolution_refused`` (``execution_id``, ``problem``, ``subject``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, StringConstraints

from harness.enumerations import EvidenceKind, ResolutionCommand, ResolvedStatus
from maintenance.api import idempotency
from maintenance.api.admin import AdminConfig
from maintenance.api.auth import Principal, authenticate
from maintenance.api.dependencies import MAX_ID, IdempotencyKey, PoolDep, recorded_response
from maintenance.api.problems import Problem, problem_responses
from maintenance.operations import resolution
from maintenance.operations.resolution import MAX_REASON_CHARS, MAX_REFERENCE_CHARS, ResolutionRefused
from maintenance.runtime.logs import get_logger

OPERATOR_ROLE = "EXECUTION_OPERATOR"
MAX_RESULTS = 64

STATUS_OF = {
    "execution-not-found": 404,
    "idempotency-key-reused": 409,
    "not-reconciliation-required": 409,
    "consumer-not-published": 409,
    "definition-mismatch": 409,
    "invalid-command": 422,
}


def _evidence(field_name: str, limit: int):
    def check(value: str) -> str:
        problems = resolution.evidence_problems(field_name, value, limit)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(check)


Reference = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REFERENCE_CHARS),
    _evidence("reference", MAX_REFERENCE_CHARS),
]
EvidenceReason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_CHARS),
    _evidence("reason", MAX_REASON_CHARS),
]
ActionName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResumeEvidence(_Body):
    """Where the results were verified: a case reference (never a secret) and why they are right."""

    reference: Reference = Field(description="A verifiable case: ticket, provider case number (≤ 200 characters).")
    reason: EvidenceReason = Field(description="What the operator checked and found (≤ 2 000 characters).")


class CloseEvidence(ResumeEvidence):
    kind: Literal["ABSENT_VERIFIED", "COMPENSATED_VERIFIED"] = Field(
        description="ABSENT_VERIFIED: the write did not happen (refused after a SUCCEEDED write); "
        "COMPENSATED_VERIFIED: it happened and was undone."
    )


class ActionResult(_Body):
    action: ActionName = Field(description="An action of the execution's consumer, UNCERTAIN or SUCCEEDED.")
    result: Any = Field(description="Its verified result: must satisfy the action's output contract.")


class ResumeCommand(_Body):
    """Record the verified results of existing actions and re-queue the execution (PENDING)."""

    command: Literal["RESUME"]
    results: list[ActionResult] = Field(min_length=1, max_length=MAX_RESULTS)
    evidence: ResumeEvidence


class CloseCommand(_Body):
    """Close the execution FAILED with no business transition."""

    command: Literal["CLOSE_WITHOUT_TRANSITION"]
    evidence: CloseEvidence


class ReconciliationCommand(RootModel[Annotated[ResumeCommand | CloseCommand, Field(discriminator="command")]]):
    """An operator's resolution. There is no field to choose a target state: the command decides it."""

    def to_command(self) -> resolution.Command:
        body = self.root
        if isinstance(body, ResumeCommand):
            evidence = resolution.Evidence("RESULT_VERIFIED", body.evidence.reference, body.evidence.reason)
            return resolution.Resume(results=tuple((r.action, r.result) for r in body.results), evidence=evidence)
        return resolution.Close(
            evidence=resolution.Evidence(body.evidence.kind, body.evidence.reference, body.evidence.reason)
        )


class ResolutionOut(BaseModel):
    execution_id: int
    job_id: str
    consumer: str
    business_scope: str
    command: ResolutionCommand
    evidence_kind: EvidenceKind
    status: ResolvedStatus = Field(description="The execution's state after the resolution.")
    fencing_token: int = Field(description="The new fencing token: a worker holding an older one changes nothing.")
    operator: str = Field(description="The token's sub.")
    resolved_at: str
    recorded_results: list[str] = Field(description="RESUME: the actions whose verified result was recorded.")


async def operator_of(request: Request) -> Principal:
    """The caller, when its token carries the operator role and a business scope served here; else 401/403."""
    principal = await authenticate(request)
    admin: AdminConfig = request.app.state.admin
    if OPERATOR_ROLE not in principal.roles:
        get_logger().info("maintenance.api.permission_refused", subject=principal.subject, role=OPERATOR_ROLE)
        raise Problem(403, "missing-role", f"resolving an execution needs the role {OPERATOR_ROLE}")
    if not principal.business_scopes & admin.business_scopes:
        get_logger().info("maintenance.api.permission_refused", subject=principal.subject, role="business_scopes")
        raise Problem(
            403, "missing-business-scope", "the token's business_scopes name none of the scopes this service serves"
        )
    return principal


router = APIRouter(prefix="/v1/core/executions", tags=["executions"])


@router.post(
    "/{id:int}/resolve",
    response_model=ResolutionOut,
    responses=problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 503),
    summary="Resolve a RECONCILIATION_REQUIRED execution: RESUME with verified results, or "
    "CLOSE_WITHOUT_TRANSITION with evidence",
)
def resolve_execution(
    request: Request,
    principal: Annotated[Principal, Depends(operator_of)],
    pool: PoolDep,
    id: Annotated[int, Path(ge=1, le=MAX_ID)],
    body: ReconciliationCommand,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    if idempotency_key is None:
        raise Problem(400, "malformed-request", "Idempotency-Key is required: a new random key per resolution")
    key = idempotency.check_key(idempotency_key)
    assert key is not None
    admin: AdminConfig = request.app.state.admin
    log = get_logger()
    try:
        with pool.connection() as conn:
            outcome = resolution.resolve(
                conn,
                execution_id=id,
                idempotency_key=key,
                operator=principal.subject,
                command=body.to_command(),
                consumers=admin.consumers,
                scopes=principal.business_scopes & admin.business_scopes,
            )
    except ResolutionRefused as refused:
        log.info("maintenance.api.resolution_refused", execution_id=id, problem=refused.kind, subject=principal.subject)
        extra: dict[str, Any] = dict(refused.extra)
        if refused.kind == "execution-not-found":  # as GET /v1/core/executions/{id} answers it
            extra["missing_ids"] = [id]
        if refused.problems:
            extra["problems"] = refused.problems
        raise Problem(STATUS_OF[refused.kind], refused.kind, refused.detail, **extra) from None
    if not outcome.replayed:
        request.app.state.metrics.resolutions.labels(outcome.command).inc()
    recorded = outcome.body if isinstance(outcome.body, dict) else {}  # a recorded body may not decode
    log.info(
        "maintenance.api.execution_resolved",
        execution_id=id,
        command=outcome.command,
        evidence_kind=recorded.get("evidence_kind"),
        subject=principal.subject,
        fencing_token=recorded.get("fencing_token"),
        replayed=outcome.replayed,
    )
    return recorded_response(outcome.status, outcome.body, replayed=outcome.replayed)
