"""The consumer of the failover rig's drains (tests/support/failover.py), loaded by name by a worker subprocess.

``effect`` records each run of its work as one row of the rig's independent effects table
(``public.failover_effects``), in the work's transaction: a job whose effect is counted twice
was applied twice, one with no effect and no dead letter was lost.
"""

from __future__ import annotations

import psycopg
from pydantic import BaseModel, ConfigDict

from harness.consumer.consumer import Consumer, JobContext

QUEUE = "failover.effect"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int


def _record(conn: psycopg.Connection, payload: Job, ctx: JobContext) -> None:
    conn.execute("INSERT INTO public.failover_effects (job_id) VALUES (%s)", (ctx.job_id,))


effect = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Job, handler=_record)
