"""Handling one delivery: the fence and the work in one transaction, then an outcome.

0. A delivery the broker marks ``redelivered`` (it may have been handled before without being
   settled: the adapter committed the outcome in PostgreSQL, then crashed before acking) is first
   probed, in one statement (:data:`ALREADY_DEAD_LETTERED`): if its job already has a
   ``pending_review`` dead letter of this consumer — and, for a replay, its replay is already
   handled (``replay_outcome`` set) — that failure is recorded: ``Duplicate(already_dead_lettered=True)``,
   acked without running the handler (the worker logs ``harness.job.already_dead_lettered``). A
   success needs no probe: the fence absorbs it. Other deliveries skip the probe: the reference
   queue settles atomically with the database. With the dead-letter writer's ``ON CONFLICT DO
   NOTHING`` (harness/dead_letters.py) this is one dead letter per failure, whatever the broker.
1. The payload is validated against the consumer's schema. A payload it rejects is poison: a
   dead letter at once, zero retries (J-B5, J-AC4). So is one whose validation fails in any
   other way — a validator raising ``TypeError``, or anything else: validation depends on the
   payload alone, so it would fail the same way every time (validators must not do I/O).
2. One transaction on the caller's connection (J-B1)::

       INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
       VALUES (…, now() + fence_ttl) ON CONFLICT DO NOTHING RETURNING 1

   No row back: the job was already done — no handler, nothing written, outcome ``Duplicate``
   (an ack and a metric, no error, no row; J-B2). A row back: run the handler on the same
   connection and commit. That transaction is :func:`harness.fence.work_under_fence`, the one
   a durable consumer's success commits in too. A parallel delivery of the same job blocks on the fence's primary key until this
   transaction ends, then sees the conflict (J-AC1). A crash before the commit leaves neither
   the work nor the fence (J-AC2). Before the commit the transaction must still be open and
   healthy: a handler that swallowed a database error (transaction aborted, nothing would
   commit) or raised ``psycopg.Rollback`` fails transiently; one that ran COMMIT or ROLLBACK
   itself fails permanently, since its later writes escaped the fence and a retry could repeat them.
3. A failure rolls everything back, then:
   ``PermanentError`` → dead letter now; ``TransientError`` or any unclassified exception →
   ``RetryAfter(delay)`` on the policy (honouring the error's ``retry_after``), or a dead letter
   once ``max_attempts`` deliveries have failed (J-AC3). "Any" includes ``BaseException``
   subclasses such as ``SystemExit`` (a library calling ``sys.exit()`` in the handler): a
   handler does not own the process, so that is this job's failure, not the worker's exit. The
   one exception is ``KeyboardInterrupt``: the caller's stop, it propagates after the rollback.
   The error is recorded as ``"Type: message"`` by :func:`harness.errors.describe_error`,
   which renders any exception, even one that cannot be printed.
4. A delivery numbered beyond ``max_attempts`` means the earlier ones never settled: their
   workers died mid-job or lost their leases. It is not run again (a message that kills its
   worker would crash-loop forever): a ``Duplicate`` if the fence exists, else a dead letter
   (``exhausted``) at once.
5. A replayed delivery (``envelope.replay_of``) marks its replay handled with its final outcome,
   in that outcome's transaction (harness/dead_letters.py): ``processed`` in the work
   transaction, ``duplicate`` in the fence probe's (committed instead of rolled back),
   ``dead_lettered`` with the new letter. A retry is not final: the replay stays outstanding, so
   the purge keeps the job's fences through every retry of a fence processed long ago.

6. A consumer that declares actions runs as a durable execution instead of steps 2-5:
   after step 1, :func:`harness.durable.executor.run_execution` takes over (docs/durable-actions.md).

Success writes nothing but the fence: it is counted in the caller's ``metrics`` (:mod:`harness.metrics`;
the default counts nothing) (J-B9, J-AC8).
The outcome is returned, not applied: the queue adapter settles it (harness/queue/port.py).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from datetime import timedelta

import psycopg
from pydantic import ValidationError

from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy, compute_delay
from harness.dead_letters import mark_replay_handled
from harness.durable.executor import run_execution
from harness.errors import PermanentError, PoisonMessage, TransientError, describe_error, validation_problems
from harness.fence import DEFAULT_LEASE, INSERT_FENCE, Runtime, work_under_fence
from harness.metrics import NO_METRICS, Metrics
from harness.pg import server_now
from harness.queue.port import DeadLettered, Delivery, Duplicate, Outcome, RetryAfter, UndecodablePayload

__all__ = ["ALREADY_DEAD_LETTERED", "DEFAULT_LEASE", "INSERT_FENCE", "failure_outcome", "handle"]

# The probe of a redelivered delivery (step 0): its failure is already a pending dead letter of this
# consumer (migration 0018's unique index answers it) and, for a replay, the replay was already handled.
# A replay still outstanding runs even when another letter of its job is pending: its outcome is not recorded.
ALREADY_DEAD_LETTERED = """
SELECT EXISTS (SELECT 1 FROM core.dead_letters
                WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND status = 'pending_review')
       AND (%(replay_of)s::bigint IS NULL
            OR EXISTS (SELECT 1 FROM core.dead_letters WHERE id = %(replay_of)s AND replay_outcome IS NOT NULL))
