"""Handling one delivery: the fence in the work transaction, duplicates, retries, poison (issue 6, point 2)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support.factories import TENANT
from support.harness_consumers import PickyCredit, Unprintable
from support.harness_support import TTL, fences, points, scalar, wait_until_waiting_on_lock

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.errors import PermanentError, TransientError
from harness.examples.points import CreditPoints, OutageLedger, make_consumer
from harness.handling import handle
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Acked, DeadLettered, Delivery, Duplicate, Envelope, RetryAfter

POLICY = RetryPolicy()


@pytest.fixture
def metrics() -> HarnessMetrics:
    return HarnessMetrics(CollectorRegistry())


def delivery(payload, *, job_id=None, attempt=1, correlation_id="corr-1") -> Delivery:
    envelope = Envelope(job_id=job_id or uuid.uuid4(), payload=payload, tenant_id=TENANT, correlation_id=correlation_id)
    return Delivery(queue="points.credit", envelope=envelope, attempt=attempt)


def crediting(*, before=None, after=None) -> Consumer:
    """A points consumer whose handler runs ``before(conn)``, credits, then runs ``after(conn)``."""
    credit = make_consumer().handler

    def handler(conn, payload, ctx):
        if before:
            before(conn)
        credit(conn, payload, ctx)
        if after:
            after(conn)

    return Consumer(name="points.credit", queue="points.credit", payload_schema=CreditPoints, handler=handler)


def failing(error: Exception) -> Consumer:
    """A points consumer whose handler credits, then raises ``error``."""

    def fail(conn):
        raise error

    return crediting(after=fail)


def test_success_commits_the_work_and_a_fence_expiring_after_the_ttl(conn, metrics):
    """A handled job credits the points and writes one fence with expires_at = processed_at + TTL."""
    d = delivery({"member_id": "m-1", "points": 50})
    outcome = handle(conn, make_consumer(), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    assert outcome == Acked()
    assert points(conn, "m-1") == 50
    row = conn.execute(
        "SELECT consumer, tenant_id, expires_at - processed_at FROM core.processed_jobs WHERE job_id = %s",
        (d.envelope.job_id,),
    ).fetchone()
    assert row == ("points.credit", TENANT, TTL)
    assert metrics.value("processed", consumer="points.credit") == 1


def test_duplicate_delivery_acks_silently_with_a_metric_and_no_second_effect(conn, metrics):
    """The same job handled again is a Duplicate: no second credit, no error, no row, one duplicate counted (J-B2)."""
    d = delivery({"member_id": "m-1", "points": 50})
    consumer = make_consumer()
    assert handle(conn, consumer, d, policy=POLICY, fence_ttl=TTL, metrics=metrics) == Acked()
    assert handle(conn, consumer, d, policy=POLICY, fence_ttl=TTL, metrics=metrics) == Duplicate()
    assert points(conn, "m-1") == 50
    assert fences(conn, d.envelope.job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0
    assert metrics.value("duplicates", consumer="points.credit") == 1
    assert metrics.value("processed", consumer="points.credit") == 1


@pytest.mark.parametrize("second_attempt", [1, 6])
def test_the_same_job_delivered_twice_in_parallel_has_exactly_one_effect(database_url, conn, metrics, second_attempt):
    """J-AC1: two threads handle one job at once; the second blocks on the fence, then sees a duplicate — also when
    it is a redelivery past the attempt budget (the first worker's lease ran out while it was still committing)."""
    d = delivery({"member_id": "m-par", "points": 7})
    redelivery = delivery(d.envelope.payload, job_id=d.envelope.job_id, attempt=second_attempt)
    entered, release = threading.Event(), threading.Event()
    credit = make_consumer().handler

    def slow_credit(conn_, payload, ctx):
        credit(conn_, payload, ctx)
        entered.set()
        assert release.wait(30)

    first_consumer = Consumer(
        name="points.credit", queue="points.credit", payload_schema=CreditPoints, handler=slow_credit
    )
    outcomes: dict[str, object] = {}
    with (
        psycopg.connect(database_url, autocommit=True) as conn_a,
        psycopg.connect(database_url, autocommit=True) as conn_b,
    ):

        def run(name, c, consumer, this):
            outcomes[name] = handle(c, consumer, this, policy=POLICY, fence_ttl=TTL, metrics=metrics)

        a = threading.Thread(target=run, args=("a", conn_a, first_consumer, d))
        a.start()
        assert entered.wait(30)
        b = threading.Thread(target=run, args=("b", conn_b, make_consumer(), redelivery))
        b.start()
        wait_until_waiting_on_lock(conn, conn_b.info.backend_pid)  # b is inside its INSERT of the fence
        release.set()
        a.join(30)
        b.join(30)
    assert outcomes == {"a": Acked(), "b": Duplicate()}
    assert points(conn, "m-par") == 7
    assert fences(conn, d.envelope.job_id) == 1


class RecordedMetrics:
    """A Metrics of the caller's own (no Prometheus): the calls the harness made, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def processed(self, consumer: str) -> None:
        self.calls.append(("processed", consumer))

    def duplicate(self, consumer: str) -> None:
        self.calls.append(("duplicate", consumer))

    def retry(self, consumer: str) -> None:
        self.calls.append(("retry", consumer))

    def dead_lettered(self, consumer: str, reason: str) -> None:
        self.calls.append(("dead_lettered", consumer, reason))


def test_the_callers_own_metrics_object_receives_each_decision(conn):
    """Any object with the four Metrics methods is told of a success, a duplicate, a retry and a dead letter."""
    recorded = RecordedMetrics()
    d = delivery({"member_id": "m-1", "points": 50})
    for consumer, this in [
        (make_consumer(), d),
        (make_consumer(), d),
        (failing(TransientError("ledger timeout")), delivery({"member_id": "m-2", "points": 1})),
        (make_consumer(), delivery({"member_id": "m-3", "points": -5})),
    ]:
        handle(conn, consumer, this, policy=POLICY, fence_ttl=TTL, metrics=recorded)
    assert recorded.calls == [
        ("processed", "points.credit"),
        ("duplicate", "points.credit"),
        ("retry", "points.credit"),
        ("dead_lettered", "points.credit", "poison"),
    ]


def test_a_failure_rolls_back_the_work_and_the_fence(conn, metrics):
    """A handler that credits and then fails leaves neither the credit nor the fence (J-B1)."""
    d = delivery({"member_id": "m-1", "points": 50})
    outcome = handle(conn, failing(TransientError("ledger timeout")), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    assert isinstance(outcome, RetryAfter)
    assert points(conn, "m-1") == 0
    assert fences(conn, d.envelope.job_id) == 0


def test_schema_invalid_payload_is_poison_with_zero_retries(conn, metrics):
    """J-AC4: a payload the schema rejects is dead-lettered on its first attempt, naming the field, never run."""
    d = delivery({"member_id": "m-1", "points": -5})
    outcome = handle(conn, make_consumer(), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "poison"
    assert outcome.letter.attempts == 1
    assert outcome.letter.last_error.startswith("PoisonMessage: payload failed schema validation: points:")
    assert metrics.value("retries", consumer="points.credit") == 0
    assert metrics.value("dead_lettered", consumer="points.credit", reason="poison") == 1
    assert fences(conn, d.envelope.job_id) == 0


def test_permanent_error_is_dead_lettered_at_once(conn, metrics):
    """J-B4: a handler's PermanentError on the first attempt is a dead letter, not a retry."""
    consumer = make_consumer(OutageLedger(unknown=frozenset({"m-gone"})))
    outcome = handle(
        conn, consumer, delivery({"member_id": "m-gone", "points": 5}), policy=POLICY, fence_ttl=TTL, metrics=metrics
    )
    assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent"
    assert outcome.letter.last_error == "PermanentError: loyalty ledger has no member m-gone"


def test_an_unclassified_exception_is_retried_like_a_transient_error(conn, metrics):
    """A bare exception from a handler is retried on the policy, not dropped and not dead-lettered."""
    outcome = handle(
        conn,
        failing(KeyError("surprise")),
        delivery({"member_id": "m-1", "points": 1}),
        policy=POLICY,
        fence_ttl=TTL,
        metrics=metrics,
        random=lambda: 0.5,
    )
    assert outcome == RetryAfter(delay=timedelta(seconds=30), error="KeyError: 'surprise'")
    assert metrics.value("retries", consumer="points.credit") == 1


@pytest.mark.parametrize(("retry_after", "expected"), [(100, 100), ("1000", 120), (1, 30)])
def test_retry_after_lengthens_the_delay_up_to_its_bound(conn, metrics, retry_after, expected):
    """A Retry-After longer than the backoff wins, bounded to 120 s; a shorter one changes nothing (R-2)."""
    outcome = handle(
        conn,
        failing(TransientError("429", retry_after=retry_after)),
        delivery({"member_id": "m-1", "points": 1}),
        policy=POLICY,
        fence_ttl=TTL,
        metrics=metrics,
        random=lambda: 0.5,
    )
    assert outcome.delay == timedelta(seconds=expected)


def test_the_last_attempt_failing_is_a_dead_letter(conn, metrics):
    """A transient failure on attempt max_attempts is dead-lettered as exhausted, with that attempt count."""
    outcome = handle(
        conn,
        failing(TransientError("ledger timeout")),
        delivery({"member_id": "m-1", "points": 1}, attempt=5),
        policy=POLICY,
        fence_ttl=TTL,
        metrics=metrics,
    )
    assert isinstance(outcome, DeadLettered) and outcome.reason == "exhausted"
    assert outcome.letter.attempts == 5


def test_dead_letter_carries_the_full_job_and_a_bounded_error(conn, metrics):
    """The written dead letter has payload, attempts, correlation id, tenant, queue, consumer, job id, error ≤ 2000 chars."""
    payload = {"member_id": "m-1", "points": 3}
    d = delivery(payload, attempt=1, correlation_id="corr-xyz")
    outcome = handle(conn, failing(PermanentError("x" * 10_000)), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    queue = PgQueue(conn)
    queue.publish("points.credit", d.envelope)
    (claimed,) = queue.claim("points.credit", 1)
    assert queue.dead_letter(claimed, outcome.letter)
    row = conn.execute(
        "SELECT job_id, queue, consumer, payload, attempts, correlation_id, tenant_id, last_error,"
        " status FROM core.dead_letters"
    ).fetchone()
    assert row[:7] == (d.envelope.job_id, "points.credit", "points.credit", payload, 1, "corr-xyz", TENANT)
    assert row[7].startswith("PermanentError: xxx") and len(row[7]) <= 2000 and row[7].endswith("[truncated]")
    assert row[8] == "pending_review"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def swallow_a_database_error(conn):
    # The transaction is now aborted; psycopg's COMMIT of it would silently roll back.
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1 / 0")


def raise_rollback(conn):
    raise psycopg.Rollback()  # psycopg ends the innermost transaction block quietly: here, the harness's


@pytest.mark.parametrize(("after", "says"), [(swallow_a_database_error, "aborted"), (raise_rollback, "Rollback")])
def test_a_handler_that_leaves_nothing_to_commit_is_retried_not_acked(conn, metrics, after, says):
    """A handler that swallows a database error or raises psycopg.Rollback has nothing committed: retried, never acked."""
    d = delivery({"member_id": "m-1", "points": 50})
    outcome = handle(conn, crediting(after=after), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    assert isinstance(outcome, RetryAfter), outcome
    assert says in outcome.error
    assert points(conn, "m-1") == 0 and fences(conn, d.envelope.job_id) == 0
    assert metrics.value("processed", consumer="points.credit") == 0


@pytest.mark.parametrize("statement", ["COMMIT", "ROLLBACK"])
def test_a_handler_that_ends_the_work_transaction_itself_is_dead_lettered_not_retried(conn, metrics, statement):
    """A handler that runs COMMIT or ROLLBACK itself is a permanent dead letter: a retry could apply its escaped writes twice."""
    # The fence is committed or gone; the credit after it runs outside the fence's transaction.
    consumer = crediting(before=lambda c: c.execute(statement))
    outcome = handle(
        conn, consumer, delivery({"member_id": "m-1", "points": 50}), policy=POLICY, fence_ttl=TTL, metrics=metrics
    )
    assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent", outcome
    assert "ended the work transaction" in outcome.letter.last_error
    assert metrics.value("processed", consumer="points.credit") == 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    ("member", "says"),
    [("m-typeerror", "TypeError: member ids are compared as bytes"), ("m-exit-validating", "SystemExit: 4")],
    ids=["type-error", "system-exit"],
)
def test_any_exception_raised_while_validating_the_payload_is_poison(conn, metrics, member, says):
    """J-B5: a validator raising TypeError or even SystemExit (not a ValidationError) is poison too, its type named."""
    consumer = Consumer(
        name="points.credit", queue="points.credit", payload_schema=PickyCredit, handler=make_consumer().handler
    )
    outcome = handle(
        conn, consumer, delivery({"member_id": member, "points": 1}), policy=POLICY, fence_ttl=TTL, metrics=metrics
    )
    assert isinstance(outcome, DeadLettered) and outcome.reason == "poison", outcome
    assert outcome.letter.last_error == f"PoisonMessage: payload failed schema validation: {says}"
    assert metrics.value("retries", consumer="points.credit") == 0


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (Unprintable(), "Unprintable: <message unprintable: RuntimeError: no text>"),
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit"),
    ],
    ids=["unprintable", "system-exit", "generator-exit"],
)
def test_a_handler_failure_of_any_kind_is_rolled_back_and_retried_with_its_type_named(conn, metrics, error, recorded):
    """An unprintable exception, SystemExit or another BaseException from a handler is that delivery's failure: rolled back, retried, named."""
    d = delivery({"member_id": "m-1", "points": 50})
    outcome = handle(conn, failing(error), d, policy=POLICY, fence_ttl=TTL, metrics=metrics, random=lambda: 0.5)
    assert outcome == RetryAfter(delay=timedelta(seconds=30), error=recorded)
    assert points(conn, "m-1") == 0 and fences(conn, d.envelope.job_id) == 0


def test_keyboard_interrupt_from_a_handler_propagates_after_rolling_back(conn, metrics):
    """KeyboardInterrupt is the caller's stop, not the job's failure: it propagates, and the work and fence are rolled back."""
    d = delivery({"member_id": "m-1", "points": 50})
    with pytest.raises(KeyboardInterrupt):
        handle(conn, failing(KeyboardInterrupt()), d, policy=POLICY, fence_ttl=TTL, metrics=metrics)
    assert points(conn, "m-1") == 0 and fences(conn, d.envelope.job_id) == 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
