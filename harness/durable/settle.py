"""Phase 3, settling a failure: RETRY_WAIT, FAILED or RECONCILIATION_REQUIRED, each in one fenced transaction.

:func:`failed` asks :func:`harness.durable.decide.decide` what a failed attempt leads to and
settles it. Each settling transaction first renews the lease and records the checkpoints earned
so far (the successes not yet committed, then the failed one), then moves the execution — so a
stale worker (its write matching nothing) rolls all of it back and changes nothing.
"""

from __future__ import annotations

from typing import Literal

import structlog

from harness.consumer.actions import Action
from harness.consumer.retry import compute_delay
from harness.durable import sql
from harness.durable.decide import decide
from harness.durable.state import Execution, Record, StaleWrite
from harness.errors import TransientError, describe_error
from harness.pg import server_now
from harness.queue.port import DeadLettered, Held, Outcome, RetryAfter

__all__ = ["fail", "failed", "reconcile"]

log = structlog.get_logger()


def failed(ex: Execution, action: Action | None, position: int | None, attempt: int, error: BaseException) -> Outcome:
    """Settle a failed attempt of ``action`` (None: the final write) as the failure table decides."""
    max_attempts = action.policy.max_attempts if action is not None else ex.runtime.policy.max_attempts
    decision = decide(action.effect if action is not None else None, error, attempt, max_attempts)
    if decision.kind == "retry":
        return _retry(ex, action, position, attempt, error)
    if decision.kind == "reconcile":
        assert action is not None and position is not None
        return reconcile(ex, action, position, attempt, error)
    assert decision.reason is not None
    return fail(ex, action, position, attempt, error, decision.reason)


def _retry(ex: Execution, action: Action | None, position: int | None, attempt: int, error: BaseException) -> Outcome:
    policy = action.policy if action is not None else ex.runtime.policy
    retry_after = error.retry_after if isinstance(error, TransientError) else None
    detail = describe_error(error)
    with ex.conn.transaction():
        # An HTTP-date Retry-After is measured against PostgreSQL's clock, read once.
        now = server_now(ex.conn) if isinstance(retry_after, str) else None
        delay = compute_delay(policy, attempt, retry_after=retry_after, now=now, random=ex.runtime.random)
        ex.renew_and_record(ex.with_pending(_failure_record(action, position, attempt, detail)))
        moved = ex.conn.execute(
            sql.SCHEDULE_RETRY,
            {
                "id": ex.execution_id,
                "token": ex.token,
                "delay": delay,
                "action": action.name if action else None,
                "attempt": attempt,
                "detail": detail,
            },
        ).fetchone()
        if moved is None:
            raise StaleWrite()
    ex.runtime.metrics.retry(ex.consumer.name)
    log.info(
        "harness.execution.retry_scheduled",
        **ex.fields(action, attempt),
        delay_s=delay.total_seconds(),
        error=detail,
    )
    return RetryAfter(delay=delay, error=detail)


def reconcile(ex: Execution, action: Action, position: int, attempt: int, error: BaseException) -> Held:
    """RECONCILIATION_REQUIRED: ``action``'s checkpoint UNCERTAIN, the job held for an operator."""
    detail = describe_error(error)
    reason = f"{action.name} ({action.effect}): {detail}"
    _settle(
        ex,
        "RECONCILIATION_REQUIRED",
        action,
        attempt,
        reason,
        Record(action, position, "UNCERTAIN", attempt, error=detail),
    )
    log.warning("harness.execution.reconciliation_required", **ex.fields(action, attempt), reason=reason)
    return Held(execution_id=ex.execution_id, reason=reason)


def fail(
    ex: Execution,
    action: Action | None,
    position: int | None,
    attempt: int,
    error: BaseException,
    why: Literal["permanent", "exhausted"],
) -> DeadLettered:
    """FAILED, and the dead letter that carries it (``action`` None: the final write)."""
    detail = describe_error(error)
    reason = f"{action.name if action else 'the final write'}: {detail}"
    _settle(ex, "FAILED", action, attempt, reason, _failure_record(action, position, attempt, detail))
    log.warning("harness.execution.failed", **ex.fields(action, attempt), reason=why, error=detail)
    return ex.dead_letter(why, reason, attempts=attempt)


def _settle(
    ex: Execution, status: str, action: Action | None, attempt: int, reason: str, record: Record | None
) -> None:
    with ex.conn.transaction():
        ex.renew_and_record(ex.with_pending(record))
        moved = ex.conn.execute(
            sql.SETTLE_EXECUTION,
            {
                "id": ex.execution_id,
                "token": ex.token,
                "status": status,
                "reason": reason,
                "action": action.name if action else None,
                "attempt": attempt,
            },
        ).fetchone()
        if moved is None:
            raise StaleWrite()


def _failure_record(action: Action | None, position: int | None, attempt: int, detail: str) -> Record | None:
    if action is None or position is None:
        return None  # the final write has no checkpoint
    return Record(action, position, "FAILED", attempt, error=detail)
