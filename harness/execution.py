"""Running one delivery of a durable consumer: executions, checkpoints, retries and reconciliation.

The contract is docs/durable-actions.md (its tables are the rules); the SQL is
harness/execution_sql.py. :func:`harness.handling.handle` calls :func:`run_execution` for a
consumer that declares actions, after validating the payload (poison: a dead letter, no
execution). All times are PostgreSQL's ``now()``; no worker sleeps.

1. **Take** — one transaction (asynchronous commit, for that transaction alone: a forgotten take
   only makes this worker stale): insert the execution if new and take it at once unless the job's fence exists (all
   in one round trip, harness/pipelined.py: a fenced one is deleted again before the COMMIT);
   else lock it (a second transaction), probe the fence (a fence: ``Duplicate``), then by state: ``RUNNING`` under a live
   lease or ``RETRY_WAIT`` not yet due: ``RetryAfter`` until then; ``RECONCILIATION_REQUIRED``:
   ``Held`` (acked: it waits for an operator); ``FAILED``: a replay (``replay_of``) starts it
   again, any other delivery is the same failure (``DeadLettered``) — or, closed by an operator's
   ``CLOSE_WITHOUT_TRANSITION``, a ``Duplicate`` (no dead letter to replay what was closed); else a new fencing token and
   a lease ``now() + lease`` (``harness.execution.taken_over`` when it took a lost worker's lease).
2. **Recover** the write checkpoints a lost worker left ``STARTED`` (or ``UNCERTAIN``): a
   ``NON_IDEMPOTENT_WRITE`` → ``RECONCILIATION_REQUIRED``; an ``IDEMPOTENT_WRITE`` is re-sent with
   the same key while attempts remain, else ``RECONCILIATION_REQUIRED``.
3. **Crash-loop bound** — a job taken more times than all its attempts allow (the sum of its
   actions' ``max_attempts`` and the queue policy's) has killed every worker that took it:
   ``FAILED`` (``exhausted``) — or ``RECONCILIATION_REQUIRED`` if a write is in doubt.
4. **Run** each action not ``SUCCEEDED``, in order. A write first commits its ``STARTED``
   checkpoint, synchronously (whatever the database's default: the session's pin, harness/pg.py)
   and fenced — the durable proof that nothing was sent is the absence of that row (a ``NON_IDEMPOTENT_WRITE``'s in an explicit transaction, so that only a live
   worker commits it; an ``IDEMPOTENT_WRITE``'s as one autocommit statement). Successes are
   recorded with the next commit. A failure goes by the contract's table (:func:`decide`):
   ``RETRY_WAIT`` (failed attempt, ``run_at`` and ``RETRY_SCHEDULED`` in one fenced transaction;
   delay from :func:`harness.retry.compute_delay` on the action's policy with the error's
   ``Retry-After``), ``FAILED`` (→ ``DeadLettered``, carrying ``replay_of``) or
   ``RECONCILIATION_REQUIRED`` (→ ``Held``).
5. **Finish** — one transaction: the fenced delete of the execution with the fence in its place
   (one statement), the handler (``ctx.results``) and the replay mark. Any failure there (the handler, or the COMMIT itself: a
   deferred constraint) rolls all of it back; the earned checkpoints are then committed with the
   retry (the queue policy, its failures counted from the history) or the ``FAILED``.

Any fenced write that matches nothing — the lease expired or another worker took the execution —
rolls back its transaction and ends the delivery ``Stale``: nothing changes, nothing is settled.

Events: ``harness.execution.taken_over``, ``harness.execution.retry_scheduled``,
``harness.execution.reconciliation_required``, ``harness.execution.failed`` (fields ``consumer``,
``job_id``, ``execution_id``, ``action`` — None for the final write —, ``attempt``,
``correlation_id``, and ``delay_s`` / ``reason`` / ``error``).
"""

from __future__ import annotations

import os
import random as _random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import psycopg
import structlog
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from harness import execution_sql as sql
from harness.actions import Action, ActionContext, Effect, idempotency_key
from harness.consumer import Consumer, JobContext
from harness.dead_letters import DeadLetter, describe_error, mark_replay_handled, validation_problems
from harness.errors import NotSent, PermanentError, TransientError
from harness.execution_window import max_takes
from harness.fence import check_work_transaction
from harness.metrics import NO_METRICS, Metrics
from harness.pg import server_now
from harness.pgqueue import ASYNC_COMMIT
from harness.pipelined import Statement, transaction_begun_with, transaction_in_one_round_trip
from harness.queue import (
    Acked,
    DeadLettered,
    Delivery,
    Duplicate,
    Held,
    InvalidPayload,
    Outcome,
    RetryAfter,
    Stale,
    check_payload,
)
from harness.retry import RetryPolicy, compute_delay

