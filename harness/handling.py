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
   which renders any exception, even one that cannot be printed, and its stack trace beside it
   by :func:`harness.errors.describe_traceback` (the retry's span, the dead letter's ``traceback``).
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

**A batch in one transaction** (:func:`handle_together`, what the worker does with a claimed
batch of a plain consumer): step 2's transaction is shared by up to
:data:`JOBS_PER_TRANSACTION` deliveries and committed once — one synchronous commit for the lot
instead of one per job — in as few round trips as the guarantees allow: ``BEGIN``, the batch's
row in ``core.open_work_batches`` (migration 0027), its mark (:data:`MARK_BATCH`) and **every
job's fence in one statement** (:data:`BATCH_FENCES`) travel together; then each new job's
handler runs, with no savepoint around it (its replay mark after it); then the row is deleted
and ``COMMIT`` sent, again together. The guarantees are step 2's, per job:

- the commit is all or none: a crash before it leaves no job's work and no job's fence (each
  comes back when its lease expires and runs once); after it, every job's work and fence;
- a failing job (an error, a swallowed database error, ``psycopg.Rollback``) rolls the shared
  transaction back — its fence and writes undone, and its batch-mates' — and is decided by step
  3 alone, on its error, settled on its own; its batch-mates did nothing wrong and run again, in
  the next shared transaction (the failing job is not run again: its outcome is decided);
- poison (step 1) never enters the transaction (its dead letter writes nothing there); a
  delivery beyond ``max_attempts`` (step 4) or ``redelivered`` (step 0) is handled alone,
  between shared transactions;
- a handler cannot commit the batch: the batch's row makes the database refuse any COMMIT
  but the worker's (which deletes the row first), rolling everything back — so no fence of a
  job not yet run can ever commit. A handler that ends the transaction (its refused COMMIT, a
  ROLLBACK — and perhaps begins one of its own) is found as soon as it returns or raises, with
  no round trip: the mark is ``SET LOCAL``, reverts however the transaction ends, and
  PostgreSQL reports it to the client as it changes. That handler is dead-lettered as in step
  2, whatever it began is rolled back, and its batch-mates run again; a second handler that
  tries the same in the next transaction meets the same refusal;
- a commit that fails (a deferred constraint, a serialization failure) commits nothing: each
  of its jobs runs again alone, through :func:`handle`, within the same call, so one job's fault
  stays its own — the refused job retried with its attempt counted, or dead-lettered;
- the worker stopping between two jobs commits the jobs run so far, once the fences of those
  not run are deleted (``core.unfence_unrun``: only fences the transaction itself wrote); the
  rest are given back unstarted;
