"""A database error leaves the process without the row data PostgreSQL puts in its DETAIL (harness/errors.py).

``describe_error`` is the one way the harness turns an exception into text — a dead letter's or a
retry's ``last_error``, RabbitMQ's ``x-core-jobs-last-error`` header, the log's ``error``, a span's
status — and ``describe_traceback`` renders each database error of a stack trace (the raised one, its
cause, its context) by the same text: the dead letter's ``traceback``, the log's ``traceback``, the
span's exception event. So a real constraint violation is raised here and each of those places is read.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from pydantic import BaseModel
from support.factories import TENANT
from support.harness_support import TTL, run_worker, scalar

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.errors import PermanentError, TransientError, describe_error, describe_traceback
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import DeadLettered, Envelope, RetryAfter, settle
from maintenance.runtime.logs import get_logger

SECRET = "s3cr3t-member-card-4111"
TABLE = """
CREATE TABLE IF NOT EXISTS public.cards (
    id int PRIMARY KEY,
    card text NOT NULL CONSTRAINT cards_card_short CHECK (length(card) < 10) UNIQUE
)
"""


class Card(BaseModel):
    id: int
    card: str


def store(conn: psycopg.Connection, payload: Card, ctx) -> None:
    conn.execute("INSERT INTO public.cards (id, card) VALUES (%s, %s)", (payload.id, payload.card))


def violations(conn: psycopg.Connection) -> list[psycopg.Error]:
    """A CHECK violation (DETAIL: Failing row contains …) and a unique one (DETAIL: Key (…)=(…) already exists)."""
    conn.execute(TABLE)
    conn.execute("INSERT INTO public.cards VALUES (1, 'short')")
    raised = []
    for statement, params in [
        ("INSERT INTO public.cards VALUES (%s, %s)", (2, SECRET)),
        ("INSERT INTO public.cards VALUES (%s, %s)", (1, "short")),
    ]:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement, params)
        raised.append(caught.value)
    return raised


def test_a_database_error_is_described_by_its_primary_message_without_the_row(conn):
    check, unique = violations(conn)
    assert "Failing row contains" in str(check) and "Key (id)=(1)" in str(unique)  # what psycopg's str() carries
    assert describe_error(check) == (
        'CheckViolation: new row for relation "cards" violates check constraint "cards_card_short"'
    )
    assert describe_error(unique) == 'UniqueViolation: duplicate key value violates unique constraint "cards_pkey"'


def test_a_database_error_of_a_handler_leaves_no_row_data_in_the_retry_nor_the_dead_letter(conn):
    """The handler's INSERT violates a CHECK with its payload's value: the retry's and the dead letter's
    last_error name the constraint, never the row."""
    conn.execute(TABLE)
    queue = PgQueue(conn, worker="w")
    consumer = Consumer(name="cards", queue="cards", payload_schema=Card, handler=store)
    job_id = uuid.uuid4()
    queue.publish("cards", Envelope(job_id=job_id, payload={"id": 7, "card": SECRET}, tenant_id=TENANT))
    outcomes = []
    for _attempt in range(2):
        [delivery] = queue.claim("cards", 1)
        outcome = handle(conn, consumer, delivery, policy=RetryPolicy(max_attempts=2), fence_ttl=TTL)
        outcomes.append(outcome)
        if isinstance(outcome, RetryAfter):
            assert SECRET not in outcome.error
            assert settle(queue, delivery, outcome)
            conn.execute("UPDATE core.queue_messages SET run_at = now() WHERE job_id = %s", (job_id,))
        else:
            assert settle(queue, delivery, outcome)
    assert [type(o) for o in outcomes] == [RetryAfter, DeadLettered]
    last_error = scalar(conn, "SELECT last_error FROM core.dead_letters WHERE job_id = %s", (job_id,))
    assert last_error.startswith("CheckViolation: ") and "cards_card_short" in last_error
    assert SECRET not in last_error and "Failing row" not in last_error


def refused_card(conn: psycopg.Connection, payload: Card, ctx) -> None:
    """The handler's INSERT violates the CHECK with the payload's card: psycopg's text quotes the row."""
    store(conn, payload, ctx)


def refused_card_as_cause(conn: psycopg.Connection, payload: Card, ctx) -> None:
    try:
        store(conn, payload, ctx)
    except psycopg.Error as exc:
        raise PermanentError("the card was refused") from exc


def refused_card_as_context(conn: psycopg.Connection, payload: Card, ctx) -> None:
    try:
        store(conn, payload, ctx)
    except psycopg.Error:
        raise TransientError("the card was refused")  # noqa: B904  (chained as its context, not its cause)


