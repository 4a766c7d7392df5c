"""Consumers for the harness tests that run a worker in a subprocess (importable by module:object).

``blocking`` is the example points consumer (same name, same fence) whose handler, after
crediting, waits for the advisory lock ``LOCK_KEY``: a test holding that lock freezes the
worker between its work and its commit, then kills or stops it.
"""

from __future__ import annotations

import psycopg

from harness.consumer import Consumer, JobContext
from harness.examples.points import CreditPoints, consumer as points

LOCK_KEY = 424242


def _credit_then_wait(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    print(f"in-handler {ctx.job_id}", flush=True)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))


blocking = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_credit_then_wait)
