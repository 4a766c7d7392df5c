"""Running one delivery of a durable consumer: executions, checkpoints, retries and reconciliation.

The contract is docs/durable-actions.md (its tables are the rules; by effect class, the rows of
harness/consumer/effects.py); the SQL is harness/durable/sql.py. :func:`harness.handling.handle`
calls :func:`run_execution` for a consumer that declares actions, after validating the payload
(poison: a dead letter, no execution). All times are PostgreSQL's ``now()``; no worker sleeps.

The phases, one module each, share the delivery's :class:`~harness.durable.state.Execution`:
**take** (harness/durable/take.py, step 1), **run** (harness/durable/run.py, steps 2-4),
**settle** (harness/durable/settle.py: a failure's RETRY_WAIT, FAILED or RECONCILIATION_REQUIRED)
and **finish** (harness/durable/finish.py, step 5, under the fence by the plain path's function).

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
   recorded with the next commit. A failure goes by the contract's table (:func:`harness.durable.decide.decide`):
   ``RETRY_WAIT`` (failed attempt, ``run_at`` and ``RETRY_SCHEDULED`` in one fenced transaction;
   delay from :func:`harness.consumer.retry.compute_delay` on the action's policy with the error's
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

from datetime import timedelta
from typing import Any

import psycopg

from harness.consumer.consumer import Consumer
from harness.durable.finish import finish
from harness.durable.run import run
from harness.durable.state import Execution, StaleWrite
from harness.durable.take import take
from harness.fence import Runtime
from harness.queue.port import Delivery, Outcome, Stale

__all__ = ["run_execution"]


def run_execution(
    conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery, payload: Any, runtime: Runtime
) -> Outcome:
    """Run one delivery of durable ``consumer`` (its payload validated) on ``conn`` (autocommit); see the module docstring."""
    if runtime.lease <= timedelta(0):
        raise ValueError(f"lease must be positive, got {runtime.lease}")
    execution = Execution(conn, consumer, delivery, payload, runtime)
    outcome = take(execution)
    if outcome is not None:
        return outcome
    try:
        outcome = run(execution)
        return finish(execution) if outcome is None else outcome
    except StaleWrite:
        return Stale(execution_id=execution.execution_id)
