"""The consumer of the failover rig's drains (tests/support/failover.py), loaded by name by a worker subprocess.

``effect`` records each run of its work as one row of the rig's independent effects table
(``public.failover_effects``), in the work's transaction: a job whose effect is counted twice
was applied twice, one with no effect and no dead letter was lost. A job's ``work_ms`` is how long
its work holds the transaction open (``pg_sleep``): a drain slow enough to be failed over many
times, with transactions in flight when the primary dies.

``sender`` is durable: one NON_IDEMPOTENT_WRITE, ``send``, whose requests :data:`SENT` counts per key, then the
effect recorded as ``effect``'s.

``notifier`` is ``sender`` across processes: its NON_IDEMPOTENT_WRITE ``notify`` is a real HTTP request to the local
loyalty ledger (demo/core_jobs_demo/ledger.py, ``POST /legacy/notify``, which applies every call it receives) at
``CORE_JOBS_LOYALTY_LEDGER_URL``, its body naming the action's idempotency key, so the ledger that ran in the test's
or the benchmark's process counts the sends of each job whatever worker process made them.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict

from harness.consumer.actions import Action, ActionContext, Effect
from harness.consumer.consumer import Consumer, JobContext
from harness.errors import NotSent, TransientError

QUEUE = "failover.effect"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int
    work_ms: int = 0


def _record(conn: psycopg.Connection, payload: Job, ctx: JobContext) -> None:
    if payload.work_ms:
        conn.execute("SELECT pg_sleep(%s)", (payload.work_ms / 1000,))
    conn.execute("INSERT INTO public.failover_effects (job_id) VALUES (%s)", (ctx.job_id,))


effect = Consumer(name=QUEUE, queue=QUEUE, payload_schema=Job, handler=_record)


# What ``sender``'s NON_IDEMPOTENT_WRITE sent, one idempotency key per request: a mock provider counting its sends
# (the consumer runs in the test's own process).
SENT: list[str] = []
SENDER_QUEUE = "failover.sender"


def _send(payload: Job, ctx: ActionContext) -> None:
    SENT.append(ctx.idempotency_key)


sender = Consumer(
    name=SENDER_QUEUE,
    queue=SENDER_QUEUE,
    payload_schema=Job,
    handler=_record,
    actions=(Action(name="send", effect=Effect.NON_IDEMPOTENT_WRITE, call=_send),),
)


NOTIFIER_QUEUE = "failover.notifier"
LEDGER_URL_VARIABLE = "CORE_JOBS_LOYALTY_LEDGER_URL"


def _notify(payload: Job, ctx: ActionContext) -> Any:
    """One ``POST /legacy/notify`` naming this job's key: refused before it left → NotSent; any other failure may
    have been applied → TransientError (a NON_IDEMPOTENT_WRITE's: reconciliation)."""
    body = json.dumps({"member_id": ctx.idempotency_key, "points": payload.n}).encode()
    request = urllib.request.Request(
        os.environ[LEDGER_URL_VARIABLE] + "/legacy/notify",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise NotSent(f"loyalty ledger notify: not connected ({exc.reason})") from exc
        raise TransientError(f"loyalty ledger notify: {exc}") from exc
    except OSError as exc:
        raise TransientError(f"loyalty ledger notify: {type(exc).__name__}") from exc


notifier = Consumer(
    name=NOTIFIER_QUEUE,
    queue=NOTIFIER_QUEUE,
    payload_schema=Job,
    handler=_record,
    actions=(Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=_notify),),
)


def sends_per_job(bodies: Iterable[dict[str, Any]]) -> Counter[uuid.UUID]:
    """The ledger's notify requests (their bodies, ``LoyaltyLedger.effects(endpoint="notify")``) counted per job."""
    return Counter(uuid.UUID(body["member_id"].split(":", 1)[0]) for body in bodies)
