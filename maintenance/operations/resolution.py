"""Resolving an execution in ``RECONCILIATION_REQUIRED``: an operator's statement, applied once (R-5, R-6).

An execution waits in ``RECONCILIATION_REQUIRED`` when a write may or may not have happened at
the provider. A person checks the provider outside the service and states what happened; this
module applies that statement — one operations function, :func:`resolve`, used by the API
(``POST /v1/core/executions/{id}/resolve``) and by any later CLI. The service audits the
statement; it does not verify it.

Commands (there is no field to choose a target state: the command decides it):

- :class:`Resume` — the verified result of each uncertain action. Each ``UNCERTAIN`` checkpoint
  becomes ``SUCCEEDED`` with its result (checked through the action's ``output`` contract); a
  ``SUCCEEDED`` one may be named only with the same result; nothing else may be named (no invented
  actions, no duplicates, no action the worker has still to run, none declared ``verified_only``);
  no uncertainty may be left. The execution goes ``PENDING`` (``run_at = now()``, its take count
  reset as a replay does, so a job parked by the crash-loop bound can finish) and its job is
  published again (same job id, queue, tenant, correlation id and payload) through the queue port
  (``PgQueue.publish_many``), in the resolution's transaction — ``core.queue_messages`` is the
  outbox a relay drains for a queue on a broker (docs/outbox.md): the worker skips the
  succeeded actions and finishes normally, with the published definition.
- :class:`Close` (``CLOSE_WITHOUT_TRANSITION``) with evidence ``ABSENT_VERIFIED`` (the write did
  not happen; refused when a write action already ``SUCCEEDED``: then the compensation must be
  stated, ``COMPENSATED_VERIFIED``). The execution goes ``FAILED`` with a reason naming the
  resolution — no fence, no business write — and its checkpoints are removed (kept in the
  ledger), so a later replay of the job starts afresh.

One transaction (:func:`resolve`): lock the execution (``FOR UPDATE``: two operators take
turns, the second finds it resolved); the idempotency check in the ledger (same execution and
key: the same canonical command from the same operator gets the original response, even after
the execution succeeded and was deleted; anything else is refused); the state; the published
definition; then a new fencing token, the ledger row, the checkpoints, the execution, the
``EXECUTION_RESOLVED`` event (written by the ledger's trigger) and the re-queue commit together
or not at all — in two round trips and the commit (the reads and the new token pipelined after
the lock, the writes pipelined; BEGIN and COMMIT are psycopg's own). The database refuses any release of ``RECONCILIATION_REQUIRED`` without that ledger
row (migration ``0012_execution_resolution``), and every write of a worker holding the old token
matches nothing. A refusal raises :class:`ResolutionRefused` and writes nothing, not even under
the key.

Evidence: a ``reference`` to a verifiable case (a ticket, a provider's case number; at most
:data:`MAX_REFERENCE_CHARS`) and a ``reason`` (at most :data:`MAX_REASON_CHARS`), both non-blank.
Never personal documents, tokens or secrets: :func:`evidence_problems` refuses whatever the one
credential detector (:mod:`maintenance.runtime.credentials`, the log redactor's too) recognises — a URL with a
password (``postgresql://user:pw@host``), ``Authorization`` credentials (Basic, Bearer, Digest), a
JWT, a PEM key, a provider key (AWS, GitHub, Slack, Stripe, Google), a ``password=``/``token=``
pair — and a long high-entropy string; the refusal names the shape, never the value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.types.json import Json, Jsonb
from pydantic import ValidationError

from harness.consumer.consumer import Consumer
from harness.consumer.effects import Effect
from harness.enumerations import EvidenceKind
from harness.errors import validation_problems
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope, InvalidPayload, check_payload
from maintenance.runtime.credentials import credential_kind

__all__ = [
    "MAX_REASON_CHARS",
    "MAX_REFERENCE_CHARS",
    "Close",
    "Evidence",
    "Resolution",
    "ResolutionRefused",
    "Resume",
    "canonical",
    "evidence_problems",
    "resolve",
]

MAX_REFERENCE_CHARS = 200
MAX_REASON_CHARS = 2000
RESUME, CLOSE = "RESUME", "CLOSE_WITHOUT_TRANSITION"
RESULT_VERIFIED, ABSENT_VERIFIED, COMPENSATED_VERIFIED = "RESULT_VERIFIED", "ABSENT_VERIFIED", "COMPENSATED_VERIFIED"

# Lock the execution for the whole resolution: a second resolution waits, then sees it resolved.
# A RESUME reads the job it re-queues, payload included, with REQUEUE_JOB.
LOCK_EXECUTION = """
SELECT id, job_id, consumer, queue, tenant_id, correlation_id, business_scope, status, fencing_token
  FROM core.executions
 WHERE id = %(id)s
   FOR UPDATE"""

# The resolution already recorded under this execution and key, if any (a replay, or a reused key).
FIND_RESOLUTION = """
SELECT operator, command_fingerprint, business_scope, response_status, response_body
  FROM core.execution_resolutions
 WHERE execution_id = %(id)s AND idempotency_key = %(key)s"""

# The checkpoints, in order.
CHECKPOINTS = """
SELECT action, effect, status, result
  FROM core.execution_checkpoints AS c
 WHERE execution_id = %(id)s
 ORDER BY position, action"""

# The resolution's new fencing token, and the transaction's time (its response's resolved_at).
DRAW_TOKEN = "SELECT nextval('core.execution_fencing_seq'), now()"

# The ledger row: first, so that the execution's guard finds it when the state changes. Its
# snapshot of the checkpoints (each whole row, in order) is taken here in SQL, before the
# statements after it change them: a stored result Python cannot decode is kept exactly.
INSERT_RESOLUTION = """
INSERT INTO core.execution_resolutions
       (execution_id, job_id, consumer, business_scope, idempotency_key, operator, command, command_body,
        command_fingerprint, evidence_kind, evidence_reference, evidence_reason, checkpoints_before,
        fencing_token, status_after, response_status, response_body)
