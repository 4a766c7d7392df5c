"""Consumers for the harness tests that run a worker in a subprocess (importable by module:object).

``blocking`` is the example points consumer (same name, same fence) whose handler, after
crediting, waits for the advisory lock ``LOCK_KEY``: a test holding that lock freezes the
worker between its work and its commit, then kills or stops it.

``fragile`` is the points consumer with one way of misbehaving per member: a validator that
raises TypeError (``m-typeerror``) or SystemExit (``m-exit-validating``), a handler error that
cannot be printed (``m-unprintable``), one whose text holds a lone surrogate (``m-surrogate``),
``SystemExit(3)`` (``m-exit``), ``KeyboardInterrupt`` (``m-interrupt``), a ``PermanentError``
(``m-permanent``: a dead letter at once), and a handler that loses its database connection
(``m-disconnect``: it terminates its own backend). Every other member is credited.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress

import psycopg
from pydantic import field_validator

from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.errors import PermanentError, TransientError
from harness.examples.points import CreditPoints
from harness.examples.points import consumer as points

LOCK_KEY = 424242


def _credit_then_wait(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    print(f"in-handler {ctx.job_id}", flush=True)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))


blocking = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_credit_then_wait)

# The points consumer with a retry policy fixed in code whose worst-case window (~10 days) outlasts
# the default 7-day fence TTL: a late retry after the fence expired could credit twice (J-B7).
patient = Consumer(
    name=points.name,
    queue=points.queue,
    payload_schema=CreditPoints,
    handler=points.handler,
    retry_policy=RetryPolicy(max_attempts=200),
    retry_justification="test: a policy fixed in code that outlasts the fence",
)


class PickyCredit(CreditPoints):
    """CreditPoints whose validator fails with something other than a ValueError for some members."""

    @field_validator("member_id")
    @classmethod
    def _picky(cls, member_id: str) -> str:
        if member_id == "m-typeerror":
            raise TypeError("member ids are compared as bytes")
        if member_id == "m-exit-validating":
            raise SystemExit(4)
        return member_id


class Unprintable(Exception):
    """An error whose text cannot be had: its __str__ raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


def _misbehave(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    failures = {
        "m-unprintable": Unprintable,
        "m-surrogate": lambda: TransientError("ledger said \udcff"),
        "m-exit": lambda: SystemExit(3),
        "m-interrupt": KeyboardInterrupt,
        "m-permanent": lambda: PermanentError("the ledger has no member m-permanent"),
    }
    if payload.member_id == "m-disconnect":
        conn.execute("RESET ROLE")  # back to the test's superuser: core_jobs_worker may not end a superuser's backend
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    if payload.member_id in failures:
        raise failures[payload.member_id]()
    points.handler(conn, payload, ctx)


fragile = Consumer(name=points.name, queue=points.queue, payload_schema=PickyCredit, handler=_misbehave)


# A durable consumer (seed 002) with one action of each effect class, on seed 002's default
# action policy; for the TTL guard's execution window (harness/durable/window.py). Its calls
# are never made by these tests.
def _never_called(payload: CreditPoints, ctx: object) -> None:
    raise AssertionError("the window tests never run an action")


durable_ledger = Consumer(
    name="points.credit.ledger",
    queue="points.credit.ledger",
    payload_schema=CreditPoints,
    handler=points.handler,
    actions=(
        Action(name="lookup", effect=Effect.READ_ONLY, call=_never_called),
        Action(name="credit", effect=Effect.IDEMPOTENT_WRITE, call=_never_called),
        Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=_never_called),
    ),
)


# The points consumer whose handler, for member m-block only, waits for the advisory lock
# LOCK_KEY after crediting: a test holding that lock freezes a batch in the middle of its shared
# transaction, the jobs before m-block handled and uncommitted.
def _credit_then_wait_for_m_block(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    if payload.member_id == "m-block":
        print(f"in-handler {ctx.job_id}", flush=True)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))


blocking_one = Consumer(
    name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_credit_then_wait_for_m_block
)


# The points consumer whose handler ends its transaction itself for two members: COMMIT
# (m-commit) or ROLLBACK (m-rollback), after crediting; every other member is credited.
def _end_the_transaction(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    if payload.member_id == "m-commit":
        conn.execute("COMMIT")
    if payload.member_id == "m-rollback":
        conn.execute("ROLLBACK")


ending = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_end_the_transaction)


# The points consumer whose handler, for member m-killer only, kills its own worker process (SIGKILL: nothing
# settled, nothing given back) after crediting — every time it is run.
def _credit_then_kill_for_m_killer(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    if payload.member_id == "m-killer":
        os.kill(os.getpid(), signal.SIGKILL)


killing = Consumer(
    name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_credit_then_kill_for_m_killer
)


# The crash consumer: each job inserts one row of its own into ``crash_effects`` (a table the test makes, nothing
# else writes it), and the process kills itself (SIGKILL) on its ``CRASH_AT_CALL``-th handler call — before that
# call's INSERT or after it (``CRASH_PHASE``: before, after); 0 or unset: never.
CRASH_EFFECT = "INSERT INTO crash_effects (job_id) VALUES (%s)"
_crash_calls = [0]


def _effect_then_perhaps_die(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    _crash_calls[0] += 1
    dies = _crash_calls[0] == int(os.environ.get("CRASH_AT_CALL") or 0)
    if dies and os.environ.get("CRASH_PHASE") == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    conn.execute(CRASH_EFFECT, (ctx.job_id,))
    if dies:
        os.kill(os.getpid(), signal.SIGKILL)


crashing = Consumer(name="crash", queue="crash.effects", payload_schema=CreditPoints, handler=_effect_then_perhaps_die)

# The same with a batch handler: a shared transaction's effects in one INSERT; the jobs are counted as calls, so the
# process dies on the call holding its CRASH_AT_CALL-th job, before or after that call's INSERT.
CRASH_EFFECTS = "INSERT INTO crash_effects (job_id) SELECT unnest(%s::uuid[])"


def _effects_then_perhaps_die(
    conn: psycopg.Connection, payloads: list[CreditPoints], contexts: list[JobContext]
) -> None:
    first = _crash_calls[0] + 1
    _crash_calls[0] += len(contexts)
    dies = first <= int(os.environ.get("CRASH_AT_CALL") or 0) <= _crash_calls[0]
    if dies and os.environ.get("CRASH_PHASE") == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    conn.execute(CRASH_EFFECTS, ([ctx.job_id for ctx in contexts],))
    if dies:
        os.kill(os.getpid(), signal.SIGKILL)


crashing_batched = Consumer(
    name="crash",
    queue="crash.effects",
    payload_schema=CreditPoints,
    handler=_effect_then_perhaps_die,
    batch_handler=_effects_then_perhaps_die,
)


# The points consumer with two handlers that each try to end the shared transaction, after crediting: m-swallow's
# COMMIT is refused (the batch is the worker's to commit), it swallows the refusal and begins a transaction of its
# own; m-commit then runs COMMIT. Every other member is credited.
def _swallow_then_begin_or_commit(conn: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
    points.handler(conn, payload, ctx)
    if payload.member_id == "m-swallow":
        with suppress(psycopg.Error):
            conn.execute("COMMIT")
        conn.execute("BEGIN")
        points.handler(conn, payload, ctx)  # its own write, in the transaction it began
    if payload.member_id == "m-commit":
        conn.execute("COMMIT")


two_enders = Consumer(
    name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=_swallow_then_begin_or_commit
)
