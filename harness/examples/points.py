"""Example consumer: credit loyalty points to a member, exactly once.

Queue and consumer ``points.credit``; payload ``{"member_id": "m-42", "points": 50}``
(``points`` a whole number from 1 to 1 000 000; anything else is poison). The handler confirms
the credit with the loyalty ledger (a provider; the default one always agrees) and adds the
points to ``example.loyalty_points`` — in the fence's transaction, so a duplicate delivery
credits nothing and a crash credits nothing.

Its table is its own, not the platform's: ``core-jobs migrate`` does not create it (migration
0023 removes the one older migrations made, when empty). :func:`create_table` does — the demo
calls it, and so does the tests' template database. Run it: ``create_table`` on the database,
then ``core-jobs worker --consumer harness.examples.points:consumer``.

:class:`OutageLedger` is a provider that fails on purpose, for the demo and the tests: it
answers "timed out" (transient) for the first N attempts of chosen members, and "unknown
member" (permanent) for others. It decides by the attempt number, so it behaves the same in
every worker process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from harness import Consumer, JobContext, PermanentError, TransientError

__all__ = ["CREATE_TABLE", "CreditPoints", "LoyaltyLedger", "OutageLedger", "consumer", "create_table", "make_consumer"]

# The example's own table: loyalty points per member. A double credit is visible here.
CREATE_TABLE = """
CREATE SCHEMA IF NOT EXISTS example;
CREATE TABLE IF NOT EXISTS example.loyalty_points (
    tenant_id  uuid        NOT NULL,
    member_id  text        NOT NULL,
    points     bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT loyalty_points_pkey PRIMARY KEY (tenant_id, member_id)
);
"""


# What the worker's role needs of the table, when that role exists.
GRANT_TO_WORKER = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'core_jobs_worker') THEN
        GRANT USAGE ON SCHEMA example TO core_jobs_worker;
        GRANT SELECT, INSERT, UPDATE ON example.loyalty_points TO core_jobs_worker;
    END IF;
END $$
"""


def create_table(conn: psycopg.Connection) -> None:
    """Create ``example.loyalty_points`` if it is not there (the demo's and the tests' database only), granted to
    the worker's least-privilege role where the migrations made it (``core_jobs_worker``, migration 0020), as a
    deployer grants a consumer's own tables (docs/harness.md)."""
    with conn.transaction():
        conn.execute(CREATE_TABLE)
        conn.execute(GRANT_TO_WORKER)


class CreditPoints(BaseModel):
    model_config = ConfigDict(extra="forbid")

    member_id: str = Field(min_length=1, max_length=64)
    points: int = Field(gt=0, le=1_000_000, strict=True)


class LoyaltyLedger(Protocol):
    def confirm(self, payload: CreditPoints, ctx: JobContext) -> None:
        """Raise TransientError / PermanentError when the ledger cannot confirm the credit."""


class AlwaysConfirms:
    def confirm(self, payload: CreditPoints, ctx: JobContext) -> None:
        return None


class OutageLedger:
    """Fails the first ``timeouts[member]`` attempts of a member, and always for ``unknown`` members."""

    def __init__(
        self,
        timeouts: Mapping[str, int] | None = None,
        unknown: frozenset[str] = frozenset(),
        retry_after: float | None = None,
    ) -> None:
        self.timeouts = dict(timeouts or {})
        self.unknown = unknown
        self.retry_after = retry_after

    def confirm(self, payload: CreditPoints, ctx: JobContext) -> None:
        if payload.member_id in self.unknown:
            raise PermanentError(f"loyalty ledger has no member {payload.member_id}")
        if ctx.attempt <= self.timeouts.get(payload.member_id, 0):
            raise TransientError("loyalty ledger did not answer in 10 s", retry_after=self.retry_after)


# Adds the points; the first credit of a member creates the balance row.
CREDIT_POINTS = """
INSERT INTO example.loyalty_points AS b (tenant_id, member_id, points)
VALUES (%(tenant_id)s, %(member_id)s, %(points)s)
ON CONFLICT (tenant_id, member_id)
DO UPDATE SET points = b.points + EXCLUDED.points, updated_at = now()
"""


# A batch's credits in one statement: summed per member first (one statement cannot update a row twice).
CREDIT_POINTS_MANY = """
INSERT INTO example.loyalty_points AS b (tenant_id, member_id, points)
SELECT c.tenant_id, c.member_id, sum(c.points)
  FROM unnest(%(tenant_ids)s::uuid[], %(member_ids)s::text[], %(points)s::integer[]) AS c(tenant_id, member_id, points)
 GROUP BY c.tenant_id, c.member_id
ON CONFLICT (tenant_id, member_id)
DO UPDATE SET points = b.points + EXCLUDED.points, updated_at = now()
"""


def make_consumer(
    ledger: LoyaltyLedger | None = None,
    *,
    name: str = "points.credit",
    queue: str = "points.credit",
    batched: bool = False,
) -> Consumer[CreditPoints]:
    """The points consumer, confirming with ``ledger`` (default: one that always confirms); ``batched``: with a
    batch handler too, crediting a shared transaction's jobs in one statement (docs/harness.md, "Batch handlers")."""
    provider = ledger or AlwaysConfirms()

    def credit(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
        provider.confirm(payload, ctx)
        conn.execute(
            CREDIT_POINTS, {"tenant_id": ctx.tenant_id, "member_id": payload.member_id, "points": payload.points}
        )

    def credit_many(conn: psycopg.Connection, payloads: list[CreditPoints], contexts: list[JobContext]) -> None:
        for payload, ctx in zip(payloads, contexts, strict=True):
            provider.confirm(payload, ctx)
        conn.execute(
            CREDIT_POINTS_MANY,
            {
                "tenant_ids": [ctx.tenant_id for ctx in contexts],
                "member_ids": [payload.member_id for payload in payloads],
                "points": [payload.points for payload in payloads],
            },
        )

    return Consumer(
        name=name,
        queue=queue,
        payload_schema=CreditPoints,
        handler=credit,
        batch_handler=credit_many if batched else None,
    )


consumer = make_consumer()


if __name__ == "__main__":  # python -m harness.examples.points [URL]: the example's table, on a database of your own
    import os
    import sys

    with psycopg.connect(sys.argv[1] if len(sys.argv) > 1 else os.environ["CORE_JOBS_DATABASE_URL"]) as conn:
        create_table(conn)
    print("example.loyalty_points is there")
