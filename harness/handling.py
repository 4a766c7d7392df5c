"""Handling one delivery: the fence and the work in one transaction, then an outcome.

Why apart from the worker: the outcome is decided here and returned, not applied — the queue
adapter settles it (harness/queue/port.py) — so a test, the conformance kit or a service can handle
one delivery on its own connection. :func:`handle` takes the worker's one
:class:`~harness.fence.Runtime`; :func:`handle_together` runs a batch of a plain consumer in shared
transactions. The steps (the redelivery probe, validation, the fence, failures, the attempt
budget, replays, durable consumers) and what a shared transaction keeps true, job by job, are
docs/harness.md, "Handling one delivery".
"""

from __future__ import annotations

import random as _random
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, overload
from uuid import UUID

import psycopg
import structlog
from psycopg.pq import TransactionStatus
from pydantic import ValidationError

from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy, compute_delay
from harness.dead_letters import mark_replay_handled
from harness.durable.executor import run_execution
from harness.errors import (
    PermanentError,
    PoisonMessage,
    TransientError,
    describe_error,
    describe_traceback,
    validation_problems,
)
from harness.fence import (
    DEFAULT_LEASE,
    INSERT_FENCE,
    TRANSACTION_ENDED,
    Runtime,
    run_batch_handler,
    run_handler,
    work_under_fence,
)
from harness.metrics import NO_METRICS, Metrics
from harness.pg import server_now
from harness.queue.port import Acked, DeadLettered, Delivery, Duplicate, Outcome, RetryAfter, UndecodablePayload

__all__ = [
    "ALREADY_DEAD_LETTERED",
    "DEFAULT_LEASE",
    "INSERT_FENCE",
    "JOBS_PER_TRANSACTION",
    "BatchProgress",
    "failure_outcome",
    "handle",
    "handle_together",
]

# The jobs one shared transaction holds at most: what one failing job makes its batch-mates run again, and the
# room left for handlers' own savepoints (past 64 subtransactions in one transaction, PostgreSQL's per-backend
# cache of them overflows and every other session's snapshot must look them up in pg_subtrans until it ends).
# A claimed batch of 100 commits as two transactions.
JOBS_PER_TRANSACTION = 50

log = structlog.get_logger()

# The probe of a redelivered delivery (step 0): its failure is already a pending dead letter of this
# consumer (migration 0018's unique index answers it) and, for a replay, the replay was already handled.
# A replay still outstanding runs even when another letter of its job is pending: its outcome is not recorded.
# replay_of names a letter of this job and consumer, as the mark does (harness/dead_letters.py).
ALREADY_DEAD_LETTERED = """
SELECT EXISTS (SELECT 1 FROM core.dead_letters
                WHERE consumer = %(consumer)s AND job_id = %(job_id)s AND status = 'pending_review')
       AND (%(replay_of)s::bigint IS NULL
            OR EXISTS (SELECT 1 FROM core.dead_letters
                        WHERE id = %(replay_of)s AND job_id = %(job_id)s AND coalesce(consumer, %(consumer)s) = %(consumer)s
                          AND replay_outcome IS NOT NULL))
"""


class DeliveriesExhausted(Exception):
    """Every attempt was used by deliveries that never settled: the job is dead-lettered unrun."""


@overload
def handle(conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery, runtime: Runtime) -> Outcome: ...


@overload
def handle(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    delivery: Delivery,
    *,
    policy: RetryPolicy,
    fence_ttl: timedelta,
    metrics: Metrics = NO_METRICS,
    random: Callable[[], float] = _random.random,
    lease: timedelta = DEFAULT_LEASE,
) -> Outcome: ...


def handle(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    delivery: Delivery,
    runtime: Runtime | None = None,
    *,
    policy: RetryPolicy | None = None,
    fence_ttl: timedelta | None = None,
    metrics: Metrics = NO_METRICS,
    random: Callable[[], float] = _random.random,
    lease: timedelta = DEFAULT_LEASE,
) -> Outcome:
    """Handle one delivery on ``conn`` (autocommit mode, no transaction open); docs/harness.md, "Handling one
    delivery".

    ``runtime`` is the run-wide values (:class:`harness.fence.Runtime`), as the worker passes the one it made;
    or, for a caller of one delivery, its fields as keywords (``policy=`` and ``fence_ttl=`` at least), which
    make it. ``lease`` is the worker's, which a durable consumer's execution takes (harness/durable/executor.py).
    """
    if runtime is None:
        if policy is None or fence_ttl is None:
            raise TypeError("handle() takes a Runtime, or policy= and fence_ttl= (and optionally metrics=, lease=)")
        runtime = Runtime(policy=policy, fence_ttl=fence_ttl, lease=lease, metrics=metrics, random=random)
    elif (policy, fence_ttl, metrics, random, lease) != (None, None, NO_METRICS, _random.random, DEFAULT_LEASE):
        raise TypeError("handle() takes a Runtime or its fields as keywords, not both")
    metrics = runtime.metrics
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

    context, fence = _context_and_fence(consumer, delivery, runtime.fence_ttl)
    if delivery.attempt > runtime.policy.max_attempts:
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


