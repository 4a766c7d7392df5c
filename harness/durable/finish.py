"""Phase 4, the finish: the execution's success, committed with the handler's work under the fence.

One transaction, by :func:`harness.fence.work_under_fence` (the plain path's too): BEGIN and its
first statement in one round trip — the fenced delete of the execution with the fence in its
place (:data:`harness.durable.sql.FINISH_EXECUTION`: it locks the row; the successes not yet
committed go with it, unwritten) — then the handler (``ctx.results``) and the replay mark. Any
failure there (the handler, or the COMMIT itself: a deferred constraint) rolls all of it back;
the earned checkpoints are then committed with the retry (the queue policy, its failures counted
from the history) or the ``FAILED`` (harness/durable/settle.py).
"""

from __future__ import annotations

from typing import Any

import psycopg

from harness.consumer.consumer import JobContext
from harness.durable import sql
from harness.durable.settle import failed
from harness.durable.state import Execution, StaleWrite, row
from harness.fence import work_under_fence
from harness.queue.port import Outcome

__all__ = ["finish"]


def finish(ex: Execution) -> Outcome:
    """Acked (or Duplicate: a fence written outside this execution), else the final write's failure settled."""
    envelope = ex.delivery.envelope
    final_attempt = ex.final_retries + 1
    context = JobContext(
        job_id=envelope.job_id,
        tenant_id=envelope.tenant_id,
        correlation_id=envelope.correlation_id,
        attempt=final_attempt,
        queue=ex.delivery.queue,
        consumer=ex.consumer.name,
        results=dict(ex.results),
    )
    try:
        return work_under_fence(
            ex.conn,
            ex.consumer,
            ex.payload,
            context,
            fence=(sql.FINISH_EXECUTION, {"id": ex.execution_id, "token": ex.token, "ttl": ex.runtime.fence_ttl}),
            fenced=_fenced,
            replay_of=envelope.replay_of,
            runtime=ex.runtime,
            pipelined=True,
        )
    except (KeyboardInterrupt, StaleWrite):
        raise
    except BaseException as exc:
        # All of it rolled back, the execution too: the successes (still pending) are committed
        # with the retry or the failure.
        return failed(ex, None, None, final_attempt, exc)


def _fenced(finished: psycopg.Cursor[Any]) -> bool:
    """FINISH_EXECUTION's verdict: stale (the execution is not ours: roll back), or whether it wrote the fence.

    Not written: the fence was there already, written by a consumer of the same name outside this execution.
    """
    gone, fenced = row(finished)
    if gone != 1:
        raise StaleWrite()
    return bool(fenced == 1)
