"""The queue port's conformance kit: the contract of harness/queue/port.py as tests an adapter runs (needs pytest).

The harness does not depend on pytest; this module imports it, so only a test suite imports it.
An adapter's tests subclass :class:`QueuePortContract` and override one fixture,
``queue_under_test``, returning a :class:`QueueUnderTest` — a queue name fresh for the test, how
to open a port on it as a worker does, and two ways to move the world on without waiting:
``make_due`` (every delayed message of the queue is due now: the clock moved on) and ``crash``
(the port's process died: its unsettled deliveries go back). The kit also uses the fixture
``database_url`` — a migrated database — from the adapter's own conftest. docs/writing-an-adapter.md
shows the 20 lines, and maps each port call onto RabbitMQ, NATS JetStream and Amazon SQS.

What the tests state (each test's docstring is its rule):

- **publish, claim, ack** — a published message is claimed with its envelope whole, at attempt
  1, not ``redelivered``; acked, it is gone. ``publish_many`` queues every message.
- **Retries** — ``retry(delay)`` delivers the message again only once the delay has passed, with
  no process sleeping on it (``make_due``), as attempt 2.
- **Redelivery** — a lost lease or a dead consumer (``crash``) delivers the message again (attempt 2),
  ``redelivered``, at most one such delivery per claim (a killer runs alone); released unstarted, it is
  still ``redelivered`` when claimed again.
- **Settled once** — each delivery's outcome is settled exactly once: a second ``ack``, ``retry``
  or ``dead_letter`` of the same delivery returns 0/False and changes nothing (no second
  delivery, no second dead letter).
- **Identity** — ``job_id``, tenant, correlation id, ``replay_of`` and the trace context
  (``traceparent``, ``tracestate``) come back unchanged across retries and redeliveries.
- **Commit, then ack** — a crash between the database commit of an outcome and the broker's ack
  never yields a second effect nor a second dead letter for one failure: the kit handles a
  delivery to success (or writes its dead letter, as an adapter's ``dead_letter`` does first),
  crashes the port instead of settling, and handles the redelivery: one effect row, one pending
  letter (harness/dead_letters.py, harness/handling.py step 0).
- **Poison** goes to a dead letter with zero retries; a **duplicate** is acked silently.
- **Payloads PostgreSQL cannot store** (NaN, infinity, ``\\u0000`` in a value or a key, a lone
  surrogate, a datetime) are refused at publish with ``InvalidPayload`` — by ``publish`` and by
  ``publish_many`` — and nothing is queued; so is **any other field the tables refuse** (a
  ``traceparent`` of another version, a blank ``tracestate``, a NUL in the correlation id, a blank
  queue: harness/queue/fields.py), with ``InvalidEnvelope`` naming the field.
- **Settling a failure already recorded** — ``dead_letter`` of a job whose failure is already a
  pending letter settles the delivery (True) and writes no second one; False only means the lease was lost.
- **Durable actions on the adapter** — a durable consumer whose ``NON_IDEMPOTENT_WRITE`` was in
  flight when its process died (the action records its send, then the process dies: here a
  :class:`ProcessDied`, the one exception the harness lets through, leaving every committed
  checkpoint as it is; the port crashes before anything settles; the execution's lease is
  back-dated in PostgreSQL) is redelivered and held ``RECONCILIATION_REQUIRED``, its send never
  repeated (docs/durable-actions.md).

The kit runs deliveries as a worker does — :func:`harness.handling.handle`, then
:func:`harness.queue.port.settle` — with its own tiny consumers: each writes one row into
``conformance.effects``, a table the kit creates in the test database (``IF NOT EXISTS``: a
database shared by several tests is fine; every assertion is by the test's own job ids). Each
simulated worker process has its own connection and its own port. A broker hands messages over
asynchronously: the kit claims until it has the deliveries it expects, for at most
:attr:`QueuePortContract.CLAIM_TIMEOUT_S` seconds (polling every 10 ms; never a sleep for time
to pass). It imports nothing of the bundle nor of any test suite.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
import pytest
from pydantic import BaseModel

from harness.consumer.actions import Action, ActionContext
from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.effects import Effect
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import write_dead_letter
from harness.errors import PermanentError
from harness.handling import handle
from harness.pg import connect
from harness.queue.port import (
    Acked,
    DeadLettered,
    Delivery,
    Duplicate,
    Envelope,
    Held,
    InvalidEnvelope,
    InvalidPayload,
    Outcome,
    QueuePort,
    settle,
)

__all__ = ["ProcessDied", "QueuePortContract", "QueueUnderTest"]


class QueueUnderTest(Protocol):
    """What an adapter's fixture hands the kit: one queue, fresh for the test, and how to drive it."""

    queue: str  # a queue name fresh for this test

    def port(self, conn: psycopg.Connection) -> QueuePort:
        """A new port (its own broker connection), as a worker opens it on its connection ``conn``."""
        ...

    def make_due(self) -> None:
        """Every delayed message of ``queue`` is due now (the clock moved on)."""
        ...

    def crash(self, port: QueuePort) -> None:
        """The port's process died: its unsettled deliveries go back (lease lost / connection dropped)."""
        ...


