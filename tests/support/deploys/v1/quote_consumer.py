"""Deploy 1 of ``points.quote`` (tests/support/deploys/README.md): ``lookup`` answers ``{"member_id"}``; ``quote`` is down.

Its ``lookup`` therefore ends ``SUCCEEDED`` with a result of this deploy's shape, and the
execution waits to retry ``quote`` — a stored result the next deploy reads.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.errors import TransientError
from harness.examples.points import CREDIT_POINTS, CreditPoints


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")
    member_id: str


def _lookup(payload: CreditPoints, ctx) -> dict:
    return {"member_id": payload.member_id}


def _quote(payload: CreditPoints, ctx) -> dict:
    raise TransientError("the quote service did not answer")


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
