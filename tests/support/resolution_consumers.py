"""The published definitions of the resolution tests (importable by module:attribute, as CORE_JOBS_ADMIN_CONSUMERS names them).

``ledger_points`` is a durable consumer ``points.ledger`` (the default of
``factories.add_execution``), business scope ``loyalty``: ``lookup`` (READ_ONLY, a
:class:`Member`), ``credit`` (IDEMPOTENT_WRITE, a :class:`Receipt`), ``notify``
(NON_IDEMPOTENT_WRITE, a :class:`Sent`) and ``register_document`` (NON_IDEMPOTENT_WRITE,
``verified_only``: seed 002's REGISTER_DOCUMENT). Its calls are never made by these tests: a
resolution checks results against the definition, it runs nothing. ``plain`` declares no actions.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.examples.points import CreditPoints


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")
    member_id: str


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    receipt_id: str = Field(min_length=1, max_length=64)
    points: int = Field(gt=0)


class Sent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_id: str = Field(min_length=1)


def _never_called(payload, ctx):
    raise AssertionError("a resolution runs no action")


def _record(conn, payload, ctx) -> None:
    return None


ledger_points = Consumer(
    name="points.ledger",
    queue="points.ledger",
    payload_schema=CreditPoints,
    business_scope="loyalty",
    actions=(
        Action(name="lookup", effect=Effect.READ_ONLY, call=_never_called, output=Member),
        Action(name="credit", effect=Effect.IDEMPOTENT_WRITE, call=_never_called, output=Receipt),
        Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=_never_called, output=Sent),
        Action(name="register_document", effect=Effect.NON_IDEMPOTENT_WRITE, call=_never_called, verified_only=True),
    ),
    handler=_record,
)

plain = Consumer(name="points.plain", queue="points.plain", payload_schema=CreditPoints, handler=_record)