__all__ = ["Decision", "OutputBroken", "WorkerLost", "decide", "run_execution"]

log = structlog.get_logger()

# A lock select that finds no row raced with the deletion of a success whose fence it did not see yet.
_RACE_RETRY = timedelta(seconds=1)


class OutputBroken(Exception):
    """An action's answer broke its declared ``output`` contract (or is not JSON): it will not become valid."""


class _Stale(Exception):
    """A fenced write matched nothing: roll back, change nothing."""


class _FenceFound(Exception):
    """The take found the job's fence: roll the take back."""


@dataclass(frozen=True)
class Decision:
    """What a failed attempt leads to (docs/durable-actions.md, the failure table)."""

    kind: Literal["retry", "failed", "reconcile"]
    reason: Literal["permanent", "exhausted"] | None = None  # for "failed"


def decide(effect: Effect | None, error: BaseException, attempt: int, max_attempts: int) -> Decision:
    """The contract's failure table; ``effect`` None is the final local write (the queue policy).

    A ``NotSent`` failure proves the request never left, so a ``NON_IDEMPOTENT_WRITE`` out of
    attempts is ``FAILED`` (every attempt unsent), not uncertain; an ``IDEMPOTENT_WRITE``'s earlier
    attempts may have been sent, so it is reconciled.
    """
    exhausted = attempt >= max_attempts
    if isinstance(error, OutputBroken):
        return Decision("reconcile") if effect is not None and effect.writes else Decision("failed", "permanent")
    if isinstance(error, PermanentError):
        return Decision("failed", "permanent")
    if effect is None or effect is Effect.READ_ONLY:
        return Decision("failed", "exhausted") if exhausted else Decision("retry")
    if isinstance(error, NotSent) and not exhausted:
        return Decision("retry")
    if effect is Effect.NON_IDEMPOTENT_WRITE:
        return Decision("failed", "exhausted") if isinstance(error, NotSent) else Decision("reconcile")
    return Decision("reconcile") if exhausted else Decision("retry")


@dataclass
class _Checkpoint:
    status: str
    attempts: int
    result: Any = None


@dataclass
class _Record:
    """A checkpoint write waiting for the next commit (or part of it)."""

    action: Action
    position: int
    status: str
    attempts: int
    result: Any = None
    error: str | None = None


