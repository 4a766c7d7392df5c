"""Phase 1, the take: this delivery takes the job's execution, or says why it must not run it.

A new execution: one transaction in one round trip — BEGIN, the insert, the take, the drop of a
fenced one, COMMIT. An existing one: a second transaction that locks it. Both commit
asynchronously — cheap to lose: a take a server crash forgets makes this worker stale at its next
write, and any later synchronous commit flushes it first. (A take committed after its worker died
is as if the worker died just after it: the lease runs out, a take-over.)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import structlog
from psycopg.types.json import Jsonb

from harness.dead_letters import mark_replay_handled
from harness.durable import sql
from harness.durable.state import WORKER, Checkpoint, Execution, one
from harness.pipelined import transaction_begun_with, transaction_in_one_round_trip
from harness.queue.pgqueue import ASYNC_COMMIT
from harness.queue.port import Duplicate, Held, Outcome, RetryAfter

__all__ = ["take"]

log = structlog.get_logger()

# A lock select that finds no row raced with the deletion of a success whose fence it did not see yet.
_RACE_RETRY = timedelta(seconds=1)


class _FenceFound(Exception):
    """The take found the job's fence: roll the take back."""


def take(ex: Execution) -> Outcome | None:
    """Take the execution; an outcome when this delivery must not run it (module docstring)."""
    envelope = ex.delivery.envelope
    key = {"job_id": envelope.job_id, "consumer": ex.consumer.name}
    taking = {"lease": ex.runtime.lease, "worker": WORKER}
    insert = key | {
        "queue": ex.delivery.queue,
        "tenant_id": envelope.tenant_id,
        "correlation_id": envelope.correlation_id,
        "payload": Jsonb(envelope.payload),
        "business_scope": ex.consumer.business_scope,
    }
    _, inserted_cursor, taken_cursor, _ = transaction_in_one_round_trip(
        ex.conn,
        (ASYNC_COMMIT, None),
        (sql.INSERT_EXECUTION, insert),
        (sql.TAKE_NEW_EXECUTION, key | taking),
        (sql.DROP_FENCED_NEW_EXECUTION, key),
    )
    inserted, taken = inserted_cursor.fetchone(), taken_cursor.fetchone()
    if inserted is not None:  # new: nobody else saw it, no checkpoints yet
        assert taken is not None, "the take takes the execution it inserted"
        ex.execution_id = inserted[0]
        ex.token, ex.takes, fenced, _ = taken
        return _duplicate(ex) if fenced else None  # fenced: dropped again, nothing committed
    try:
        with transaction_begun_with(ex.conn, (ASYNC_COMMIT, None), (sql.LOCK_EXECUTION, key)) as (_, locked):
            return _take_existing(ex, key, taking, locked.fetchone())
    except _FenceFound:
        return _duplicate(ex)


def _take_existing(
    ex: Execution, key: dict[str, Any], taking: dict[str, Any], row: tuple[Any, ...] | None
) -> Outcome | None:
    """The take of an execution a delivery found, its locked ``row`` (harness/durable/executor.py, step 1), in the take's transaction."""
    envelope = ex.delivery.envelope
    if row is None:
        if one(ex.conn, sql.FENCE_EXISTS, key)[0]:
            raise _FenceFound()
        return RetryAfter(delay=_RACE_RETRY, error="the execution was being deleted: delivered again")
    execution_id, status, reason, leased, lease_left, not_due, wait_left, fenced, closed, final_retries = row
    ex.execution_id = execution_id
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
                ex.runtime.metrics.duplicate(ex.consumer.name)
                return Duplicate()
            return ex.dead_letter("permanent", reason, attempts=ex.delivery.attempt)
        ex.conn.execute(sql.RESTART_FAILED, {"id": execution_id})
        ex.conn.execute(sql.FORGET_FAILED_CHECKPOINTS, {"id": execution_id})
        final_retries = 0
    ex.token, ex.takes = one(ex.conn, sql.TAKE_EXECUTION, taking | {"id": execution_id})
    ex.final_retries = final_retries
    if status == "RUNNING":
        ex.conn.execute(
            sql.RECORD_TAKE_OVER,
            {"id": execution_id, "token": ex.token, "detail": "the previous worker's lease expired"},
        )
        log.warning("harness.execution.taken_over", **ex.fields(None, None), takes=ex.takes)
    for action, cp_status, attempts, result in ex.conn.execute(sql.LOAD_CHECKPOINTS, {"id": execution_id}):
        ex.checkpoints[action] = Checkpoint(cp_status, attempts, result)
    return None


def _duplicate(ex: Execution) -> Duplicate:
    replay_of = ex.delivery.envelope.replay_of
    if replay_of is not None:
        with ex.conn.transaction():
            mark_replay_handled(
                ex.conn, replay_of, "duplicate", job_id=ex.delivery.envelope.job_id, consumer=ex.consumer.name
            )
    ex.runtime.metrics.duplicate(ex.consumer.name)
    return Duplicate()