VALUES (%(id)s, %(job_id)s, %(consumer)s, %(business_scope)s, %(key)s, %(operator)s, %(command)s, %(body)s,
        %(fingerprint)s, %(evidence_kind)s, %(reference)s, %(reason)s,
        coalesce((SELECT jsonb_agg(to_jsonb(c) - 'execution_id' ORDER BY c.position, c.action)
                    FROM core.execution_checkpoints AS c WHERE c.execution_id = %(id)s), '[]'),
        %(token)s, %(status_after)s, %(response_status)s, %(response_body)s)"""

# RESUME: an uncertain action's verified result.
RECORD_RESULT = """
UPDATE core.execution_checkpoints
   SET status = 'SUCCEEDED', result = %(result)s, last_error = NULL, fencing_token = %(token)s, finished_at = now()
 WHERE execution_id = %(id)s AND action = %(action)s AND status = 'UNCERTAIN'"""

# RESUME: back to PENDING with the new token, due now (the guard checks the ledger row). The take
# count starts again, as after a replay: a job parked by the crash-loop bound must be able to finish.
RESUME_EXECUTION = """
UPDATE core.executions
   SET status = 'PENDING', fencing_token = %(token)s, run_at = now(), reason = NULL, reason_action = NULL,
       takes = 0
 WHERE id = %(id)s AND status = 'RECONCILIATION_REQUIRED'"""

# CLOSE_WITHOUT_TRANSITION: FAILED with the new token and a reason naming the resolution.
CLOSE_EXECUTION = """
UPDATE core.executions
   SET status = 'FAILED', fencing_token = %(token)s, reason = %(reason)s, reason_action = NULL
 WHERE id = %(id)s AND status = 'RECONCILIATION_REQUIRED'"""

# CLOSE_WITHOUT_TRANSITION: its checkpoints go (snapshotted in the ledger): a replay starts afresh.
REMOVE_CHECKPOINTS = "DELETE FROM core.execution_checkpoints WHERE execution_id = %(id)s"

# RESUME: the job to publish again, exactly as the execution keeps it (job id, queue, tenant, correlation
# id, payload), due now. It is published through the queue port (PgQueue.publish_many) in the resolution's
# transaction, like a replay: core.queue_messages is the reference queue and, for a queue that lives on a
# broker, the outbox its relay drains (harness/queue/relay.py, docs/outbox.md) — never written here by name.
# A dead letter's replay that was held in RECONCILIATION_REQUIRED is still outstanding (its delivery
# was acked as Held): the re-queued message carries it (replay_of), so the execution's final outcome
# — processed, duplicate or dead-lettered — ends that replay, as its own delivery would have.
# It carries that replay's trace context (its letter's traceparent, tracestate; none without a replay),
# so the resumed attempt joins the job's trace (harness/tracing.py); PgQueue adds none of its own.
# Migration 0014's core.queue_messages_api_role_guard holds the API role to exactly this message
# (the same replay_of rule; 0017 the same trace context): change both together.
REQUEUE_JOB = """
SELECT e.queue, e.job_id, e.tenant_id, e.correlation_id, held.id, held.traceparent, held.tracestate, e.payload
  FROM core.executions AS e
  LEFT JOIN core.dead_letters AS held
    ON held.id = (SELECT max(d.id) FROM core.dead_letters AS d
                   WHERE d.job_id = e.job_id AND (d.consumer IS NULL OR d.consumer = e.consumer)
                     AND d.status = 'replayed' AND d.replay_outcome IS NULL)
 WHERE e.id = %(id)s"""


# --- the command ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """The operator's statement: what was verified (kind), where (a case reference) and why."""

    kind: EvidenceKind
    reference: str
    reason: str