@dataclass
class _Run:
    """One delivery of a durable consumer, from its take to its outcome."""

    conn: psycopg.Connection
    consumer: Consumer
    delivery: Delivery
    payload: Any
    policy: RetryPolicy
    fence_ttl: timedelta
    lease: timedelta
    metrics: Metrics
    random: Callable[[], float]
    execution_id: int = 0
    token: int = 0
    checkpoints: dict[str, _Checkpoint] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    pending: list[_Record] = field(default_factory=list)  # successes not yet committed
    takes: int = 0
    final_retries: int = 0  # failed attempts of the final write, from the history

    # --- the take -------------------------------------------------------------------------------

    def take(self) -> Outcome | None:
        """Take the execution; an outcome when this delivery must not run it.

        A new execution: one transaction in one round trip — BEGIN, the insert, the take, the drop
        of a fenced one, COMMIT. An existing one: a second transaction that locks it. Both commit
        asynchronously — cheap to lose: a take a server crash forgets makes this worker stale at
        its next write, and any later synchronous commit flushes it first. (A take committed after
        its worker died is as if the worker died just after it: the lease runs out, a take-over.)
        """
        envelope = self.delivery.envelope
        key = {"job_id": envelope.job_id, "consumer": self.consumer.name}
        take = {"lease": self.lease, "worker": _WORKER}
        insert = key | {
            "queue": self.delivery.queue,
            "tenant_id": envelope.tenant_id,
            "correlation_id": envelope.correlation_id,
            "payload": Jsonb(envelope.payload),
            "business_scope": self.consumer.business_scope,
        }
        _, inserted_cursor, taken_cursor, _ = transaction_in_one_round_trip(
            self.conn,
            (ASYNC_COMMIT, None),
            (sql.INSERT_EXECUTION, insert),
            (sql.TAKE_NEW_EXECUTION, key | take),
            (sql.DROP_FENCED_NEW_EXECUTION, key),
        )
        inserted, taken = inserted_cursor.fetchone(), taken_cursor.fetchone()
        if inserted is not None:  # new: nobody else saw it, no checkpoints yet
            assert taken is not None, "the take takes the execution it inserted"
            self.execution_id = inserted[0]
            self.token, self.takes, fenced, _ = taken
            return self._duplicate() if fenced else None  # fenced: dropped again, nothing committed
        try:
            with transaction_begun_with(self.conn, (ASYNC_COMMIT, None), (sql.LOCK_EXECUTION, key)) as (_, locked):
                return self._take_existing(key, take, locked.fetchone())
        except _FenceFound:
            return self._duplicate()

    def _take_existing(self, key: dict[str, Any], take: dict[str, Any], row: tuple[Any, ...] | None) -> Outcome | None:
        """The take of an execution a delivery found, its locked ``row`` (see the module docstring, step 1), in the take's transaction."""
        envelope = self.delivery.envelope
        if row is None:
            if _one(self.conn, sql.FENCE_EXISTS, key)[0]:
                raise _FenceFound()
            return RetryAfter(delay=_RACE_RETRY, error="the execution was being deleted: delivered again")
        execution_id, status, reason, leased, lease_left, not_due, wait_left, fenced, closed, final_retries = row
        self.execution_id = execution_id
        if fenced:
            raise _FenceFound()
        if status == "RUNNING" and leased:
            return RetryAfter(delay=lease_left, error=f"execution {execution_id} is running under another lease")
        if status == "RETRY_WAIT" and not_due:
            return RetryAfter(delay=wait_left, error=f"execution {execution_id} waits to retry")
        if status == "RECONCILIATION_REQUIRED":
            return Held(execution_id=execution_id, reason=reason)
        if status == "FAILED":
            if envelope.replay_of is None:
                if closed:  # an operator closed it: a dead letter's replay would redo what was closed
                    self.metrics.duplicate(self.consumer.name)
                    return Duplicate()
                return self._dead_letter("permanent", reason, attempts=self.delivery.attempt)
            self.conn.execute(sql.RESTART_FAILED, {"id": execution_id})
            self.conn.execute(sql.FORGET_FAILED_CHECKPOINTS, {"id": execution_id})
            final_retries = 0
        self.token, self.takes = _one(self.conn, sql.TAKE_EXECUTION, take | {"id": execution_id})
        self.final_retries = final_retries
        if status == "RUNNING":
            self.conn.execute(
                sql.RECORD_TAKE_OVER,
                {"id": execution_id, "token": self.token, "detail": "the previous worker's lease expired"},
            )
            log.warning("harness.execution.taken_over", **self._fields(None, None), takes=self.takes)
        for action, cp_status, attempts, result in self.conn.execute(sql.LOAD_CHECKPOINTS, {"id": execution_id}):
            self.checkpoints[action] = _Checkpoint(cp_status, attempts, result)
        return None

    def _duplicate(self) -> Duplicate:
        replay_of = self.delivery.envelope.replay_of
        if replay_of is not None:
            with self.conn.transaction():
                mark_replay_handled(self.conn, replay_of, "duplicate")
        self.metrics.duplicate(self.consumer.name)
        return Duplicate()

    # --- recovery, the crash-loop bound, the actions ----------------------------------------------

    def run(self) -> Outcome:
        outcome = self.take()
        if outcome is not None:
            return outcome
        try:
            return self._run_taken()
        except _Stale:
            return Stale(execution_id=self.execution_id)

    def _run_taken(self) -> Outcome:
        for position, action in enumerate(self.consumer.actions):
            checkpoint = self.checkpoints.get(action.name)
            if checkpoint is None or not action.effect.writes or checkpoint.status not in ("STARTED", "UNCERTAIN"):
                continue
            lost = WorkerLost("the worker was lost while the request may have been sent")
            if action.effect is Effect.NON_IDEMPOTENT_WRITE or checkpoint.status == "UNCERTAIN":
                return self._reconcile(action, position, checkpoint.attempts, lost)
            if checkpoint.attempts >= action.policy.max_attempts:
                return self._reconcile(action, position, checkpoint.attempts, lost)
        if self.takes > max_takes(self.consumer, self.policy):
            return self._crash_looped()
        for position, action in enumerate(self.consumer.actions):
            checkpoint = self.checkpoints.get(action.name)
            if checkpoint is not None and checkpoint.status == "SUCCEEDED":
                try:
                    self.results[action.name] = _validated(action, checkpoint.result, "its stored result (SUCCEEDED)")
                except OutputBroken as exc:
                    # A deploy changed the contract. The action's success is certain and its checkpoint is
                    # never rewritten: FAILED with it intact, for a consumer that accepts it to replay.
                    return self._fail(action, None, checkpoint.attempts, exc, "permanent")
                continue
            outcome = self._run_action(action, position, (checkpoint.attempts if checkpoint else 0) + 1)
            if outcome is not None:
                return outcome
        return self._finish()

    def _crash_looped(self) -> Outcome:
        error = WorkerLost(
            f"taken {self.takes} times, more than its {max_takes(self.consumer, self.policy)} attempts allow:"
            " no take settled it (each worker that took it was lost, or failed to settle it: harness.worker.delivery_failed)"
        )
        for position, action in enumerate(self.consumer.actions):
            checkpoint = self.checkpoints.get(action.name)
            if action.effect.writes and checkpoint is not None and checkpoint.status != "SUCCEEDED":
                return self._reconcile(action, position, checkpoint.attempts, error)
        return self._fail(None, None, self.takes, error, "exhausted")

    def _run_action(self, action: Action, position: int, attempt: int) -> Outcome | None:
        started = _Record(action, position, "STARTED", attempt)
        if action.effect is Effect.NON_IDEMPOTENT_WRITE:
            # The durable proof of absence: the request is sent only after this synchronous commit.
            # An explicit transaction: only a live worker's COMMIT ends it (a statement left waiting
            # on a lock by a worker that died is rolled back, not committed after its death).
            # BEGIN goes with the statement (one round trip); the COMMIT, alone, only once its result is seen.
            with transaction_begun_with(self.conn, self._renewal(self._with_pending(started))) as (renewed,):
                _check_held(renewed)
        elif action.effect is Effect.IDEMPOTENT_WRITE:
            # One statement in autocommit, one round trip: if it commits after this worker died, the
            # write is merely re-sent with its key (or reconciled once its attempts are used).
            self._renew_and_record(self._with_pending(started))
        envelope = self.delivery.envelope
        context = ActionContext(
            job_id=envelope.job_id,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            consumer=self.consumer.name,
            action=action.name,
            attempt=attempt,
            idempotency_key=idempotency_key(envelope.job_id, self.consumer.name, action.name),
            results=dict(self.results),
        )
        try:
            value = _validated(action, action.call(self.payload, context))
        except KeyboardInterrupt:
            raise  # the caller's stop: a write's STARTED checkpoint stays, the next take decides
        except BaseException as exc:
            return self._failed(action, position, attempt, exc)
        self.results[action.name] = value
        stored = value.model_dump(mode="json") if action.output is not None else value
        self.pending.append(_Record(action, position, "SUCCEEDED", attempt, result=stored))
        return None

    def _failed(self, action: Action | None, position: int | None, attempt: int, error: BaseException) -> Outcome:
        max_attempts = action.policy.max_attempts if action is not None else self.policy.max_attempts
        decision = decide(action.effect if action is not None else None, error, attempt, max_attempts)
        if decision.kind == "retry":
            return self._retry(action, position, attempt, error)
        if decision.kind == "reconcile":
            assert action is not None and position is not None
            return self._reconcile(action, position, attempt, error)
        assert decision.reason is not None
        return self._fail(action, position, attempt, error, decision.reason)

    # --- the settling transactions ------------------------------------------------------------

    def _retry(self, action: Action | None, position: int | None, attempt: int, error: BaseException) -> Outcome:
        policy = action.policy if action is not None else self.policy
        retry_after = error.retry_after if isinstance(error, TransientError) else None
        detail = describe_error(error)
        with self.conn.transaction():
            # An HTTP-date Retry-After is measured against PostgreSQL's clock, read once.
            now = server_now(self.conn) if isinstance(retry_after, str) else None
            delay = compute_delay(policy, attempt, retry_after=retry_after, now=now, random=self.random)
            self._renew_and_record(
                self._with_pending(self._failure_record(action, position, "FAILED", attempt, detail))
            )
            moved = self.conn.execute(
                sql.SCHEDULE_RETRY,
                {
                    "id": self.execution_id,
                    "token": self.token,
                    "delay": delay,
                    "action": action.name if action else None,
                    "attempt": attempt,
                    "detail": detail,
                },
            ).fetchone()
            if moved is None:
                raise _Stale()
        self.metrics.retry(self.consumer.name)
        log.info(
            "harness.execution.retry_scheduled",
            **self._fields(action, attempt),
            delay_s=delay.total_seconds(),
            error=detail,
        )
        return RetryAfter(delay=delay, error=detail)

    def _reconcile(self, action: Action, position: int, attempt: int, error: BaseException) -> Held:
        detail = describe_error(error)
        reason = f"{action.name} ({action.effect}): {detail}"
        self._settle(
            "RECONCILIATION_REQUIRED",
            action,
            attempt,
            reason,
            _Record(action, position, "UNCERTAIN", attempt, error=detail),
        )
        log.warning("harness.execution.reconciliation_required", **self._fields(action, attempt), reason=reason)
        return Held(execution_id=self.execution_id, reason=reason)

    def _fail(
        self,
        action: Action | None,
        position: int | None,
        attempt: int,
        error: BaseException,
        why: Literal["permanent", "exhausted"],
    ) -> DeadLettered:
        detail = describe_error(error)
        reason = f"{action.name if action else 'the final write'}: {detail}"
        self._settle(
            "FAILED", action, attempt, reason, self._failure_record(action, position, "FAILED", attempt, detail)
        )
        log.warning("harness.execution.failed", **self._fields(action, attempt), reason=why, error=detail)
        return self._dead_letter(why, reason, attempts=attempt)

    def _settle(self, status: str, action: Action | None, attempt: int, reason: str, record: _Record | None) -> None:
        with self.conn.transaction():
            self._renew_and_record(self._with_pending(record))
            moved = self.conn.execute(
                sql.SETTLE_EXECUTION,
                {
                    "id": self.execution_id,
                    "token": self.token,
                    "status": status,
                    "reason": reason,
                    "action": action.name if action else None,
                    "attempt": attempt,
                },
            ).fetchone()
            if moved is None:
                raise _Stale()

    def _failure_record(
        self, action: Action | None, position: int | None, status: str, attempt: int, detail: str
    ) -> _Record | None:
        if action is None or position is None:
            return None  # the final write has no checkpoint
        return _Record(action, position, status, attempt, error=detail)

    def _with_pending(self, record: _Record | None) -> list[_Record]:
        """The successes not yet committed, then ``record``: what the next commit writes (and so no longer pending)."""
        records, self.pending = [*self.pending, *([record] if record is not None else [])], []
        return records

    def _renew_and_record(self, records: list[_Record]) -> None:
        """First statement of a fenced transaction (or one alone, in autocommit): renew the lease and
        write ``records``, or raise _Stale (having written nothing)."""
        _check_held(self.conn.execute(*self._renewal(records)))

    def _renewal(self, records: list[_Record]) -> Statement:
        """The statement that renews the lease and writes ``records`` (its row: held, written)."""
        return (
            sql.RENEW_LEASE_AND_RECORD,
            {
                "id": self.execution_id,
                "token": self.token,
                "lease": self.lease,
                "actions": [r.action.name for r in records],
                "positions": [r.position for r in records],
                "effects": [str(r.action.effect) for r in records],
                "statuses": [r.status for r in records],
                "attempts": [r.attempts for r in records],
                "results": [Jsonb(r.result) if r.status == "SUCCEEDED" else None for r in records],
                "errors": [r.error for r in records],
            },
        )

    # --- the final transaction ------------------------------------------------------------------

    def _finish(self) -> Outcome:
        envelope = self.delivery.envelope
        final_attempt = self.final_retries + 1
        context = JobContext(
            job_id=envelope.job_id,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            attempt=final_attempt,
            queue=self.delivery.queue,
            consumer=self.consumer.name,
            results=dict(self.results),
        )
        duplicate = False
        try:
            # BEGIN and the first statement in one round trip: the fenced delete (it locks the row;
            # the successes go with it, unwritten) and the fence.
            finish = {"id": self.execution_id, "token": self.token, "ttl": self.fence_ttl}
            with transaction_begun_with(self.conn, (sql.FINISH_EXECUTION, finish)) as (finished,):
                gone, fenced = _row(finished)
                if gone != 1:
                    raise _Stale()
                if fenced != 1:
                    duplicate = True  # written by a consumer of the same name outside this execution
                else:
                    try:
                        self.consumer.handler(self.conn, self.payload, context)
                    except psycopg.Rollback as exc:
                        raise TransientError(
                            "the handler raised psycopg.Rollback: its work and the fence were rolled back"
                        ) from exc
                    check_work_transaction(self.conn)
                if envelope.replay_of is not None:
                    mark_replay_handled(self.conn, envelope.replay_of, "duplicate" if duplicate else "processed")
        except (KeyboardInterrupt, _Stale):
            raise
        except BaseException as exc:
            # All of it rolled back, the execution too: the successes (still pending) are committed
            # with the retry or the failure.
            return self._failed(None, None, final_attempt, exc)
        if duplicate:
            self.metrics.duplicate(self.consumer.name)
            return Duplicate()
        self.metrics.processed(self.consumer.name)
        return Acked()

    # --- helpers ------------------------------------------------------------------------------

    def _dead_letter(self, why: Literal["permanent", "exhausted"], reason: str, *, attempts: int) -> DeadLettered:
        envelope = self.delivery.envelope
        self.metrics.dead_lettered(self.consumer.name, why)
        return DeadLettered(
            reason=why,
            letter=DeadLetter(
                job_id=envelope.job_id,
                queue=self.delivery.queue,
                consumer=self.consumer.name,
                payload=envelope.payload,
                attempts=max(1, attempts),
                last_error=f"execution {self.execution_id} FAILED: {reason}",
                tenant_id=envelope.tenant_id,
                correlation_id=envelope.correlation_id,
                replay_of=envelope.replay_of,
            ),
        )

    def _fields(self, action: Action | None, attempt: int | None) -> dict[str, Any]:
        return {
            "consumer": self.consumer.name,
            "job_id": str(self.delivery.envelope.job_id),
            "execution_id": self.execution_id,
            "action": action.name if action is not None else None,
            "attempt": attempt,
            "correlation_id": self.delivery.envelope.correlation_id,
        }


