"""Deploy 2 of ``points.quote`` (tests/support/deploys/README.md): ``lookup``'s output now requires a ``tier``; ``quote`` answers.

A ``lookup`` result stored by deploy 1 (no ``tier``) breaks this deploy's contract; a new job's
lookup answers with one and succeeds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.examples.points import CREDIT_POINTS, CreditPoints


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")
    member_id: str
    tier: str


def _lookup(payload: CreditPoints, ctx) -> dict:
    return {"member_id": payload.member_id, "tier": "gold"}


def _quote(payload: CreditPoints, ctx) -> dict:
    return {"rate": 2}


def _credit(conn, payload: CreditPoints, ctx) -> None:
    conn.execute(CREDIT_POINTS, {"tenant_id": ctx.tenant_id, "member_id": payload.member_id, "points": payload.points})


consumer = Consumer(
    name="points.quote",
    queue="points.quote",
    payload_schema=CreditPoints,
    actions=(
        Action(name="lookup", effect=Effect.READ_ONLY, call=_lookup, output=Member),
        Action(name="quote", effect=Effect.READ_ONLY, call=_quote),
    ),
    handler=_credit,
)
