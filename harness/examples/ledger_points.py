"""Example durable consumer: credit loyalty points through a loyalty ledger's HTTP API (R-1..R-4).

Consumer and queue ``points.ledger`` (business scope ``loyalty``); the payload is the points
example's (``{"member_id": "m-42", "points": 50}``, harness/examples/points.py). Three actions,
one per effect class, then the local write:

1. ``lookup`` — READ_ONLY: ``GET /members/{id}`` → :class:`Member`;
2. ``credit`` — IDEMPOTENT_WRITE: ``POST /credits`` with ``Idempotency-Key: ctx.idempotency_key``
   (``job_id:points.ledger:credit``, the same on every attempt) → :class:`Receipt`;
3. ``notify`` — NON_IDEMPOTENT_WRITE: ``POST /legacy/notify``, no key → :class:`Notice`;
4. the handler adds the points to ``example.loyalty_points`` in the fence's transaction (the
   points example's SQL).

The ledger's URL: :func:`make_consumer` (``base_url``), or for :data:`consumer` the variable
``CORE_JOBS_LOYALTY_LEDGER_URL`` (default ``http://127.0.0.1:8765``), read at the first call.
The local ledger is ``demo/core_jobs_demo/ledger.py``. Run it:
``core-jobs worker --consumer harness.examples.ledger_points:consumer``.

HTTP errors become the harness's (harness/errors.py): a connection refused or a connect
timeout → ``NotSent`` (the request never left); another timeout or transport error, a 5xx or a
429 → ``TransientError`` (with the ``Retry-After`` it sent); another 4xx → ``PermanentError``.
A body that is not JSON is handed on as text, so the action's ``output`` contract rejects it.

httpx is imported at the first call, not with this module: the harness's wheel does not depend
on it (a service running this example installs httpx).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel, ConfigDict

from harness import Action, ActionContext, Consumer, Effect, JobContext, NotSent, PermanentError, TransientError
from harness.examples.points import CREDIT_POINTS, CreditPoints

if TYPE_CHECKING:
    import httpx

__all__ = ["LEDGER_URL_VARIABLE", "Member", "Notice", "Receipt", "consumer", "make_consumer"]

LEDGER_URL_VARIABLE = "CORE_JOBS_LOYALTY_LEDGER_URL"
DEFAULT_LEDGER_URL = "http://127.0.0.1:8765"


class Member(BaseModel):
    model_config = ConfigDict(extra="ignore")

    member_id: str
    tier: str


class Receipt(BaseModel):
    model_config = ConfigDict(extra="ignore")

    credit_id: str
    member_id: str
    points: int


class Notice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    notification_id: int


class _Ledger:
    """One httpx client per consumer, made at the first call (thread-safe; httpx imported then)."""

    def __init__(self, base_url: str | None, timeout: float) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx

                base_url = self._base_url or os.environ.get(LEDGER_URL_VARIABLE, DEFAULT_LEDGER_URL)
                self._client = httpx.Client(base_url=base_url, timeout=self._timeout)
            return self._client

    def request(self, method: str, path: str, *, body: Any = None, key: str | None = None) -> Any:
        import httpx

        client = self._http()
        headers = {"Idempotency-Key": key} if key is not None else {}
        try:
            response = client.request(method, path, json=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise NotSent(f"loyalty ledger {method} {path}: not connected ({type(exc).__name__})") from exc
        except httpx.TimeoutException as exc:
            raise TransientError(f"loyalty ledger {method} {path}: no answer in {self._timeout} s") from exc
        except httpx.HTTPError as exc:
            raise TransientError(f"loyalty ledger {method} {path}: {type(exc).__name__}") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise TransientError(
                f"loyalty ledger {method} {path}: HTTP {status}", retry_after=response.headers.get("Retry-After")
            )
        if status >= 400:
            raise PermanentError(f"loyalty ledger {method} {path}: HTTP {status}")
        try:
            return response.json()
        except ValueError:
            return response.text  # not JSON: the output contract rejects it


def make_consumer(
    base_url: str | None = None, *, timeout: float = 2.0, name: str = "points.ledger", queue: str = "points.ledger"
) -> Consumer[CreditPoints]:
    """The ledger points consumer calling the ledger at ``base_url`` (None: the environment's, at the first call)."""
    ledger = _Ledger(base_url, timeout)

    def lookup(payload: CreditPoints, ctx: ActionContext) -> Any:
        return ledger.request("GET", f"/members/{payload.member_id}")

    def credit(payload: CreditPoints, ctx: ActionContext) -> Any:
        body = {"member_id": payload.member_id, "points": payload.points}
        return ledger.request("POST", "/credits", body=body, key=ctx.idempotency_key)

    def notify(payload: CreditPoints, ctx: ActionContext) -> Any:
        return ledger.request("POST", "/legacy/notify", body={"member_id": payload.member_id, "points": payload.points})

    def record(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
        conn.execute(
            CREDIT_POINTS, {"tenant_id": ctx.tenant_id, "member_id": payload.member_id, "points": payload.points}
        )

    return Consumer(
        name=name,
        queue=queue,
        payload_schema=CreditPoints,
        business_scope="loyalty",
        actions=(
            Action(name="lookup", effect=Effect.READ_ONLY, call=lookup, output=Member),
            Action(name="credit", effect=Effect.IDEMPOTENT_WRITE, call=credit, output=Receipt),
            Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=notify, output=Notice),
        ),
        handler=record,
    )


consumer = make_consumer()