def test_a_database_errors_traceback_shows_its_message_without_the_row(conn):
    check, _unique = violations(conn)
    text = describe_traceback(check)
    assert text is not None and SECRET not in text and "Failing row" not in text
    assert text.rstrip().endswith(
        'psycopg.errors.CheckViolation: new row for relation "cards" violates check constraint "cards_card_short"'
    )


@pytest.mark.parametrize("handler", [refused_card, refused_card_as_cause, refused_card_as_context])
def test_a_database_error_in_a_failures_chain_leaves_no_row_data_in_the_dead_letters_traceback_nor_its_span(
    spans, database_url, conn, logs, handler
):
    """The refused INSERT raised, or the cause or the context of what the handler raised: the dead letter's
    traceback, the span's exception event and the log line show the database error by its message alone."""
    conn.execute(TABLE)
    queue = PgQueue(conn, worker="w")
    job_id = uuid.uuid4()
    queue.publish("cards", Envelope(job_id=job_id, payload={"id": 7, "card": SECRET}, tenant_id=TENANT))
    consumer = Consumer(name="cards", queue="cards", payload_schema=Card, handler=handler)
    assert run_worker(database_url, consumer, RetryPolicy(max_attempts=1)).dead_lettered == 1
    traceback = scalar(conn, "SELECT traceback FROM core.dead_letters WHERE job_id = %s", (job_id,))
    assert 'violates check constraint "cards_card_short"' in traceback  # the database error is there, by its message
    assert SECRET not in traceback and "Failing row" not in traceback
    (event,) = [e for e in spans.one("cards process").events if e.name == "exception"]
    assert SECRET not in event.attributes["exception.stacktrace"]
    assert "cards_card_short" in event.attributes["exception.stacktrace"]
    assert SECRET not in logs.text


def test_a_database_error_settling_a_delivery_leaves_no_row_data_in_delivery_failed_nor_the_span(
    spans, database_url, conn, logs
):
    """The dead letter's own INSERT refused (its row holds the payload, quoted whole in psycopg's DETAIL): the
    delivery_failed log line and the span's exception event show the constraint, never the row."""
    conn.execute(TABLE)
    conn.execute("ALTER TABLE core.dead_letters ADD CONSTRAINT no_card_letters CHECK (NOT payload ? 'card') NOT VALID")
    queue = PgQueue(conn, worker="w")
    job_id = uuid.uuid4()
    queue.publish("cards", Envelope(job_id=job_id, payload={"id": 7, "card": SECRET}, tenant_id=TENANT))
    consumer = Consumer(name="cards", queue="cards", payload_schema=Card, handler=refused_card_as_cause)
    assert run_worker(database_url, consumer, RetryPolicy(max_attempts=1)).failed == 1
    (failed,) = logs.named("harness.worker.delivery_failed")
    assert "no_card_letters" in failed["error"] and "no_card_letters" in failed["traceback"]
    assert SECRET not in failed["traceback"] and "Failing row" not in failed["traceback"]
    # The handler's failure (the dead letter it meant to write), then the settle's.
    handlers, settles = [e.attributes["exception.stacktrace"] for e in spans.one("cards process").events]
    assert "cards_card_short" in handlers and "no_card_letters" in settles
    assert SECRET not in handlers and SECRET not in settles
    assert SECRET not in logs.text


def test_a_database_error_logged_as_a_field_or_with_its_traceback_leaves_no_row_data(conn, logs):
    """An event given the error itself (``error=exc``) or its stack trace (``log.exception``): the log's processors
    describe it as the harness does, never by psycopg's text."""
    check, _unique = violations(conn)
    log = get_logger()
    log.error("tests.database_errors.as_a_field", error=check)
    try:
        raise check
    except psycopg.Error:
        log.exception("tests.database_errors.with_its_traceback")
    (field,) = logs.named("tests.database_errors.as_a_field")
    (traced,) = logs.named("tests.database_errors.with_its_traceback")
    assert field["error"] == describe_error(check)
    assert "cards_card_short" in traced["exception"]
    assert SECRET not in logs.text and "Failing row" not in logs.text


def test_a_permission_the_workers_role_lacks_is_described_with_the_grant_it_needs(conn):
    """`core-jobs worker` runs its handlers as core_jobs_worker (migration 0020): a consumer's own table without a
    grant is ``permission denied``, retried at info until the attempts run out. Its text says which role and what to
    grant, so the first retry's log line, the retry's ``last_error`` and the dead letter tell an adopter the fix."""
    conn.execute("CREATE TABLE public.unshared (n int)")
    conn.execute("SET ROLE core_jobs_worker")
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("INSERT INTO public.unshared VALUES (1)")
    finally:
        conn.rollback()
        conn.execute("RESET ROLE")
    text = describe_error(refused.value)
    assert text.startswith("InsufficientPrivilege: permission denied for table unshared"), text
    assert "core_jobs_worker" in text and "GRANT" in text, text
