"""The consumer of the failover rig's drains (tests/support/failover.py), loaded by name by a worker subprocess.

``effect`` records each run of its work as one row of the rig's independent effects table
(``public.failover_effects``), in the work's transaction: a job whose effect is counted twice
was applied twice, one with no effect and no dead letter was lost. A job's ``work_ms`` is how long
its work holds the transaction open (``pg_sleep``): a drain slow enough to be failed over many
times, with transactions in flight when the primary dies.

``sender`` is durable: one NON_IDEMPOTENT_WRITE, ``send``, whose requests :data:`SENT` counts per key, then the
effect recorded as ``effect``'s.
"""

from __future__ import annotations

import psycopg
from pydantic import BaseModel, ConfigDict

from harness.consumer.actions import Action, ActionContext, Effect
from harness.consumer.consumer import Consumer, JobContext

QUEUE = "failover.effect"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int
    work_ms: int = 0


def _record(conn: psycopg.Connection, payload: Job, ctx: JobContext) -> None:
    if payload.work_ms:
        conn.execute("SELECT pg_sleep(%s)", (payload.work_ms / 1000,))
    conn.execute("INSERT INTO public.failover_effects (job_id) VALUES (%s)", (ctx.job_id,))


effect = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Job, handler=_record)


# What ``sender``'s NON_IDEMPOTENT_WRITE sent, one idempotency key per request: a mock provider counting its sends
# (the consumer runs in the test's own process).
SENT: list[str] = []
SENDER_QUEUE = "failover.sender"


def _send(payload: Job, ctx: ActionContext) -> None:
    SENT.append(ctx.idempotency_key)


sender = Consumer(
    name=SENDER_QUEUE,
    queue=SENDER_QUEUE,
    payload_schema=Job,
    handler=_record,
    actions=(Action(name="send", effect=Effect.NON_IDEMPOTENT_WRITE, call=_send),),
)
