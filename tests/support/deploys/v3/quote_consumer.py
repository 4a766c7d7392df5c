"""Deploy 3 of ``points.quote`` (tests/support/deploys/README.md): ``lookup``'s output refuses a result without ``tier`` by raising TypeError.

Like deploy 2, but the refusal is not a pydantic ``ValidationError`` (a ``TypeError`` from a
validator is not wrapped): a ``lookup`` result stored by deploy 1 breaks this contract all the same.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.examples.points import CREDIT_POINTS, CreditPoints


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")
    member_id: str
    tier: str = "none"

    @model_validator(mode="before")
    @classmethod
    def _needs_tier(cls, data):
        if "tier" not in data:
            raise TypeError("deploy 3 insists on a tier")  # pydantic does not wrap a TypeError
        return data


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