class WorkerLost(Exception):
    """What an interrupted attempt is recorded as: the worker running it was lost."""


_WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _one(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """The one row a statement always returns."""
    return _row(conn.execute(statement, params))


def _row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The one row a statement always returns, from its cursor."""
    row = cursor.fetchone()
    assert row is not None, "the statement returns one row"
    return row


def _check_held(renewed: psycopg.Cursor[Any]) -> None:
    """RENEW_LEASE_AND_RECORD's verdict: raise _Stale unless this worker still held the lease."""
    held, _written = _row(renewed)
    if held != 1:
        raise _Stale()


def _validated(action: Action, value: Any, what: str = "the answer") -> Any:
    """The result as the action's ``output`` model (or the JSON value itself), else :class:`OutputBroken`.

    ``what`` names the value in the error: the answer just received, or a checkpoint's stored result
    (checked against today's ``output``, which a deploy may have changed since it was stored)."""
    if action.output is not None:
        try:
            return action.output.model_validate(value)
        except Exception as exc:  # a validator's TypeError is not wrapped by pydantic: broken all the same
            problems = validation_problems(exc, what) if isinstance(exc, ValidationError) else []
            first = f"{problems[0]} ({len(problems)} problem(s))" if problems else describe_error(exc)
            contract = "today's output contract" if what != "the answer" else "its output contract"
            raise OutputBroken(f"{action.name}: {what} breaks {contract}: {first}") from exc
    try:
        check_payload(value)
    except InvalidPayload as exc:
        raise OutputBroken(f"{action.name}: {what} cannot be stored as JSON: {exc}") from exc
    return value


def run_execution(
    conn: psycopg.Connection,
    consumer: Consumer,
    delivery: Delivery,
    payload: Any,
    *,
    policy: RetryPolicy,
    fence_ttl: timedelta,
    lease: timedelta,
    metrics: Metrics = NO_METRICS,
    random: Callable[[], float] = _random.random,
) -> Outcome:
    """Run one delivery of durable ``consumer`` (its payload validated) on ``conn`` (autocommit); see the module docstring."""
    if lease <= timedelta(0):
        raise ValueError(f"lease must be positive, got {lease}")
    return _Run(conn, consumer, delivery, payload, policy, fence_ttl, lease, metrics, random).run()
