"""Phase 2, the run: recover what a lost worker left, bound a crash loop, then run each action not yet SUCCEEDED.

Every decision by effect class reads the action's rules (harness/consumer/effects.py): whether a
STARTED checkpoint is committed before the call and how (``started``), what a STARTED checkpoint
a lost worker left means (``lost_while_started``), whether an unfinished attempt leaves a doubt
(``writes``). A failure is settled by harness/durable/settle.py. :func:`run` returns None when
every action has succeeded: the final transaction (harness/durable/finish.py) comes next.
"""

from __future__ import annotations

from harness import replication, tracing
from harness.consumer.actions import Action, ActionContext, idempotency_key
from harness.durable.decide import OutputBroken, WorkerLost, validated
from harness.durable.settle import fail, failed, reconcile
from harness.durable.state import Execution, Record, check_held
from harness.durable.window import max_takes
from harness.errors import describe_error
from harness.pipelined import transaction_begun_with
from harness.queue.port import Outcome

__all__ = ["run"]


def run(ex: Execution) -> Outcome | None:
    """Recovery, the crash-loop bound, the actions in order; an outcome, or None when all succeeded."""
    for position, action in enumerate(ex.consumer.actions):
        checkpoint = ex.checkpoints.get(action.name)
        rules = action.effect.rules
        if checkpoint is None or rules.started == "none" or checkpoint.status not in ("STARTED", "UNCERTAIN"):
            continue
        lost = WorkerLost("the worker was lost while the request may have been sent")
        if (
            rules.lost_while_started == "reconcile"
            or checkpoint.status == "UNCERTAIN"
            or checkpoint.attempts >= action.policy.max_attempts
        ):
            return reconcile(ex, action, position, checkpoint.attempts, lost)
    if ex.takes > max_takes(ex.consumer, ex.runtime.policy):
        return _crash_looped(ex)
    for position, action in enumerate(ex.consumer.actions):
        checkpoint = ex.checkpoints.get(action.name)
        if checkpoint is not None and checkpoint.status == "SUCCEEDED":
            try:
                ex.results[action.name] = validated(action, checkpoint.result, "its stored result (SUCCEEDED)")
            except OutputBroken as exc:
                # A deploy changed the contract. The action's success is certain and its checkpoint is
                # never rewritten: FAILED with it intact, for a consumer that accepts it to replay.
                return fail(ex, action, None, checkpoint.attempts, exc, "permanent")
            continue
        outcome = _run_action(ex, action, position, (checkpoint.attempts if checkpoint else 0) + 1)
        if outcome is not None:
            return outcome
    return None


def _crash_looped(ex: Execution) -> Outcome:
    error = WorkerLost(
        f"taken {ex.takes} times, more than its {max_takes(ex.consumer, ex.runtime.policy)} attempts allow:"
        " no take settled it (each worker that took it was lost, or failed to settle it: harness.worker.delivery_failed)"
    )
    for position, action in enumerate(ex.consumer.actions):
        checkpoint = ex.checkpoints.get(action.name)
        if action.effect.rules.writes and checkpoint is not None and checkpoint.status != "SUCCEEDED":
            return reconcile(ex, action, position, checkpoint.attempts, error)
    return fail(ex, None, None, ex.takes, error, "exhausted")


def _run_action(ex: Execution, action: Action, position: int, attempt: int) -> Outcome | None:
    started = Record(action, position, "STARTED", attempt)
    how = action.effect.rules.started
    if how == "transaction":
        # The durable proof of absence: the request is sent only after this synchronous commit.
        # An explicit transaction: only a live worker's COMMIT ends it (a statement left waiting
        # on a lock by a worker that died is rolled back, not committed after its death).
        # BEGIN goes with the statement (one round trip); the COMMIT, alone, only once its result is seen.
        since = replication.uncertain_commits(ex.conn)
        with transaction_begun_with(ex.conn, ex.renewal(ex.with_pending(started))) as (renewed,):
            check_held(renewed)
        # Behind the replication barrier, sent only once a standby has the checkpoint: a failover cannot
        # forget that the request may have gone (NotReplicated: not sent; the next take reconciles).
        # A checkpoint whose synchronous-replication wait was cancelled may be on no standby: not sent either,
        # and the action is held for an operator now (CommitUncertain, harness/replication.py).
        try:
            replication.after_commit(ex.conn, since)
        except replication.CommitUncertain as exc:
            return reconcile(ex, action, position, attempt, exc)
    elif how == "autocommit":
        # One statement in autocommit, one round trip: if it commits after this worker died, the
        # write is merely re-sent with its key (or reconciled once its attempts are used).
        ex.renew_and_record(ex.with_pending(started))
    envelope = ex.delivery.envelope
    context = ActionContext(
        job_id=envelope.job_id,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        consumer=ex.consumer.name,
        action=action.name,
        attempt=attempt,
        idempotency_key=idempotency_key(envelope.job_id, ex.consumer.name, action.name),
        results=dict(ex.results),
    )
    attributes = {
        "core_jobs.consumer": ex.consumer.name,
        "core_jobs.action": action.name,
        "core_jobs.effect": str(action.effect),
        "core_jobs.attempt": attempt,
        "core_jobs.execution_id": ex.execution_id,
    }
    # A span per call, a child of the delivery's: the action's own requests (an HTTP client's) nest in it.
    with tracing.span(f"action {action.name}", attributes=attributes) as span:
        try:
            value = validated(action, action.call(ex.payload, context))
        except KeyboardInterrupt:
            raise  # the caller's stop: a write's STARTED checkpoint stays, the next take decides
        except BaseException as exc:
            tracing.set_error(span, describe_error(exc))
            return failed(ex, action, position, attempt, exc)
    ex.results[action.name] = value
    stored = value.model_dump(mode="json") if action.output is not None else value
    ex.pending.append(Record(action, position, "SUCCEEDED", attempt, result=stored))
    return None