- every way a shared transaction can fail ends with each of its jobs settled — committed alone,
  retried counted, or dead-lettered — never released uncounted: what the worker's stop or a lost
  connection keeps from running again alone, and the jobs before a handler that lost the
  connection, are in ``BatchProgress.rolled_back``, which the worker retries with the attempt
  counted. A handler raising ``KeyboardInterrupt`` (the caller's stop) rolls back its transaction
  (the job in hand has no savepoint to undo it alone); the jobs before it run and commit again,
  in a transaction of their own, before the interrupt goes on.

A consumer whose handler must not share its transaction says ``shares_transactions=False``
(harness/consumer/consumer.py); a durable consumer never shares (its executions commit their own
phases). What was decided is in a :class:`BatchProgress` the caller reads, even when the
handling raised (the caller's stop, a lost connection).

Success writes nothing but the fence: it is counted in the caller's ``metrics`` (:mod:`harness.metrics`;
the default counts nothing) (J-B9, J-AC8).
The outcome is returned, not applied: the queue adapter settles it (harness/queue/port.py).
"""

from __future__ import annotations

import random as _random
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
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
from harness.fence import DEFAULT_LEASE, INSERT_FENCE, Runtime, TransactionEnded, work_under_fence
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

    context, fence = _context_and_fence(consumer, delivery, fence_ttl)
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
    the next one again, forever). Deliveries in none of the three were not started: the caller
    gives them back.
    """

    settled: list[tuple[Delivery, Outcome | Exception]] = field(default_factory=list)
    in_hand: Delivery | None = None
    rolled_back: list[Delivery] = field(default_factory=list)


def handle_together(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    deliveries: Sequence[Delivery],
    *,
    policy: RetryPolicy,
    fence_ttl: timedelta,
    progress: BatchProgress,
    metrics: Metrics = NO_METRICS,
    random: Callable[[], float] = _random.random,
    lease: timedelta = DEFAULT_LEASE,
    each: Callable[[Delivery], AbstractContextManager[Any]] = lambda _delivery: nullcontext(),
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Handle a batch of a plain consumer on ``conn`` (autocommit, idle), its jobs' work in shared transactions.

    See the module docstring ("A batch in one transaction"). ``each(delivery)`` is entered around
    each delivery's handling (the worker's span and timing); ``stopping()`` is asked before each
    delivery: once it is true, the rest are not started. Outcomes go to ``progress``, in the
    order they become final: a shared transaction's successes when it commits.
    """
    if consumer.durable:
        raise ValueError(f"consumer {consumer.name} is durable: its executions do not share transactions")
    runtime = Runtime(policy=policy, fence_ttl=fence_ttl, lease=lease, metrics=metrics, random=random)
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


# A shared batch transaction opens with these, in one round trip: its row in core.open_work_batches (migration
# 0027: a COMMIT that finds it is refused), its mark and every job's fence.
OPEN_BATCH = "INSERT INTO core.open_work_batches DEFAULT VALUES"
# Transaction-local, so it reverts however the transaction ends; PostgreSQL reports the setting to the client as it
# changes (ParameterStatus), so after each handler the worker sees, without a round trip, whether it is still in
# the transaction it opened. It changes nothing in that transaction (only the default of transactions to come).
MARK_BATCH = "SET LOCAL default_transaction_read_only = on"
MARK = ("default_transaction_read_only", "on")
BATCH_FENCES = """
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
        progress.settled.append((delivery, handle(conn, consumer, delivery, **_keywords(runtime))))
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
    """Runs chunks of admitted deliveries, each chunk one shared transaction (see the module docstring)."""

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
                    progress.settled.append(
                        (delivery, handle(conn, self.consumer, delivery, **_keywords(self.runtime)))
                    )
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
            conn.execute(OPEN_BATCH)
            conn.execute(MARK_BATCH)
            fences = conn.execute(BATCH_FENCES, params)
        inserted = {row[0] for row in fences.fetchall()}
        new: dict[UUID, Delivery] = {}
        for delivery in admitted:
            if delivery.envelope.job_id in inserted:
                new.setdefault(delivery.envelope.job_id, delivery)
        return new

    def _work(
        self, delivery: Delivery, payload: Any, context: JobContext, fenced: bool, shared: list[tuple[Delivery, bool]]
    ) -> BaseException | None:
        """One job's handler (if its fence is new) and replay mark in the open transaction; the error that ends the
        transaction for it, rolled back already, or None. A lost connection or the caller's stop raises."""
        conn = self.conn
        try:
            if fenced:
                try:
                    self.consumer.handler(conn, payload, context)
                except psycopg.Rollback as exc:
                    raise TransientError(
                        "the handler raised psycopg.Rollback: its work and the fence were rolled"
                        " back, so nothing was committed"
                    ) from exc
                _check_batch_transaction(conn)
            if delivery.envelope.replay_of is not None:
                mark_replay_handled(
                    conn,
                    delivery.envelope.replay_of,
                    "processed" if fenced else "duplicate",
                    job_id=delivery.envelope.job_id,
                    consumer=self.consumer.name,
                )
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
            if not isinstance(exc, TransactionEnded) and not _in_batch_transaction(conn):
                exc = TransactionEnded()  # it raised after ending the transaction (its refused COMMIT, say)
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            return PermanentError(str(exc)) if isinstance(exc, TransactionEnded) else exc
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


def _check_batch_transaction(conn: psycopg.Connection) -> None:
    """After a handler: the shared transaction must still be the worker's, open and healthy (:data:`MARK_BATCH`)."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise TransientError(
            "the handler caught a database error and carried on: its transaction was aborted, so nothing was committed"
        )
    if not _in_batch_transaction(conn):
        # Its COMMIT was refused (migration 0027) or it rolled back, and perhaps began a transaction of its own.
        raise TransactionEnded()


def _in_batch_transaction(conn: psycopg.Connection) -> bool:
    """Whether ``conn`` is still in the shared transaction the worker opened (its mark, :data:`MARK_BATCH`)."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:  # aborted: nothing of it can commit (an abort reports the mark reverted)
        return True
    return status == TransactionStatus.INTRANS and conn.info.parameter_status(MARK[0]) == MARK[1]


def _rolled_back_alone(todo: deque[tuple[Delivery, bool]], progress: BatchProgress) -> None:
    """The jobs of a failed shared transaction still waiting to run alone (``alone``) go to ``rolled_back``."""
    progress.rolled_back.extend(delivery for delivery, alone in todo if alone)


def _keywords(runtime: Runtime) -> dict[str, Any]:
    return {
        "policy": runtime.policy,
        "fence_ttl": runtime.fence_ttl,
        "metrics": runtime.metrics,
        "random": runtime.random,
        "lease": runtime.lease,
    }


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