class ProcessDied(KeyboardInterrupt):
    """The worker's process dies here. A KeyboardInterrupt: the one exception the harness lets through
    (after rolling back the open transaction), leaving every committed checkpoint as it is."""


# The kit's own table: one row per effect of its consumers. Created once per database, under a lock
# so that parallel tests on one database do not race on the schema.
CREATE_KIT_TABLES = """
SELECT pg_advisory_xact_lock(hashtext('core_jobs.conformance'));
CREATE SCHEMA IF NOT EXISTS conformance;
CREATE TABLE IF NOT EXISTS conformance.effects (
    id       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   uuid    NOT NULL,
    consumer text    NOT NULL,
    n        integer NOT NULL
);
"""

# A consumer's whole work: one row. No unique key: a second effect of one job shows as a second row.
INSERT_EFFECT = "INSERT INTO conformance.effects (job_id, consumer, n) VALUES (%(job_id)s, %(consumer)s, %(n)s)"
COUNT_EFFECTS = "SELECT count(*) FROM conformance.effects WHERE job_id = %(job_id)s"
COUNT_PENDING_LETTERS = """
SELECT count(*) FROM core.dead_letters
 WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND status = 'pending_review'
"""
# The lease of a durable execution moved into the past: what waiting it out would do.
EXPIRE_EXECUTION = """
UPDATE core.executions SET lease_expires_at = now() - interval '1 second'
 WHERE job_id = %(job_id)s AND consumer = %(consumer)s
"""
EXECUTION_STATUS = "SELECT status FROM core.executions WHERE job_id = %(job_id)s AND consumer = %(consumer)s"

TENANT = uuid.UUID("00000000-0000-4000-8000-00000000c0de")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "conformance=kit"
EFFECT = "conformance.effect"
REFUSING = "conformance.refusing"
DURABLE = "conformance.durable"


class KitPayload(BaseModel):
    """The kit consumers' payload: ``{"n": <int>}``; anything else is poison."""

    n: int


def _write_effect(conn: psycopg.Connection, payload: KitPayload, ctx: JobContext) -> None:
    conn.execute(INSERT_EFFECT, {"job_id": ctx.job_id, "consumer": ctx.consumer, "n": payload.n})


def _refuse(conn: psycopg.Connection, payload: KitPayload, ctx: JobContext) -> None:
    _write_effect(conn, payload, ctx)  # rolled back with the failure: a dead letter leaves no effect
    raise PermanentError("the kit's refusing consumer refuses every job")


# Payloads jsonb cannot store, each refused at publish (harness/queue/port.py, check_payload).
UNSTORABLE = {
    "nan": {"n": math.nan},
    "infinity": {"n": math.inf},
    "nul in a value": {"n": 1, "note": "a\u0000b"},
    "nul in a key": {"n": 1, "a\u0000b": 1},
    "lone surrogate": {"n": 1, "note": "\ud800"},
    "datetime": {"n": 1, "at": datetime(2026, 1, 1, tzinfo=UTC)},
}