def _already_dead_lettered(conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery) -> bool:
    """Step 0's probe (:data:`ALREADY_DEAD_LETTERED`), one autocommit statement."""
    envelope = delivery.envelope
    params = {"consumer": consumer.name, "job_id": envelope.job_id, "replay_of": envelope.replay_of}
    row = conn.execute(ALREADY_DEAD_LETTERED, params).fetchone()
    return bool(row and row[0])


def failure_outcome(
    conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery, error: BaseException, runtime: Runtime
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
    return RetryAfter(delay=delay, error=describe_error(error), traceback=describe_traceback(error))


def _past_the_budget(
    conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery, fence: dict[str, Any], runtime: Runtime
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
        # The probe inserted nothing: commit the mark alone.
        mark_replay_handled(conn, replay_of, "duplicate", job_id=delivery.envelope.job_id, consumer=consumer.name)
    if done:
        runtime.metrics.duplicate(consumer.name)
        return Duplicate()
    error = DeliveriesExhausted(
        f"delivery {delivery.attempt} of a job allowed {runtime.policy.max_attempts} attempts: the earlier deliveries"
        " never settled (the worker died or lost its lease each time), so the handler is not run again"
    )
    return _dead_letter(consumer, delivery, "exhausted", error, runtime.metrics)


def _dead_letter(
    consumer: Consumer[Any], delivery: Delivery, reason: str, error: BaseException, metrics: Metrics
) -> DeadLettered:
    metrics.dead_lettered(consumer.name, reason)
    return DeadLettered(
        reason=reason,  # type: ignore[arg-type]
        letter=delivery.letter(
            consumer.name,
            attempts=delivery.attempt,
            last_error=describe_error(error),
            traceback=describe_traceback(error),
        ),
    )


@dataclass
class BatchProgress:
    """What :func:`handle_together` decided, in order; complete when it returns, the part decided so far when it raises.

    ``settled``: each delivery's final outcome — or the unexpected error of its handling (a
    failure outside the handler, on a usable connection), for the caller to fail alone.
    ``in_hand``: the delivery being handled last (the one that raised, when it raised).
    ``rolled_back``: deliveries whose work was rolled back with a shared transaction that failed
    (at a statement, at its COMMIT, with its connection) and that were not run again alone — the
    worker stopping, or the connection lost: the caller retries each with its attempt counted
    (never a release, which counts nothing: whichever job made the transaction fail would share
    the next one again, forever). ``kept``: deliveries that, like the one in hand when the worker
    fails, keep their lease and counted attempt, so each comes back redelivered and runs alone — a
    batch handler's call that lost the connection or was interrupted, where which job did it is
    unknown. Deliveries in none of these were not started: the caller gives them back.
    """

    settled: list[tuple[Delivery, Outcome | Exception]] = field(default_factory=list)
    in_hand: Delivery | None = None
    rolled_back: list[Delivery] = field(default_factory=list)
    kept: list[Delivery] = field(default_factory=list)


def handle_together(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    deliveries: Sequence[Delivery],
    runtime: Runtime,
    progress: BatchProgress,
    *,
    each: Callable[[Delivery], AbstractContextManager[Any]] = lambda _delivery: nullcontext(),
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Handle a batch of a plain consumer on ``conn`` (autocommit, idle), its jobs' work in shared transactions.

    See docs/harness.md ("A batch in one transaction"). ``runtime`` is the run-wide values, as for
    :func:`handle`. ``each(delivery)`` is entered around each delivery's handling (the worker's span
    and timing); ``stopping()`` is asked before each delivery: once it is true, the rest are not
    started. Outcomes go to ``progress``, in the order they become final: a shared transaction's
    successes when it commits.
    """
    if consumer.durable:
        raise ValueError(f"consumer {consumer.name} is durable: its executions do not share transactions")
    todo: deque[tuple[Delivery, bool]] = deque((delivery, False) for delivery in deliveries)  # (delivery, alone)
    batch = _SharedBatch(conn, consumer, runtime, progress, todo, each, stopping)
    while todo and not stopping():
        delivery, alone = todo[0]
        if alone or not _may_share(delivery, runtime):  # past the budget, redelivered, after a failed commit
            todo.popleft()
            progress.in_hand = delivery
            with each(delivery):
                _alone(conn, consumer, delivery, runtime, progress, todo)
            continue
        chunk: list[tuple[Delivery, Admitted | None]] = []  # None: poison, settled without a transaction
        while todo and len(chunk) < JOBS_PER_TRANSACTION and not todo[0][1] and _may_share(todo[0][0], runtime):
            chunk.append((todo[0][0], _admit(consumer, todo.popleft()[0], runtime)))
        try:
            batch.run(chunk)
        except BaseException:
            _rolled_back_alone(todo, progress)
            raise
    _rolled_back_alone(todo, progress)  # stopping after a failed commit: not run again, retried by the caller


# A shared batch transaction opens with BEGIN and this one statement, in one round trip: its row in
# core.open_work_batches (migration 0027: a COMMIT that finds it is refused), its mark and every job's fence.
# The mark is transaction-local, so it reverts however the transaction ends; PostgreSQL reports the setting to the
# client as it changes (ParameterStatus), so after each handler the worker sees, without a round trip, whether it is
# still in the transaction it opened. It changes nothing in that transaction (only the default of transactions to
# come). It is set in the batch row's RETURNING: a data-modifying CTE runs to its end whether or not it is read, so
# the mark is set even for a chunk with no fence to write. One statement where there were three (OPEN_BATCH, MARK,
# the fences): each statement costs the worker ~25 us of CPU in a pipeline (docs/performance.md).
MARK = ("default_transaction_read_only", "on")
_MARK_NAME, _MARK_ON = (part.encode("ascii") for part in MARK)  # as libpq reports it, without decoding each time
OPEN_BATCH_WITH_FENCES = """
WITH batch AS (
    INSERT INTO core.open_work_batches DEFAULT VALUES
    RETURNING set_config('default_transaction_read_only', 'on', true)
)
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
SELECT j.job_id, %(consumer)s, j.tenant_id, now() + %(ttl)s
  FROM unnest(%(job_ids)s::uuid[], %(tenant_ids)s::uuid[]) AS j(job_id, tenant_id)
ON CONFLICT DO NOTHING
RETURNING job_id
"""
# The worker's own commit: its row goes, then COMMIT — one round trip (no parameters: one simple query).
CLOSE_AND_COMMIT = "DELETE FROM core.open_work_batches WHERE xid = pg_current_xact_id(); COMMIT"
# The fences of the batch's jobs not yet run when the worker stops: this transaction's own, never committed.
UNFENCE_UNRUN = "SELECT core.unfence_unrun(%(consumer)s, %(job_ids)s::uuid[])"


def _alone(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    delivery: Delivery,
    runtime: Runtime,
    progress: BatchProgress,
    todo: deque[tuple[Delivery, bool]],
) -> None:
    """``delivery`` through :func:`handle`, its outcome (or the unexpected error of its handling) settled in ``progress``."""
    try:
        progress.settled.append((delivery, handle(conn, consumer, delivery, runtime)))
    except KeyboardInterrupt:
        _rolled_back_alone(todo, progress)
        raise
    except Exception as exc:
        if conn.closed or conn.broken:
            _rolled_back_alone(todo, progress)
            raise
        progress.settled.append((delivery, exc))


# A delivery's validated payload, its handler's context and its fence's parameters.
Admitted = tuple[Any, JobContext, dict[str, Any]]


class _SharedBatch:
    """Runs chunks of admitted deliveries, each chunk one shared transaction (docs/harness.md, "A batch in one
    transaction")."""

    def __init__(
        self,
        conn: psycopg.Connection,
        consumer: Consumer[Any],
        runtime: Runtime,
        progress: BatchProgress,
        todo: deque[tuple[Delivery, bool]],
        each: Callable[[Delivery], AbstractContextManager[Any]],
        stopping: Callable[[], bool],
    ) -> None:
        self.conn, self.consumer, self.runtime, self.progress = conn, consumer, runtime, progress
        self.todo, self.each, self.stopping = todo, each, stopping
        self.one_by_one: set[int] = set()  # deliveries whose batch_handler call failed: each runs with handler

    def run(self, chunk: list[tuple[Delivery, Admitted | None]]) -> None:
        conn, progress = self.conn, self.progress
        try:
            new = self._open(chunk)
        except psycopg.Error:
            if conn.closed or conn.broken:
                raise
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            self._again(chunk, alone=True)  # the batch could not open (a fence refused): each job on its own
            return
        if (
            self.consumer.batch_handler is not None
            and not any(id(d) in self.one_by_one for d, _a in chunk)
            and not self.stopping()
        ):
            self._run_batched(chunk, new)
            return
        # The transaction's jobs so far: (delivery, whether it wrote the fence).
        shared: list[tuple[Delivery, bool]] = []
        for index, (delivery, admitted) in enumerate(chunk):
            if self.stopping():
                unrun = [d.envelope.job_id for d, _a in chunk[index:] if new.pop(d.envelope.job_id, None) is d]
                try:
                    if unrun:
                        conn.execute(UNFENCE_UNRUN, {"consumer": self.consumer.name, "job_ids": unrun})
                except psycopg.Error:
                    if not (conn.closed or conn.broken):
                        conn.rollback()
                    progress.rolled_back.extend(d for d, _fenced in shared)
                    if conn.closed or conn.broken:
                        raise
                    return
                self._commit(shared)
                return  # the rest were not started: the caller gives them back
            progress.in_hand = delivery
            with self.each(delivery):
                if admitted is None:  # poison: its dead letter, no SQL (it never enters the transaction)
                    progress.settled.append((delivery, handle(conn, self.consumer, delivery, self.runtime)))
                    continue
                payload, context, _fence = admitted
                fenced = new.get(delivery.envelope.job_id) is delivery  # a job twice in a chunk: its first runs
                try:
                    problem = self._work(delivery, payload, context, fenced, shared)
                except KeyboardInterrupt:
                    if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
                        self.progress.rolled_back.extend(d for d, _fenced in shared)
                        raise
                    done = {id(d) for d, _fenced in shared}
                    self.run([(d, a) for d, a in chunk[:index] if id(d) in done])  # what it did, committed again
                    progress.in_hand = delivery  # it keeps its lease; the rest of the chunk was not started
                    raise
            if problem is not None:
                # Its work, and its batch-mates', rolled back with the transaction: it is settled on its error;
                # the others did nothing wrong and run again, in the next shared transaction.
                progress.settled.append(
                    (delivery, failure_outcome(conn, self.consumer, delivery, problem, self.runtime))
                )
                self._again([(d, None) for d, _fenced in shared] + chunk[index + 1 :], alone=False)
                return
            shared.append((delivery, fenced))
        self._commit(shared)

    def _run_batched(self, chunk: list[tuple[Delivery, Admitted | None]], new: dict[UUID, Delivery]) -> None:
        """The chunk's new jobs through the consumer's ``batch_handler`` in one call, in the open transaction, then
        committed (docs/harness.md, "Batch handlers"). If the call fails, the transaction is rolled back and each of
        the chunk's jobs runs again with ``handler``, in the next shared transaction: the failing one is settled
        alone, the others commit once. A lost connection: each is retried, counted (which one broke it is unknown);
        the caller's stop (KeyboardInterrupt): nothing commits, the first new job keeps its lease, the rest go back."""
        conn, progress, consumer = self.conn, self.progress, self.consumer
        jobs: list[tuple[Delivery, Admitted]] = []
        for delivery, admitted in chunk:
            if admitted is None:  # poison: its dead letter, no SQL (it never enters the transaction)
                progress.in_hand = delivery
                with self.each(delivery):
                    progress.settled.append((delivery, handle(conn, consumer, delivery, self.runtime)))
            else:
                jobs.append((delivery, admitted))
        fresh = [(d, a) for d, a in jobs if new.get(d.envelope.job_id) is d]  # a job twice in a chunk: its first
        progress.in_hand = None
        failure: BaseException | None = None
        try:
            with ExitStack() as handling:  # each delivery's span and timing around the one call
                for delivery, _a in jobs:
                    handling.enter_context(self.each(delivery))
                try:  # caught inside: a batch-mate's span is not marked failed by another job's error
                    if fresh:
                        payloads, contexts = [a[0] for _d, a in fresh], [a[1] for _d, a in fresh]
                        run_batch_handler(conn, consumer, payloads, contexts, still_open=_in_batch_transaction)
                    for delivery, _a in jobs:
                        self._mark_replay(delivery, fenced=new.get(delivery.envelope.job_id) is delivery)
                except BaseException as exc:
                    failure = exc
        except BaseException as exc:  # entering a delivery's span or timing failed: the call never ran
            failure = exc
        if failure is None:
            self._commit([(d, new.get(d.envelope.job_id) is d) for d, _a in jobs])
            return
        # Which job lost the connection, or was running when the worker was interrupted, is unknown: each new job
        # keeps its lease and counted attempt and comes back redelivered, to run alone (a per-job handler's job in
        # hand does the same); the duplicates did nothing and go back.
        if isinstance(failure, KeyboardInterrupt) or conn.closed or conn.broken:
            if not (conn.closed or conn.broken):
                with suppress(psycopg.Error):
                    conn.rollback()
            progress.kept.extend(d for d, _a in fresh)
            raise failure
        ended = not _in_batch_transaction(conn)  # the call ended the transaction: its later writes escaped the fences
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
        except psycopg.Error:
            if conn.closed or conn.broken:
                progress.kept.extend(d for d, _a in fresh)
            raise
        log.warning(
            "harness.job.batch_handler_failed",
            consumer=consumer.name,
            num_jobs=len(jobs),
            error=describe_error(failure),
        )
        again = jobs
        if ended:  # run again, they would apply what escaped twice: each new job is dead-lettered, as alone
            ended_error = PermanentError(TRANSACTION_ENDED)
            for delivery, _a in fresh:
                progress.settled.append(
                    (delivery, failure_outcome(conn, consumer, delivery, ended_error, self.runtime))
                )
            again = [(d, a) for d, a in jobs if new.get(d.envelope.job_id) is not d]
        self.one_by_one.update(id(d) for d, _a in again)
        self._again([(d, None) for d, _a in again], alone=False)

    def _open(self, chunk: Sequence[tuple[Delivery, Admitted | None]]) -> dict[UUID, Delivery]:
        """BEGIN, the batch's row and mark, every job's fence: one round trip. The new fences, each by its delivery."""
        conn = self.conn
        admitted = [d for d, a in chunk if a is not None]
        params = {
            "consumer": self.consumer.name,
            "ttl": self.runtime.fence_ttl,
            "job_ids": [d.envelope.job_id for d in admitted],
            "tenant_ids": [d.envelope.tenant_id for d in admitted],
        }
        with conn.pipeline():
            conn.execute("BEGIN")
            fences = conn.execute(OPEN_BATCH_WITH_FENCES, params)
        inserted = {row[0] for row in fences.fetchall()}
        new: dict[UUID, Delivery] = {}
        for delivery in admitted:
            if delivery.envelope.job_id in inserted:
                new.setdefault(delivery.envelope.job_id, delivery)
        return new

    def _mark_replay(self, delivery: Delivery, *, fenced: bool) -> None:
        """A replay's delivery marks its replay handled in the open transaction: processed if its fence is new."""
        if delivery.envelope.replay_of is not None:
            mark_replay_handled(
                self.conn,
                delivery.envelope.replay_of,
                "processed" if fenced else "duplicate",
                job_id=delivery.envelope.job_id,
                consumer=self.consumer.name,
            )

    def _work(
        self, delivery: Delivery, payload: Any, context: JobContext, fenced: bool, shared: list[tuple[Delivery, bool]]
    ) -> BaseException | None:
        """One job's handler (if its fence is new) and replay mark in the open transaction; the error that ends the
        transaction for it, rolled back already, or None. A lost connection or the caller's stop raises."""
        conn = self.conn
        try:
            if fenced:
                run_handler(conn, self.consumer, payload, context, still_open=_in_batch_transaction)
            self._mark_replay(delivery, fenced=fenced)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and not (conn.closed or conn.broken):
                # The caller's stop: nothing of this transaction can commit (the job in hand has no savepoint to
                # undo it); run() commits the jobs before it again, without it, then stops.
                with suppress(psycopg.Error):
                    conn.rollback()
                raise
            if conn.closed or conn.broken or isinstance(exc, KeyboardInterrupt):
                # Nothing of this transaction commits: each job before the one in hand is retried, counted, by the
                # caller; the one in hand keeps its lease.
                self.progress.rolled_back.extend(d for d, _fenced in shared)
                raise
            if not _in_batch_transaction(conn):
                exc = PermanentError(TRANSACTION_ENDED)  # it raised after ending the transaction (a refused COMMIT)
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            return exc
        return None

    def _commit(self, shared: list[tuple[Delivery, bool]]) -> None:
        conn, progress, metrics, name = self.conn, self.progress, self.runtime.metrics, self.consumer.name
        try:
            conn.execute(CLOSE_AND_COMMIT)
        except psycopg.Error:
            if conn.closed or conn.broken:  # committed or not, nobody can tell here: each is retried, counted
                progress.rolled_back.extend(d for d, _fenced in shared)
                raise
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            self._again([(d, None) for d, _fenced in shared], alone=True)  # each again, alone
            return
        for delivery, fenced in shared:
            (metrics.processed if fenced else metrics.duplicate)(name)
            progress.settled.append((delivery, Acked() if fenced else Duplicate()))

    def _again(self, deliveries: Sequence[tuple[Delivery, Any]], *, alone: bool) -> None:
        """Put ``deliveries`` back at the front of the batch, in order: to share the next transaction, or each alone."""
        self.todo.extendleft(reversed([(delivery, alone) for delivery, _a in deliveries]))


def _in_batch_transaction(conn: psycopg.Connection) -> bool:
    """Whether ``conn`` is still in the shared transaction the worker opened (its mark, :data:`MARK`, set by :data:`OPEN_BATCH_WITH_FENCES`): not if
    the handler's COMMIT was refused (migration 0027) or it rolled back, and perhaps began a transaction of its own."""
    status = conn.pgconn.transaction_status  # libpq's own, read per handler: not through ConnectionInfo's wrappers
    if status == TransactionStatus.INERROR:  # aborted: nothing of it can commit (an abort reports the mark reverted)
        return True
    return status == TransactionStatus.INTRANS and conn.pgconn.parameter_status(_MARK_NAME) == _MARK_ON


def _rolled_back_alone(todo: deque[tuple[Delivery, bool]], progress: BatchProgress) -> None:
    """The jobs of a failed shared transaction still waiting to run alone (``alone``) go to ``rolled_back``."""
    progress.rolled_back.extend(delivery for delivery, alone in todo if alone)


def _may_share(delivery: Delivery, runtime: Runtime) -> bool:
    """Whether ``delivery`` may join a shared transaction: not beyond ``max_attempts`` (a fence probe of its own), not
    ``redelivered`` (:func:`handle` first looks for the dead letter a crash before its ack may have left)."""
    return delivery.attempt <= runtime.policy.max_attempts and not delivery.redelivered


def _admit(consumer: Consumer[Any], delivery: Delivery, runtime: Runtime) -> Admitted | None:
    """A delivery's validated payload, context and fence parameters if it may share a transaction, else None.

    None for what :func:`handle` decides alone: an undecodable or invalid payload (poison, no
    transaction at all), a delivery beyond ``max_attempts`` (a fence probe of its own), a delivery
    the broker says may have been handled before (``redelivered``: :func:`handle` first looks for
    the dead letter a crash before its ack may have left).
    """
    envelope = delivery.envelope
    if (
        isinstance(envelope.payload, UndecodablePayload)
        or delivery.attempt > runtime.policy.max_attempts
        or delivery.redelivered
    ):
        return None
    try:
        payload = consumer.payload_schema.model_validate(envelope.payload)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return None  # handle() validates again and says why
    context, fence = _context_and_fence(consumer, delivery, runtime.fence_ttl)
    return payload, context, fence


def _context_and_fence(
    consumer: Consumer[Any], delivery: Delivery, fence_ttl: timedelta
) -> tuple[JobContext, dict[str, Any]]:
    """The handler's context of ``delivery`` and its fence's parameters (:data:`INSERT_FENCE`), alone or in a batch."""
    envelope = delivery.envelope
    context = JobContext(
        job_id=envelope.job_id,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        attempt=delivery.attempt,
        queue=delivery.queue,
        consumer=consumer.name,
    )
    fence = {"job_id": envelope.job_id, "consumer": consumer.name, "tenant_id": envelope.tenant_id, "ttl": fence_ttl}
    return context, fence