@dataclass(frozen=True)
class Resume:
    """RESUME: the verified result of existing actions, ``(action, result)`` pairs."""

    results: tuple[tuple[str, Any], ...]
    evidence: Evidence

    name = RESUME


@dataclass(frozen=True)
class Close:
    """CLOSE_WITHOUT_TRANSITION: evidence ABSENT_VERIFIED or COMPENSATED_VERIFIED."""

    evidence: Evidence

    name = CLOSE


Command = Resume | Close


def canonical(command: Command) -> dict[str, Any]:
    """The command as recorded and compared: results in action order; the same statement, the same value."""
    evidence = {
        "kind": command.evidence.kind,
        "reference": command.evidence.reference,
        "reason": command.evidence.reason,
    }
    if isinstance(command, Resume):
        results = sorted(command.results, key=lambda pair: pair[0])
        return {"command": RESUME, "evidence": evidence, "results": [{"action": a, "result": r} for a, r in results]}
    return {"command": CLOSE, "evidence": evidence}


def fingerprint(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --- evidence ------------------------------------------------------------------------------------
def evidence_problems(field_name: str, value: str, limit: int) -> list[str]:
    """What is wrong with an evidence field (empty when nothing is); never quotes the value."""
    if not value.strip():
        return [f"{field_name} must not be blank"]
    problems = []
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        problems.append(f"{field_name} must be valid Unicode (no lone surrogates)")
    if len(value) > limit:
        problems.append(f"{field_name} must be at most {limit} characters")
    if any(ord(c) < 32 and c not in "\n\t" for c in value) or (field_name == "reference" and "\n" in value):
        problems.append(f"{field_name} must not contain control characters")
    kind = credential_kind(value)
    if kind is not None:
        problems.append(f"{field_name} looks like {kind}: give a reference to a verifiable case, never a secret")
    return problems


# --- outcomes ------------------------------------------------------------------------------------
RefusalKind = Literal[
    "execution-not-found",
    "idempotency-key-reused",
    "not-reconciliation-required",
    "consumer-not-published",
    "definition-mismatch",
    "invalid-command",
]


class ResolutionRefused(Exception):
    """Nothing was applied; ``kind`` says why (the API maps it to a status), ``problems`` what to fix."""

    def __init__(self, kind: RefusalKind, detail: str, *, problems: list[str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.problems, self.extra = kind, detail, problems or [], extra


@dataclass(frozen=True)
class Resolution:
    """The response of a resolution: applied now, or the original one replayed from the ledger."""

    status: int
    body: dict[str, Any]
    replayed: bool = False
    command: str = field(default="")


@dataclass(frozen=True)
class _Checkpoint:
    action: str
    effect: str
    status: str
    result: Any


# --- validation against the published definition -------------------------------------------------
def _definition_mismatches(consumer: Consumer, checkpoints: list[_Checkpoint]) -> list[str]:
    problems = []
    for checkpoint in checkpoints:
        declared = consumer.action(checkpoint.action)
        if declared is None:
            problems.append(f"checkpoint {checkpoint.action} names no action of {consumer.name}'s published definition")
        elif declared.effect.value != checkpoint.effect:
            problems.append(
                f"checkpoint {checkpoint.action} is {checkpoint.effect}, the published definition says "
                f"{declared.effect.value}"
            )
    return problems


def _resume_problems(
    consumer: Consumer, checkpoints: list[_Checkpoint], command: Resume
) -> tuple[list[str], dict[str, Any]]:
    """What refuses the RESUME (empty: none), and the results to record, each through its output contract."""
    problems: list[str] = []
    by_action = {c.action: c for c in checkpoints}
    named = [action for action, _ in command.results]
    duplicates = sorted({a for a in named if named.count(a) > 1})
    if duplicates:
        problems.append(f"results name an action more than once: {', '.join(duplicates)}")
    to_record: dict[str, Any] = {}
    for action_name, result in command.results:
        declared = consumer.action(action_name)
        checkpoint = by_action.get(action_name)
        if declared is None:
            problems.append(f"results.{action_name}: {consumer.name} declares no such action")
            continue
        if declared.verified_only:
            problems.append(f"results.{action_name}: its result must come from verification, not be stated by hand")
            continue
        if checkpoint is None or checkpoint.status not in ("UNCERTAIN", "SUCCEEDED"):
            state = "was never started" if checkpoint is None else f"is {checkpoint.status}"
            problems.append(f"results.{action_name}: the action {state}; the worker runs it, no result is stated")
            continue
        try:
            check_payload(result)
        except InvalidPayload as exc:
            problems.append(f"results.{action_name}: {str(exc).removeprefix('payload').lstrip(': ')}")
            continue
        try:
            verified = declared.output.model_validate(result).model_dump(mode="json") if declared.output else result
        except ValidationError as exc:
            problems.append(
                f"results.{action_name}: breaks the action's output contract ({exc.error_count()} error(s): "
                + "; ".join(validation_problems(exc, "result")[:5])
                + ")"
            )
            continue
        if checkpoint.status == "SUCCEEDED":
            if verified != checkpoint.result:
                problems.append(f"results.{action_name}: SUCCEEDED already with another result; it never changes")
            continue
        to_record[action_name] = verified
    left = [c.action for c in checkpoints if c.status == "UNCERTAIN" and c.action not in named]
    if left:
        problems.append(f"uncertainty left: give the verified result of {', '.join(left)}")
    return problems, to_record


def _close_problems(checkpoints: list[_Checkpoint], command: Close) -> list[str]:
    if command.evidence.kind == ABSENT_VERIFIED:
        done = [c.action for c in checkpoints if c.status == "SUCCEEDED" and Effect(c.effect).writes]
        if done:
            return [
                f"ABSENT_VERIFIED refused: the write {', '.join(done)} SUCCEEDED durably; "
                "state its compensation (COMPENSATED_VERIFIED)"
            ]
    return []


def _statement_problems(command: Command) -> list[str]:
    """The evidence rules, and the evidence kind each command takes."""
    kinds = (RESULT_VERIFIED,) if isinstance(command, Resume) else (ABSENT_VERIFIED, COMPENSATED_VERIFIED)
    problems = [] if command.evidence.kind in kinds else [f"{command.name} takes evidence {' or '.join(kinds)}"]
    problems += evidence_problems("reference", command.evidence.reference, MAX_REFERENCE_CHARS)
    return problems + evidence_problems("reason", command.evidence.reason, MAX_REASON_CHARS)


# --- the operation -------------------------------------------------------------------------------
def resolve(
    conn: psycopg.Connection,
    *,
    execution_id: int,
    idempotency_key: str,
    operator: str,
    command: Command,
    consumers: Mapping[str, Consumer],
    scopes: frozenset[str],
) -> Resolution:
    """Apply ``command`` to the execution once per key, in one transaction; see the module docstring.

    ``operator`` is the verified token's subject; ``scopes`` the business scopes this operator may
    resolve here (its token's, within the deployment's); ``consumers`` the published definitions
    by consumer name. An execution outside ``scopes`` is reported as not found, like a missing one.
    Raises :class:`ResolutionRefused` (nothing applied). Three steps in one transaction: read
    (one round trip, the new token with it), check (no I/O), write (one round trip).
    """
    statement_problems = _statement_problems(command)
    if statement_problems:  # the API's model refuses these first; a caller in code gets the same rules
        raise ResolutionRefused("invalid-command", "; ".join(statement_problems), problems=statement_problems)
    body = canonical(command)
    print_ = fingerprint(body)
    with conn.transaction():
        row, found, checkpoints, (token, now), job = _read(
            conn, execution_id, idempotency_key, requeue=isinstance(command, Resume)
        )
        scope = row[6] if row is not None else (found[2] if found is not None else None)
        if scope is None or scope not in scopes:
            raise ResolutionRefused("execution-not-found", f"no execution {execution_id} in your business scopes")
        if found is not None:
            return _replayed(found, operator, print_, command)
        assert row is not None
        _id, job_id, consumer_name, _queue, _tenant, _correlation, _scope, status, _token = row
        to_record = _checked(execution_id, status, consumers.get(consumer_name), consumer_name, checkpoints, command)
        requeued = _requeued(job) if isinstance(command, Resume) else None
        status_after = "PENDING" if isinstance(command, Resume) else "FAILED"
        response = {
            "execution_id": execution_id,
            "job_id": str(job_id),
            "consumer": consumer_name,
            "business_scope": scope,
            "command": command.name,
            "evidence_kind": command.evidence.kind,
            "status": status_after,
            "fencing_token": token,
            "operator": operator,
            "resolved_at": now.isoformat(),
            "recorded_results": sorted(to_record),
        }
        ledger_row = {
            "id": execution_id,
            "job_id": job_id,
            "consumer": consumer_name,
            "business_scope": scope,
            "key": idempotency_key,
            "operator": operator,
            "command": command.name,
            "body": Jsonb(body),
            "fingerprint": print_,
            "evidence_kind": command.evidence.kind,
            "reference": command.evidence.reference,
            "reason": command.evidence.reason,
            "token": token,
            "status_after": status_after,
            "response_status": 200,
            "response_body": Json(response),
        }
        _write(conn, execution_id, token, command, ledger_row, to_record, requeued)
    return Resolution(200, response, command=command.name)


def _read(
    conn: psycopg.Connection, execution_id: int, idempotency_key: str, *, requeue: bool
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None, list[_Checkpoint], tuple[int, Any], tuple[Any, ...] | None]:
    """The locked execution, the ledger row of this key, the checkpoints, a new token and now(), and (``requeue``:
    a RESUME) the job it would publish again — in one round trip.

    The token is drawn after the lock, so it is newer than any the execution holds; a replay or a
    refusal leaves it unused (a gap in the sequence: tokens are compared, never counted).
    """
    # The lock first, so the others see what its holder committed.
    with conn.pipeline():
        locked = conn.execute(LOCK_EXECUTION, {"id": execution_id})
        recorded = conn.execute(FIND_RESOLUTION, {"id": execution_id, "key": idempotency_key})
        listed = conn.execute(CHECKPOINTS, {"id": execution_id})
        drawn = conn.execute(DRAW_TOKEN)
        job = conn.execute(REQUEUE_JOB, {"id": execution_id}) if requeue else None
    token, now = drawn.fetchone()  # type: ignore[misc]
    return (
        locked.fetchone(),
        recorded.fetchone(),
        [_Checkpoint(*r) for r in listed.fetchall()],
        (token, now),
        job.fetchone() if job is not None else None,
    )


def _requeued(job: tuple[Any, ...] | None) -> tuple[str, Envelope]:
    """The message a RESUME publishes: REQUEUE_JOB's row as an envelope."""
    assert job is not None  # the execution is locked: its row is there
    queue, job_id, tenant_id, correlation_id, replay_of, traceparent, tracestate, payload = job
    # A payload Python cannot decode is an UndecodablePayload here: PgQueue writes it back exactly as stored.
    envelope = Envelope(
        job_id=job_id,
        payload=payload,
        tenant_id=tenant_id,
        correlation_id=correlation_id,
        replay_of=replay_of,
        traceparent=traceparent,
        tracestate=tracestate,
    )
    return queue, envelope


def _replayed(found: tuple[Any, ...], operator: str, print_: str, command: Command) -> Resolution:
    """The recorded answer of this key, when the same operator sends the same command again."""
    recorded_operator, recorded_print, _scope, status, response = found
    if recorded_operator != operator or recorded_print != print_:
        raise ResolutionRefused(
            "idempotency-key-reused",
            "this Idempotency-Key resolved this execution with another command or by another operator; "
            "send a new key for a new resolution",
        )
    return Resolution(status, response, replayed=True, command=command.name)


def _checked(
    execution_id: int,
    status: str,
    consumer: Consumer | None,
    consumer_name: str,
    checkpoints: list[_Checkpoint],
    command: Command,
) -> dict[str, Any]:
    """The refusals in their order (state, published definition, the command's rules); the verified results to record."""
    if status != "RECONCILIATION_REQUIRED":
        raise ResolutionRefused(
            "not-reconciliation-required",
            f"execution {execution_id} is {status}, not RECONCILIATION_REQUIRED; nothing was changed",
            current_status=status,
        )
    if consumer is None or not consumer.durable:
        raise ResolutionRefused(
            "consumer-not-published",
            f"the definition of consumer {consumer_name} is not published to this service; nothing was changed",
            consumer=consumer_name,
        )
    mismatches = _definition_mismatches(consumer, checkpoints)
    if mismatches:
        raise ResolutionRefused(
            "definition-mismatch",
            f"the checkpoints of execution {execution_id} do not match {consumer_name}'s published definition",
            problems=mismatches,
        )
    to_record: dict[str, Any] = {}
    if isinstance(command, Resume):
        problems, to_record = _resume_problems(consumer, checkpoints, command)
    else:
        problems = _close_problems(checkpoints, command)
    if problems:
        raise ResolutionRefused("invalid-command", "; ".join(problems), problems=problems)
    return to_record


def _write(
    conn: psycopg.Connection,
    execution_id: int,
    token: int,
    command: Command,
    ledger_row: dict[str, Any],
    to_record: dict[str, Any],
    requeued: tuple[str, Envelope] | None,
) -> None:
    """The ledger row and the move it records, in one round trip; any failure rolls back all of them.

    A RESUME's re-queue is published after the execution is PENDING with its new token (what the API
    role's guard checks), through the port, its trace context as REQUEUE_JOB read it (none stays none).
    """
    with conn.pipeline():
        conn.execute(INSERT_RESOLUTION, ledger_row)
        if isinstance(command, Resume):
            for action_name, result in to_record.items():
                conn.execute(
                    RECORD_RESULT, {"id": execution_id, "action": action_name, "result": Jsonb(result), "token": token}
                )
            moved = conn.execute(RESUME_EXECUTION, {"id": execution_id, "token": token})
            assert requeued is not None
            PgQueue(conn).publish_many([requeued], keep_context=True)  # no RETURNING: the API role reads no message
        else:
            reason = f"{CLOSE} {command.evidence.kind} by operator resolution (fencing token {token})"
            moved = conn.execute(CLOSE_EXECUTION, {"id": execution_id, "token": token, "reason": reason})
            conn.execute(REMOVE_CHECKPOINTS, {"id": execution_id})
    if moved.rowcount != 1:  # it is locked and was RECONCILIATION_REQUIRED: cannot happen; roll back if it does
        raise RuntimeError(f"execution {execution_id} changed under its lock; the resolution was rolled back")