# What the tables refuse of an envelope (harness/queue/fields.py), each with the field its error names.
UNSTORABLE_ENVELOPES: dict[str, tuple[dict[str, Any], str]] = {
    **{f"payload: {what}": ({"payload": payload}, "payload") for what, payload in UNSTORABLE.items()},
    "version-01 traceparent": ({"traceparent": "01" + TRACEPARENT[2:]}, "traceparent"),
    "upper-case traceparent": ({"traceparent": TRACEPARENT.upper()}, "traceparent"),
    "blank tracestate": ({"tracestate": "  "}, "tracestate"),
    "tracestate without traceparent": ({"traceparent": None, "tracestate": "k=v"}, "tracestate"),
    "nul in the correlation id": ({"correlation_id": "a\u0000b"}, "correlation_id"),
    "correlation id too long to index": ({"correlation_id": "c" * 1025}, "correlation_id"),
    "replay_of beyond bigint": ({"replay_of": 2**63}, "replay_of"),
}


class _Kit:
    """One test's world: the queue under test, its worker processes (a connection and a port each), the assertions."""

    def __init__(self, under_test: QueueUnderTest, database_url: str, contract: QueuePortContract) -> None:
        self.under_test = under_test
        self.queue = under_test.queue
        self.database_url = database_url
        self.contract = contract  # its POLICY, FENCE_TTL, LEASE and CLAIM_TIMEOUT_S, a subclass's if it sets them
        self.claim_timeout = contract.CLAIM_TIMEOUT_S
        self._opened: list[tuple[psycopg.Connection, QueuePort]] = []
        self.db = connect(database_url, autocommit=True)  # the kit's own, for setting up and asserting
        with self.db.transaction():
            self.db.execute(CREATE_KIT_TABLES)

    def worker(self) -> tuple[psycopg.Connection, QueuePort]:
        """A new worker process: its own connection (autocommit) and a port opened on it."""
        conn = connect(self.database_url, autocommit=True)
        port = self.under_test.port(conn)
        self._opened.append((conn, port))
        return conn, port

    def close(self) -> None:
        for conn, port in reversed(self._opened):
            port.close()
            conn.close()
        self.db.close()

    def envelope(self, payload: Any = None, **fields: Any) -> Envelope:
        """A fresh job's envelope (tenant :data:`TENANT`, a trace context of its own, so that a tracing SDK
        installed in the adapter's tests does not replace it at publish); ``fields`` override the rest."""
        envelope = Envelope(
            job_id=uuid.uuid4(),
            payload={"n": 1} if payload is None else payload,
            tenant_id=TENANT,
            correlation_id="corr-kit",
            traceparent=TRACEPARENT,
        )
        return replace(envelope, **fields)

    def claim(self, port: QueuePort, count: int = 1) -> list[Delivery]:
        """Exactly ``count`` deliveries of the queue, claimed as they arrive (at most ``claim_timeout`` seconds)."""
        deliveries: list[Delivery] = []
        deadline = time.monotonic() + self.claim_timeout
        while len(deliveries) < count:
            deliveries += port.claim(self.queue, count - len(deliveries))
            if len(deliveries) >= count:
                break
            assert time.monotonic() < deadline, (
                f"{len(deliveries)} of {count} deliveries of {self.queue} in {self.claim_timeout} s"
            )
            threading.Event().wait(0.01)
        assert len(deliveries) == count, f"claimed {len(deliveries)} deliveries, asked for {count}"
        return deliveries

    def nothing_ready(self, port: QueuePort) -> None:
        """The queue hands out nothing now."""
        assert port.claim(self.queue, 10) == []

    def handle(self, conn: psycopg.Connection, consumer: Consumer[Any], delivery: Delivery) -> Outcome:
        return handle(
            conn,
            consumer,
            delivery,
            policy=self.contract.POLICY,
            fence_ttl=self.contract.FENCE_TTL,
            lease=self.contract.LEASE,
        )

    def effects(self, job_id: uuid.UUID) -> int:
        row = self.db.execute(COUNT_EFFECTS, {"job_id": job_id}).fetchone()
        assert row is not None
        count: int = row[0]
        return count

    def failure_recorded(self, consumer: Consumer[Any]) -> tuple[QueuePort, Envelope, Delivery, DeadLettered]:
        """A job ``consumer`` refuses for good, its dead letter written — what an adapter's ``dead_letter`` commits
        before its ack, or another delivery of the job recorded — and the delivery not settled."""
        conn, port = self.worker()
        envelope = self.envelope()
        port.publish(self.queue, envelope)
        [delivery] = self.claim(port)
        outcome = self.handle(conn, consumer, delivery)
        assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent"
        write_dead_letter(conn, outcome.letter)
        return port, envelope, delivery, outcome

    def pending_letters(self, job_id: uuid.UUID, consumer: str) -> int:
        row = self.db.execute(COUNT_PENDING_LETTERS, {"job_id": job_id, "consumer": consumer}).fetchone()
        assert row is not None
        count: int = row[0]
        return count

    def consumer(self, name: str, handler: Callable[..., Any], actions: tuple[Action, ...] = ()) -> Consumer[Any]:
        return Consumer(name=name, queue=self.queue, payload_schema=KitPayload, handler=handler, actions=actions)