"""


class DeliveriesExhausted(Exception):
    """Every attempt was used by deliveries that never settled: the job is dead-lettered unrun."""


def handle(
    conn: psycopg.Connection,
    consumer: Consumer,
    delivery: Delivery,
    *,
    policy: RetryPolicy,
    fence_ttl: timedelta,
    metrics: Metrics = NO_METRICS,
    random: Callable[[], float] = _random.random,
    lease: timedelta = DEFAULT_LEASE,
) -> Outcome:
    """Handle one delivery on ``conn`` (autocommit mode, no transaction open); see the module docstring.

    The keywords are the run-wide values (:class:`harness.fence.Runtime`), which travel on as one
    object. ``lease`` is the worker's lease, which a durable consumer's execution takes
    (harness/durable/executor.py).
    """
    runtime = Runtime(policy=policy, fence_ttl=fence_ttl, lease=lease, metrics=metrics, random=random)
    envelope = delivery.envelope
    if delivery.redelivered and _already_dead_lettered(conn, consumer, delivery):
        metrics.duplicate(consumer.name)
        return Duplicate(already_dead_lettered=True)
    if isinstance(envelope.payload, UndecodablePayload):  # stored, but this process cannot read it back
        poison = PoisonMessage(f"payload cannot be decoded: {envelope.payload.reason}")
        return _dead_letter(consumer, delivery, "poison", poison, metrics)
    try:
        payload = consumer.payload_schema.model_validate(envelope.payload)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        why = (
            "; ".join(validation_problems(exc, "payload")) if isinstance(exc, ValidationError) else describe_error(exc)
        )
        poison = PoisonMessage(f"payload failed schema validation: {why}")
        return _dead_letter(consumer, delivery, "poison", poison, metrics)
    if consumer.durable:
        return run_execution(conn, consumer, delivery, payload, runtime)

    context = JobContext(
        job_id=envelope.job_id,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        attempt=delivery.attempt,
        queue=delivery.queue,
        consumer=consumer.name,
    )
    fence = {"job_id": envelope.job_id, "consumer": consumer.name, "tenant_id": envelope.tenant_id, "ttl": fence_ttl}
    if delivery.attempt > policy.max_attempts:
        return _past_the_budget(conn, consumer, delivery, fence, runtime)
    try:
        # BEGIN alone, then the fence: the plain path's round trips as they have always been.
        return work_under_fence(
            conn,
            consumer,
            payload,
            context,
            fence=(INSERT_FENCE, fence),
            fenced=lambda inserted: inserted.fetchone() is not None,
            replay_of=envelope.replay_of,
            runtime=runtime,
            pipelined=False,
        )
    except KeyboardInterrupt:
        raise  # the caller's stop, not the job's failure; the work and the fence were rolled back
    except BaseException as exc:
        return failure_outcome(conn, consumer, delivery, exc, runtime)


def _already_dead_lettered(conn: psycopg.Connection, consumer: Consumer, delivery: Delivery) -> bool:
    """Step 0's probe (:data:`ALREADY_DEAD_LETTERED`), one autocommit statement."""
    envelope = delivery.envelope
    params = {"consumer": consumer.name, "job_id": envelope.job_id, "replay_of": envelope.replay_of}
    row = conn.execute(ALREADY_DEAD_LETTERED, params).fetchone()
    return bool(row and row[0])


def failure_outcome(
    conn: psycopg.Connection, consumer: Consumer, delivery: Delivery, error: BaseException, runtime: Runtime
) -> Outcome:
    """Retry or dead letter after a failed (rolled back) attempt of a plain consumer (its queue's policy)."""
    policy, metrics = runtime.policy, runtime.metrics
    if isinstance(error, PermanentError):
        return _dead_letter(consumer, delivery, "permanent", error, metrics)
    if delivery.attempt >= policy.max_attempts:
        return _dead_letter(consumer, delivery, "exhausted", error, metrics)
    retry_after = error.retry_after if isinstance(error, TransientError) else None
    # An HTTP-date Retry-After is measured against PostgreSQL's clock, like the schedule itself.
    now = server_now(conn) if isinstance(retry_after, str) else None
    delay = compute_delay(policy, delivery.attempt, retry_after=retry_after, now=now, random=runtime.random)
    metrics.retry(consumer.name)
    return RetryAfter(delay=delay, error=describe_error(error))


def _past_the_budget(
    conn: psycopg.Connection, consumer: Consumer, delivery: Delivery, fence: dict, runtime: Runtime
) -> Outcome:
    """A delivery beyond ``max_attempts``: none of the earlier ones settled (each worker died or lost its lease).

    The handler is not run again — a job that kills its worker would otherwise do so forever —
    unless the fence shows the work did commit, which makes this a plain duplicate.
    """
    replay_of = delivery.envelope.replay_of
    with conn.transaction():
        # A probe, like the real fence: it waits for a worker still committing this job, then tells.
        done = conn.execute(INSERT_FENCE, fence).fetchone() is None
        if not done or replay_of is None:
            raise psycopg.Rollback()  # this delivery writes no fence
        mark_replay_handled(conn, replay_of, "duplicate")  # the probe inserted nothing: commit the mark alone
    if done:
        runtime.metrics.duplicate(consumer.name)
        return Duplicate()
    error = DeliveriesExhausted(
        f"delivery {delivery.attempt} of a job allowed {runtime.policy.max_attempts} attempts: the earlier deliveries"
        " never settled (the worker died or lost its lease each time), so the handler is not run again"
    )
    return _dead_letter(consumer, delivery, "exhausted", error, runtime.metrics)


def _dead_letter(
    consumer: Consumer, delivery: Delivery, reason: str, error: BaseException, metrics: Metrics
) -> DeadLettered:
    metrics.dead_lettered(consumer.name, reason)
    return DeadLettered(
        reason=reason,  # type: ignore[arg-type]
        letter=delivery.letter(consumer.name, attempts=delivery.attempt, last_error=describe_error(error)),
    )
