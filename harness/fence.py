"""The work under the fence, one function for plain and durable consumers, and the run-wide values it runs with.

:func:`work_under_fence` is the one transaction in which a job's work commits (J-B1): its first
statement writes the job's fence (:data:`INSERT_FENCE` for a plain consumer, harness/handling.py;
the fenced delete of the execution with the fence in its place for a durable one,
harness/durable/finish.py), then the handler runs on the same connection, the transaction's health
is checked (:func:`check_work_transaction`) and a replay is marked handled — all of it committed
together, or none of it. A fence already there is a duplicate: no handler, the replay marked
``duplicate``. Any exception rolls all of it back and is raised for the caller's failure path.

:class:`Runtime` holds what every delivery a worker handles shares — the queue's retry policy,
the fence's TTL, the lease, the metrics and the random source of the retry jitter — as one
object, made once by the worker and passed from :func:`harness.handling.handle` down to each phase
of a durable execution. :func:`run_handler` is the handler block of both fence paths: the handler,
a ``psycopg.Rollback`` it raised refused, the transaction's health checked.

:func:`harness.handling.handle_together` does the same work for a batch of jobs in one shared
transaction; a handler that ends that transaction itself (COMMIT, ROLLBACK) is
a permanent failure there (``TRANSACTION_ENDED``).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import mark_replay_handled
from harness.errors import PermanentError, TransientError
from harness.metrics import NO_METRICS, Metrics
from harness.pipelined import Statement, transaction_begun_with
from harness.queue.port import Acked, Duplicate

__all__ = [
    "DEFAULT_LEASE",
    "INSERT_FENCE",
    "Runtime",
    "check_work_transaction",
    "run_batch_handler",
    "run_handler",
    "work_under_fence",
]

# A durable execution's lease when the caller gives none: the worker's default (harness/worker.py).
DEFAULT_LEASE = timedelta(seconds=30)

# The fence (J-B1): inserted first in the work transaction; RETURNING 1 tells new from duplicate.
INSERT_FENCE = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)
VALUES (%(job_id)s, %(consumer)s, %(tenant_id)s, now() + %(ttl)s)
ON CONFLICT DO NOTHING
RETURNING 1
"""


# What the harness records when a handler did something to its transaction that it may not.
HANDLER_ROLLED_BACK = (
    "the handler raised psycopg.Rollback: its work and the fence were rolled back, so nothing was committed"
)
TRANSACTION_ABORTED = (
    "the handler caught a database error and carried on: its transaction was aborted, so nothing was committed"
)
TRANSACTION_ENDED = (
    "the handler ended the work transaction itself (COMMIT or ROLLBACK): its writes escaped the fence, so the job"
    " is not retried; fix the handler, then review the job"
)


@dataclass(frozen=True)
class Runtime:
    """The run-wide values of every delivery a worker handles (module docstring).

    ``policy`` is the queue's retry policy (a consumer's own, if it declares one, wins:
    ``Consumer.policy``); ``lease`` the worker's, which a durable execution takes; ``random`` the
    retry jitter's source, in [0, 1).
    """

    policy: RetryPolicy
    fence_ttl: timedelta
    lease: timedelta = DEFAULT_LEASE
    metrics: Metrics = NO_METRICS
    random: Callable[[], float] = field(default=_random.random)

    def __post_init__(self) -> None:
        if self.fence_ttl <= timedelta(0):
            raise ValueError(f"fence_ttl must be positive, got {self.fence_ttl}")


def work_under_fence(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    payload: Any,
    context: JobContext,
    *,
    fence: Statement,
    fenced: Callable[[psycopg.Cursor[Any]], bool],
    replay_of: int | None,
    runtime: Runtime,
    pipelined: bool,
) -> Acked | Duplicate:
    """Write the fence and do the job's work in one transaction on ``conn`` (autocommit, idle); see the module docstring.

    ``fence`` is the transaction's first statement; ``fenced`` reads its cursor: True when this
    transaction wrote the fence, False when it was there already (a duplicate), or raises (the
    transaction is rolled back). ``pipelined``: BEGIN travels with ``fence`` in one round trip
    (harness/pipelined.py), else BEGIN is sent alone first. Counted in
    ``runtime.metrics`` once committed.
    """
    duplicate = False
    with _begun(conn, fence, pipelined=pipelined) as cursor:
        if not fenced(cursor):
            duplicate = True  # done before: no handler
        else:
            run_handler(conn, consumer, payload, context)
        if replay_of is not None:
            outcome = "duplicate" if duplicate else "processed"
            mark_replay_handled(conn, replay_of, outcome, job_id=context.job_id, consumer=consumer.name)
    if duplicate:
        runtime.metrics.duplicate(consumer.name)
        return Duplicate()
    runtime.metrics.processed(consumer.name)
    return Acked()


@contextmanager
def _begun(conn: psycopg.Connection, first: Statement, *, pipelined: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A transaction opened by ``first``, its cursor yielded; committed at the end of the block, rolled back on an exception."""
    if pipelined:
        with transaction_begun_with(conn, first) as (cursor,):
            yield cursor
    else:
        with conn.transaction():
            yield conn.execute(*first)


def _open(conn: psycopg.Connection) -> bool:
    """A transaction alone is the handler's until the harness commits it: open unless the handler ended it."""
    return conn.info.transaction_status != TransactionStatus.IDLE


def run_handler(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    payload: Any,
    context: JobContext,
    *,
    still_open: Callable[[psycopg.Connection], bool] = _open,
) -> None:
    """The handler on the fence's transaction, then that transaction checked (:func:`check_work_transaction`): the one
    handler block of a job alone (:func:`work_under_fence`) and of a job in a shared transaction
    (harness/handling.py, whose ``still_open`` tells its own transaction from one the handler began)."""
    try:
        consumer.handler(conn, payload, context)
    except psycopg.Rollback as exc:  # it would end the block quietly: nothing committed, yet acked
        raise TransientError(HANDLER_ROLLED_BACK) from exc
    check_work_transaction(conn, still_open=still_open)


def run_batch_handler(
    conn: psycopg.Connection,
    consumer: Consumer[Any],
    payloads: list[Any],
    contexts: list[JobContext],
    *,
    still_open: Callable[[psycopg.Connection], bool],
) -> None:
    """The consumer's ``batch_handler`` on a shared transaction holding every one of these jobs' fences, then that
    transaction checked, as :func:`run_handler` does for one job (harness/handling.py calls it)."""
    assert consumer.batch_handler is not None
    try:
        consumer.batch_handler(conn, payloads, contexts)
    except psycopg.Rollback as exc:
        raise TransientError(HANDLER_ROLLED_BACK) from exc
    check_work_transaction(conn, still_open=still_open)


def check_work_transaction(
    conn: psycopg.Connection,
    *,
    still_open: Callable[[psycopg.Connection], bool] = _open,
) -> None:
    """Refuse to commit unless the handler left the fence's transaction open and healthy.

    A swallowed database error leaves it aborted: psycopg's COMMIT would then silently roll
    back, and the job would be acked with nothing done. A COMMIT or ROLLBACK run by the handler
    ends it early (``still_open`` false): writes after that escape the fence, so a retry could
    apply them twice.
    """
    if conn.pgconn.transaction_status == TransactionStatus.INERROR:
        raise TransientError(TRANSACTION_ABORTED)
    if not still_open(conn):
        raise PermanentError(TRANSACTION_ENDED)