def _same_job(delivery: Delivery, envelope: Envelope) -> None:
    """The delivery carries the published envelope unchanged: identity, payload, replay, trace context."""
    got = delivery.envelope
    assert (got.job_id, got.tenant_id, got.correlation_id, got.replay_of) == (
        envelope.job_id,
        envelope.tenant_id,
        envelope.correlation_id,
        envelope.replay_of,
    )
    assert (got.traceparent, got.tracestate) == (envelope.traceparent, envelope.tracestate)
    assert got.payload == envelope.payload


def _settle_as(port: QueuePort, delivery: Delivery, how: str) -> bool:
    """Settle ``delivery`` the way ``how`` names (``ack``, ``retry``, ``dead_letter``); True when it took effect."""
    if how == "ack":
        return port.ack([delivery]) == 1
    if how == "retry":
        return port.retry(delivery, timedelta(seconds=1), "TransientError: the kit retries")
    letter = delivery.letter(REFUSING, attempts=delivery.attempt, last_error="PermanentError: the kit refuses")
    return port.dead_letter(delivery, letter)


class QueuePortContract:
    """The queue port's contract as tests (module docstring): subclass it and override ``queue_under_test``.

    A subclass may also set ``POLICY`` (the retry policy the kit's consumers run with),
    ``FENCE_TTL``, ``LEASE`` (a durable execution's lease) and ``CLAIM_TIMEOUT_S`` (how long a claim
    waits for the broker to hand over the deliveries a test expects).
    """

    POLICY = RetryPolicy()
    FENCE_TTL = timedelta(days=7)
    LEASE = timedelta(seconds=30)
    CLAIM_TIMEOUT_S = 10.0

    @pytest.fixture
    def queue_under_test(self) -> QueueUnderTest:
        """Override: the adapter's :class:`QueueUnderTest`, with a queue fresh for this test."""
        raise NotImplementedError(f"{type(self).__name__} must override the fixture queue_under_test")

    @pytest.fixture
    def kit(self, queue_under_test: QueueUnderTest, database_url: str) -> Iterator[_Kit]:
        kit = _Kit(queue_under_test, database_url, self)
        try:
            yield kit
        finally:
            kit.close()

    # -- publish, claim, ack ------------------------------------------------------------------------

    def test_a_published_message_is_claimed_whole_then_gone_once_acked(self, kit: _Kit) -> None:
        """Claimed: the envelope as published, attempt 1, not redelivered; acked (1): nothing left to claim."""
        _conn, port = kit.worker()
        envelope = kit.envelope({"n": 7, "items": [1, "two", None]})
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        _same_job(delivery, envelope)
        assert (delivery.queue, delivery.attempt, delivery.redelivered) == (kit.queue, 1, False)
        assert port.ack([delivery]) == 1
        kit.nothing_ready(port)

    def test_publish_many_queues_every_message(self, kit: _Kit) -> None:
        """publish_many of three envelopes: three deliveries, each the envelope published."""
        _conn, port = kit.worker()
        envelopes = [kit.envelope({"n": n}) for n in range(3)]
        port.publish_many([(kit.queue, e) for e in envelopes])
        deliveries = kit.claim(port, 3)
        by_job = {d.envelope.job_id: d for d in deliveries}
        for envelope in envelopes:
            _same_job(by_job[envelope.job_id], envelope)
        assert port.ack(deliveries) == 3
        kit.nothing_ready(port)

    # -- retries and redeliveries -------------------------------------------------------------------

    def test_a_retry_is_delivered_again_once_due_with_no_process_waiting(self, kit: _Kit) -> None:
        """retry(1 h): not deliverable before its time; once due (make_due) delivered again as attempt 2."""
        _conn, port = kit.worker()
        port.publish(kit.queue, kit.envelope())
        [first] = kit.claim(port)
        assert port.retry(first, timedelta(hours=1), "TransientError: try later") is True
        kit.nothing_ready(port)
        kit.under_test.make_due()
        [second] = kit.claim(port)
        assert second.envelope.job_id == first.envelope.job_id and second.attempt == 2
        assert port.ack([second]) == 1

    def test_a_message_is_delivered_again_when_its_consumer_dies(self, kit: _Kit) -> None:
        """A port whose process died (crash) gives its unsettled delivery back: another port claims it, attempt 2."""
        _conn, dying = kit.worker()
        dying.publish(kit.queue, kit.envelope())
        [first] = kit.claim(dying)
        kit.under_test.crash(dying)
        _conn2, port = kit.worker()
        [again] = kit.claim(port)
        assert again.envelope.job_id == first.envelope.job_id and again.attempt == 2
        assert port.ack([again]) == 1
        kit.nothing_ready(port)

    def test_a_claim_hands_out_at_most_one_redelivered_delivery(self, kit: _Kit) -> None:
        """Three deliveries of a port whose process died come back redelivered, at attempt 2, at most one per claim:
        a job that killed its worker runs alone, its batch-mates not at stake (harness/queue/port.py)."""
        _conn, dying = kit.worker()
        envelopes = [kit.envelope({"n": n}) for n in range(3)]
        dying.publish_many([(kit.queue, e) for e in envelopes])
        kit.claim(dying, 3)
        kit.under_test.crash(dying)
        _conn2, port = kit.worker()
        seen: list[Delivery] = []
        deadline = time.monotonic() + kit.claim_timeout
        while len(seen) < 3:
            claimed = port.claim(kit.queue, 10)
            assert sum(d.redelivered for d in claimed) <= 1, f"{len(claimed)} claimed, more than one redelivered"
            assert port.ack(claimed) == len(claimed)
            seen += claimed
            assert time.monotonic() < deadline, f"{len(seen)} of 3 redeliveries in {kit.claim_timeout} s"
            if not claimed:
                threading.Event().wait(0.01)
        assert sorted(str(d.envelope.job_id) for d in seen) == sorted(str(e.job_id) for e in envelopes)
        assert [(d.redelivered, d.attempt) for d in seen] == [(True, 2)] * 3
        kit.nothing_ready(port)

    def test_a_released_redelivery_is_still_a_redelivery(self, kit: _Kit) -> None:
        """A redelivered delivery given back unstarted (its worker stopping) stays a suspect: claimed again, it says
        ``redelivered`` at the same attempt, so it still runs alone (a release counts no attempt and clears no doubt)."""
        _conn, dying = kit.worker()
        dying.publish(kit.queue, kit.envelope())
        kit.claim(dying)
        kit.under_test.crash(dying)
        _conn2, stopping = kit.worker()
        [suspect] = kit.claim(stopping)
        assert (suspect.redelivered, suspect.attempt) == (True, 2)
        assert stopping.release([suspect]) == 1
        _conn3, port = kit.worker()
        [again] = kit.claim(port)
        assert (again.envelope.job_id, again.redelivered, again.attempt) == (suspect.envelope.job_id, True, 2)
        assert port.ack([again]) == 1
        kit.nothing_ready(port)

    @pytest.mark.parametrize("second", ["ack", "retry", "dead_letter"])
    @pytest.mark.parametrize("first", ["ack", "retry", "dead_letter"])
    def test_a_delivery_is_settled_once_and_a_second_settle_changes_nothing(
        self, kit: _Kit, first: str, second: str
    ) -> None:
        """The first settle takes effect; a second one of the same delivery returns False and changes nothing."""
        _conn, port = kit.worker()
        envelope = kit.envelope()
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        assert _settle_as(port, delivery, first) is True
        assert _settle_as(port, delivery, second) is False
        kit.under_test.make_due()
        if first == "retry":  # delivered again exactly once, as the first settle said
            [again] = kit.claim(port)
            assert port.ack([again]) == 1
        kit.nothing_ready(port)
        assert kit.pending_letters(envelope.job_id, REFUSING) == (1 if first == "dead_letter" else 0)

    def test_the_job_identity_and_replay_travel_unchanged_across_retries_and_redeliveries(self, kit: _Kit) -> None:
        """job_id, tenant, correlation id, replay_of and trace context: the same after a retry and after a crash."""
        _conn, port = kit.worker()
        envelope = kit.envelope(replay_of=424242, tracestate=TRACESTATE)
        port.publish(kit.queue, envelope)
        [first] = kit.claim(port)
        _same_job(first, envelope)
        assert port.retry(first, timedelta(minutes=5), "TransientError: again") is True
        kit.under_test.make_due()
        [retried] = kit.claim(port)
        _same_job(retried, envelope)
        kit.under_test.crash(port)
        _conn2, other = kit.worker()
        [redelivered] = kit.claim(other)
        _same_job(redelivered, envelope)
        assert other.ack([redelivered]) == 1

    # -- outcomes of the harness on the port ---------------------------------------------------------

    def test_a_crash_after_the_work_committed_and_before_the_ack_has_one_effect(self, kit: _Kit) -> None:
        """Handled to success, the port crashes before the ack: the redelivery is a Duplicate; one effect row."""
        conn, port = kit.worker()
        consumer = kit.consumer(EFFECT, _write_effect)
        envelope = kit.envelope()
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        assert kit.handle(conn, consumer, delivery) == Acked()
        kit.under_test.crash(port)  # instead of settling
        conn2, port2 = kit.worker()
        [again] = kit.claim(port2)
        assert isinstance(kit.handle(conn2, consumer, again), Duplicate)
        assert settle(port2, again, Duplicate()) is True
        kit.nothing_ready(port2)
        assert kit.effects(envelope.job_id) == 1

    def test_a_crash_after_the_dead_letter_committed_and_before_the_ack_has_one_letter(self, kit: _Kit) -> None:
        """Its dead letter written, the port crashes before the ack: the redelivery leaves one pending letter, no effect."""
        consumer = kit.consumer(REFUSING, _refuse)
        port, envelope, _delivery, _outcome = kit.failure_recorded(consumer)
        kit.under_test.crash(port)  # instead of acking
        conn2, port2 = kit.worker()
        [again] = kit.claim(port2)
        second = kit.handle(
            conn2, consumer, again
        )  # a Duplicate when the adapter says redelivered, else the same failure
        assert isinstance(second, Duplicate | DeadLettered)
        assert settle(port2, again, second) is True
        kit.nothing_ready(port2)
        assert kit.pending_letters(envelope.job_id, REFUSING) == 1
        assert kit.effects(envelope.job_id) == 0

    def test_a_dead_letter_of_a_failure_already_pending_settles_the_delivery_with_one_letter(self, kit: _Kit) -> None:
        """``dead_letter`` is True when the job's failure was already a pending letter: the delivery is settled (gone),
        its failure recorded once. False says only that the lease was lost."""
        port, envelope, delivery, outcome = kit.failure_recorded(kit.consumer(REFUSING, _refuse))
        assert port.dead_letter(delivery, outcome.letter) is True
        assert port.dead_letter(delivery, outcome.letter) is False  # settled once
        kit.under_test.make_due()
        kit.nothing_ready(port)
        assert kit.pending_letters(envelope.job_id, REFUSING) == 1

    def test_a_dead_letter_keeps_the_failures_traceback(self, kit: _Kit) -> None:
        """The adapter's dead_letter writes the letter whole: its one-line last_error and the stack trace beside it."""
        conn, port = kit.worker()
        envelope = kit.envelope()
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        outcome = kit.handle(conn, kit.consumer(REFUSING, _refuse), delivery)
        assert isinstance(outcome, DeadLettered) and settle(port, delivery, outcome) is True
        last_error, traceback = kit.db.execute(
            "SELECT last_error, traceback FROM core.dead_letters WHERE job_id = %s", (envelope.job_id,)
        ).fetchone()  # type: ignore[misc]
        assert last_error == "PermanentError: the kit's refusing consumer refuses every job"
        assert traceback is not None and "in _refuse" in traceback and traceback.rstrip().endswith(last_error)

    def test_poison_goes_to_a_dead_letter_with_zero_retries(self, kit: _Kit) -> None:
        """A payload the consumer's schema rejects: a dead letter at the first delivery, nothing to deliver again."""
        conn, port = kit.worker()
        consumer = kit.consumer(EFFECT, _write_effect)
        envelope = kit.envelope({"n": "not a number"})
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        outcome = kit.handle(conn, consumer, delivery)
        assert isinstance(outcome, DeadLettered) and outcome.reason == "poison"
        assert settle(port, delivery, outcome) is True
        kit.under_test.make_due()
        kit.nothing_ready(port)
        assert kit.pending_letters(envelope.job_id, EFFECT) == 1
        assert kit.effects(envelope.job_id) == 0

    def test_a_duplicate_is_acked_silently(self, kit: _Kit) -> None:
        """The same job published twice: one effect, the second delivery a Duplicate acked, no dead letter."""
        conn, port = kit.worker()
        consumer = kit.consumer(EFFECT, _write_effect)
        envelope = kit.envelope()
        port.publish(kit.queue, envelope)
        port.publish(kit.queue, envelope)
        for expected in (Acked(), Duplicate()):
            [delivery] = kit.claim(port)
            outcome = kit.handle(conn, consumer, delivery)
            assert outcome == expected
            assert settle(port, delivery, outcome) is True
        kit.nothing_ready(port)
        assert kit.effects(envelope.job_id) == 1
        assert kit.pending_letters(envelope.job_id, EFFECT) == 0

    @pytest.mark.parametrize("how", ["publish", "publish_many"])
    @pytest.mark.parametrize("what", sorted(UNSTORABLE_ENVELOPES))
    def test_an_envelope_the_database_cannot_store_is_refused_at_publish_naming_the_field_and_nothing_is_queued(
        self, kit: _Kit, how: str, what: str
    ) -> None:
        """InvalidPayload for the payload, InvalidEnvelope naming any other field, from publish and from publish_many
        with a good message beside it; nothing queued."""
        fields, name = UNSTORABLE_ENVELOPES[what]
        _conn, port = kit.worker()
        bad = replace(kit.envelope(), **fields)
        with pytest.raises(InvalidPayload if name == "payload" else InvalidEnvelope, match=f"^{name}"):
            if how == "publish":
                port.publish(kit.queue, bad)
            else:
                port.publish_many([(kit.queue, kit.envelope()), (kit.queue, bad)])
        kit.under_test.make_due()
        kit.nothing_ready(port)

    @pytest.mark.parametrize(("queue", "problem"), [("", "is blank"), ("   ", "is blank"), ("q\u0000", "NUL")])
    def test_a_queue_name_the_database_refuses_is_refused_at_publish(self, kit: _Kit, queue: str, problem: str) -> None:
        """A blank queue name, or one with a NUL: InvalidEnvelope naming ``queue``, before anything is written."""
        _conn, port = kit.worker()
        with pytest.raises(InvalidEnvelope, match=f"^queue: .*{problem}"):
            port.publish(queue, kit.envelope())

    # -- durable actions with the adapter as the queue -----------------------------------------------

    def test_a_non_idempotent_write_in_flight_when_the_process_died_is_held_and_never_sent_again(
        self, kit: _Kit
    ) -> None:
        """Sent, then the process died: redelivered, RECONCILIATION_REQUIRED (Held, acked), the send made once."""
        sends: list[uuid.UUID] = []

        def notify(payload: KitPayload, ctx: ActionContext) -> dict[str, Any]:
            sends.append(ctx.job_id)  # the request went out ...
            raise ProcessDied()  # ... and the process died before its answer was recorded

        action = Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=notify)
        consumer = kit.consumer(DURABLE, _write_effect, actions=(action,))
        conn, port = kit.worker()
        envelope = kit.envelope()
        port.publish(kit.queue, envelope)
        [delivery] = kit.claim(port)
        with pytest.raises(ProcessDied):
            kit.handle(conn, consumer, delivery)
        kit.under_test.crash(port)  # nothing settled
        kit.db.execute(EXPIRE_EXECUTION, {"job_id": envelope.job_id, "consumer": DURABLE})
        conn2, port2 = kit.worker()
        [again] = kit.claim(port2)
        outcome = kit.handle(conn2, consumer, again)
        assert isinstance(outcome, Held)
        assert settle(port2, again, outcome) is True
        kit.under_test.make_due()
        kit.nothing_ready(port2)
        assert sends == [envelope.job_id]
        status = kit.db.execute(EXECUTION_STATUS, {"job_id": envelope.job_id, "consumer": DURABLE}).fetchone()
        assert status == ("RECONCILIATION_REQUIRED",)
        assert kit.effects(envelope.job_id) == 0
