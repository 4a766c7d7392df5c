"""The stack trace of a failed job: kept on its dead letter, its span and its log line (harness/errors.py).

``last_error`` stays the one-line summary; ``traceback`` is Python's own rendering of the failure —
frames with their source lines, chained causes — masked and bounded, and never the frames' locals.
"""

from __future__ import annotations

import sys

import psycopg
import pytest
from support.factories import QUEUE, add_dead_letters, publish
from support.harness_support import run_worker, scalar

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.errors import MAX_TRACEBACK_CHARS, PermanentError, TransientError, describe_traceback
from harness.examples.points import CreditPoints

SECRET_PAYLOAD_VALUE = "m-locals-never-leave"


def _tier_of(member: dict) -> str:
    return member["tier"]  # the helper the handler calls: a KeyError two frames down


def looking_up_the_tier() -> Consumer[CreditPoints]:
    def handler(conn, payload, ctx):
        member = {"id": payload.member_id}  # a local holding a payload value: never in the traceback
        _tier_of(member)

    return Consumer(name="points.credit", queue=QUEUE, payload_schema=CreditPoints, handler=handler)


def refusing_with(error_of: type[Exception], message: str) -> Consumer[CreditPoints]:
    def handler(conn, payload, ctx):
        try:
            _tier_of({})
        except KeyError as exc:
            raise error_of(message) from exc

    return Consumer(name="points.credit", queue=QUEUE, payload_schema=CreditPoints, handler=handler)


def letter(conn) -> tuple[str, str | None]:
    return conn.execute("SELECT last_error, traceback FROM core.dead_letters").fetchone()


def test_an_exhausted_job_keeps_its_traceback_beside_its_one_line_error(database_url, conn, logs):
    publish(conn, {"member_id": SECRET_PAYLOAD_VALUE, "points": 5})
    assert run_worker(database_url, looking_up_the_tier(), RetryPolicy(max_attempts=1)).dead_lettered == 1
    last_error, traceback = letter(conn)
    assert last_error == "KeyError: 'tier'"
    assert traceback.startswith("Traceback (most recent call last):")
    assert 'return member["tier"]' in traceback and "in _tier_of" in traceback and "in handler" in traceback
    assert traceback.rstrip().endswith("KeyError: 'tier'")
    assert SECRET_PAYLOAD_VALUE not in traceback  # frames' source lines, not their locals
    (event,) = logs.named("harness.job.dead_lettered")
    assert event["level"] == "error" and event["reason"] == "exhausted"
    assert event["error"] == last_error and event["traceback"] == traceback


def test_a_permanent_error_keeps_its_chained_cause_and_logs_a_warning(database_url, conn, logs):
    publish(conn, {"member_id": "m-1", "points": 5})
    assert run_worker(database_url, refusing_with(PermanentError, "member has no tier")).dead_lettered == 1
    last_error, traceback = letter(conn)
    assert last_error == "PermanentError: member has no tier"
    assert "KeyError: 'tier'" in traceback
    assert "The above exception was the direct cause of the following exception" in traceback
    assert traceback.rstrip().endswith("PermanentError: member has no tier")
    (event,) = logs.named("harness.job.dead_lettered")
    assert event["level"] == "warning" and event["traceback"] == traceback


def test_a_poison_payload_has_no_traceback_so_no_payload_value_through_pydantic(database_url, conn):
    publish(conn, {"member_id": SECRET_PAYLOAD_VALUE, "points": -1})
    assert run_worker(database_url, looking_up_the_tier()).dead_lettered == 1
    last_error, traceback = letter(conn)
    assert last_error.startswith("PoisonMessage: payload failed schema validation: points:")
    assert traceback is None


def test_the_traceback_and_the_last_error_are_masked_by_the_credential_detector(database_url, conn, logs):
    """A handler's error quoting a credential: the dead letter's last_error (shown by the API, the CLI, the alert
    feed) and its traceback keep the error's shape, never the secret."""
    publish(conn, {"member_id": "m-1", "points": 5})
    leaking = refusing_with(PermanentError, "cannot reach postgresql://ledger:hunter2-pw@db.internal/ledger")
    assert run_worker(database_url, leaking).dead_lettered == 1
    last_error, traceback = letter(conn)
    assert "hunter2-pw" not in traceback and "postgresql://ledger:" in traceback
    assert "hunter2-pw" not in last_error and last_error.startswith("PermanentError: cannot reach postgresql://ledger:")
    assert "hunter2-pw" not in logs.text


def test_a_retrys_last_error_is_masked_by_the_credential_detector(database_url, conn, logs):
    """The retried message keeps its last_error on the queue (what `dead-letters`, the API and a broker header show):
    masked like the dead letter's."""
    publish(conn, {"member_id": "m-1", "points": 5})
    leaking = refusing_with(TransientError, "ledger refused token=sk_live_4eC39HqLyjWDarjtT1zdp7dc")
    assert run_worker(database_url, leaking).retried == 1
    last_error = scalar(conn, "SELECT last_error FROM core.queue_messages")
    assert (
        last_error.startswith("TransientError: ledger refused token=") and "4eC39HqLyjWDarjtT1zdp7dc" not in last_error
    )


def test_the_traceback_is_bounded_keeping_its_start_and_the_innermost_frames():
    def down(n: int) -> None:
        if n == 0:
            raise PermanentError("bottom " + "x" * 50_000)
        down(n - 1)

    try:
        down(sys.getrecursionlimit() // 4)
    except PermanentError as exc:
        text = describe_traceback(exc)
    assert text is not None and len(text) <= MAX_TRACEBACK_CHARS
    assert text.startswith("Traceback (most recent call last):")
    assert "characters cut" in text and text.rstrip().endswith("x")


def test_an_exception_never_raised_has_no_traceback():
    assert describe_traceback(PermanentError("built, never raised")) is None


@pytest.mark.parametrize("policy", [RetryPolicy(max_attempts=1), RetryPolicy(max_attempts=3)])
def test_the_span_records_the_traceback_as_its_exception_event(spans, database_url, conn, policy):
    publish(conn, {"member_id": "m-1", "points": 5})
    run_worker(database_url, looking_up_the_tier(), policy)
    handled = spans.one(f"{QUEUE} process")
    (event,) = [e for e in handled.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "KeyError"
    assert event.attributes["exception.message"] == "KeyError: 'tier'"
    assert "in _tier_of" in event.attributes["exception.stacktrace"]
    if policy.max_attempts == 1:
        assert event.attributes["exception.stacktrace"] == scalar(conn, "SELECT traceback FROM core.dead_letters")


def test_the_database_holds_the_same_bound(conn):
    """Migration 0022's CHECK is harness.errors.MAX_TRACEBACK_CHARS: the writer's cut always fits, nothing longer does."""
    add_dead_letters(conn, QUEUE, 1, traceback="x" * MAX_TRACEBACK_CHARS)
    with pytest.raises(psycopg.errors.CheckViolation, match="dead_letters_traceback_bounded"):
        add_dead_letters(conn, QUEUE, 1, traceback="x" * (MAX_TRACEBACK_CHARS + 1))
