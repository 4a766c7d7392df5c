"""A database error leaves the process without the row data PostgreSQL puts in its DETAIL (harness/errors.py).

``describe_error`` is the one way the harness turns an exception into text — a dead letter's or a
retry's ``last_error``, RabbitMQ's ``x-core-jobs-last-error`` header, the log's ``error``, a span's
status — so a real constraint violation is raised here and each of those places is read.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from pydantic import BaseModel
from support.factories import TENANT
from support.harness_support import TTL, scalar

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.errors import describe_error
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import DeadLettered, Envelope, RetryAfter, settle

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
