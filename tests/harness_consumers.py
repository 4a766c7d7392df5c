"""Consumers for the harness tests that run a worker in a subprocess (importable by module:object).

``blocking`` is the example points consumer (same name, same fence) whose handler, after
crediting, waits for the advisory lock ``LOCK_KEY``: a test holding that lock freezes the
worker between its work and its commit, then kills or stops it.
"""

from __future__ import annotations

import psycopg

from harness.consumer import Consumer, JobContext
from harness.examples.points import CreditPoints, consumer as points
from harness.retry import RetryPolicy

LOCK_KEY = 424242


def _credit_then_wait(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    print(f"in-handler {ctx.job_id}", flush=True)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))


blocking = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_credit_then_wait)

# The points consumer with a retry policy fixed in code whose worst-case window (~10 days) outlasts
# the default 7-day fence TTL: a late retry after the fence expired could credit twice (J-B7).
patient = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=points.handler,
                   retry_policy=RetryPolicy(max_attempts=200),
                   retry_justification="test: a policy fixed in code that outlasts the fence")
