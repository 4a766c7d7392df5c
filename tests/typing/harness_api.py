"""The harness's façade as a consumer service writes it, type-checked by mypy (pyproject.toml's mypy ``files``; CI runs
``uv run mypy``), never run: each ``assert_type`` states what a consumer's editor and type checker infer, so a change
to a public signature that would break a consumer's ``mypy --strict`` fails here first (stamina's tests/typing/)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, assert_type
from uuid import UUID

import psycopg
from pydantic import BaseModel

import harness
from harness import (
    Consumer,
    JobContext,
    MemoryBroker,
    PermanentError,
    RetryPolicy,
    Runtime,
    TransientError,
    Worker,
    WorkerConfig,
    WorkerGroup,
    WorkerStats,
    handle,
    memory_broker,
    publish_in_transaction,
)


class Credit(BaseModel):
    member_id: str
    points: int


def credit(conn: psycopg.Connection[Any], payload: Credit, ctx: JobContext) -> None:
    assert_type(payload.points, int)
    assert_type(ctx.job_id, UUID)
    assert_type(ctx.attempt, int)
    if payload.points > 1000:
        raise PermanentError("too many points")
    if payload.points < 0:
        raise TransientError("ledger busy")
    conn.execute("SELECT 1")


consumer = Consumer(name="credit", queue="members.credit", payload_schema=Credit, handler=credit)
assert_type(consumer, Consumer[Credit])
assert_type(consumer.payload_schema, type[Credit])


def credit_many(conn: psycopg.Connection[Any], payloads: list[Credit], contexts: list[JobContext]) -> None:
    conn.execute("SELECT 1")


batched = Consumer(
    name="credit", queue="members.credit", payload_schema=Credit, handler=credit, batch_handler=credit_many
)
assert_type(batched, Consumer[Credit])

policy = RetryPolicy(max_attempts=3, base_delay=timedelta(seconds=1))
assert_type(policy.max_attempts, int)


def handle_one(conn: psycopg.Connection[Any], delivery: harness.Delivery) -> harness.Outcome:
    runtime = Runtime(policy=policy, fence_ttl=timedelta(days=7))
    assert_type(handle(conn, consumer, delivery, runtime), harness.Outcome)
    return handle(conn, consumer, delivery, policy=policy, fence_ttl=timedelta(days=7))  # the keywords make one


def run_a_worker(url: str) -> WorkerStats:
    worker = Worker(url, consumer, policy=policy, config=WorkerConfig(fence_ttl=timedelta(days=7)))
    return worker.run(once=True)


def run_a_group(url: str) -> dict[str, WorkerStats]:
    group = WorkerGroup([Worker(url, consumer, policy=policy, config=WorkerConfig(fence_ttl=timedelta(days=7)))])
    return group.run(once=True)


def produce(conn: psycopg.Connection[Any]) -> UUID:
    job_id = publish_in_transaction(conn, "members.credit", {"member_id": "m-1", "points": 5})
    assert_type(job_id, UUID)
    return job_id


broker = memory_broker("unit-tests")
assert_type(broker, MemoryBroker)
assert_type(harness.__all__, list[str])
