"""The reference PostgreSQL queue: claims, leases, fencing tokens, retries on the database clock (issue 6, point 4)."""

from __future__ import annotations

import json
import re
import sys
import uuid
from contextlib import nullcontext
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.types.json import set_json_dumps
from structlog.testing import capture_logs
from support.factories import QUEUE, TENANT, publish
from support.harness_support import (
    TTL,
    expire_leases,
    fences,
    make_due,
    points,
    row_counts,
    scalar,
)

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import DeadLetter
from harness.errors import TransientError
from harness.examples.points import CreditPoints, OutageLedger, make_consumer
from harness.examples.points import consumer as points_consumer
from harness.handling import handle
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import MAX_PAYLOAD_DEPTH, Acked, Envelope, InvalidPayload, UndecodablePayload
from harness.worker import DatabaseUnavailable, Worker, WorkerConfig

CONFIG = WorkerConfig(fence_ttl=TTL, batch_size=10)


@pytest.fixture
def metrics() -> HarnessMetrics:
    return HarnessMetrics(CollectorRegistry())


def run_worker(database_url, consumer, metrics, policy=RetryPolicy()):
    return Worker(database_url, consumer, policy=policy, config=CONFIG, metrics=metrics).run(once=True)


def _nested(depth: int) -> list:
    """A list nested ``depth`` levels deep."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def letter_for(delivery) -> DeadLetter:
    e = delivery.envelope
    return DeadLetter(
        job_id=e.job_id,
        queue=delivery.queue,
        consumer="points.credit",
        payload=e.payload,
        attempts=delivery.attempt,
        last_error="TransientError: x",
    )


# What jsonb cannot store, or a consumer could not read back, and where InvalidPayload says it is.
REFUSED = [
    ({"member_id": "m-1", "points": float("nan")}, "payload.points"),
    ({"member_id": "m-1", "points": float("-inf")}, "payload.points"),
    ({"member_id": "m\x00-1", "points": 1}, "payload.member_id"),
    ({"member_id\x00": "m-1"}, "payload: a key"),
    ({"items": [1, {"note": "\ud800"}]}, "payload.items[1].note"),
    ({"at": datetime(2024, 1, 1, tzinfo=UTC)}, "payload.at"),
    ({"deep": _nested(MAX_PAYLOAD_DEPTH + 1)}, "payload: nested deeper than"),
    ({"deep": _nested(5000)}, "payload: nested deeper than"),
    ({"points": 10**5000}, "payload.points"),
    ({(1, 2): "a tuple key"}, "payload: a key of type tuple"),
]


@pytest.mark.parametrize(("payload", "where"), REFUSED)
def test_publish_refuses_a_payload_jsonb_cannot_store_with_invalid_payload(conn, payload, where):
    """publish raises InvalidPayload (a ValueError naming where) for what jsonb cannot store, before touching the database."""
    with pytest.raises(InvalidPayload, match=re.escape(where)):
        PgQueue(conn).publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload))
    assert issubclass(InvalidPayload, ValueError)
    assert row_counts(conn)["core.queue_messages"] == 0


def queued(conn: psycopg.Connection) -> list[tuple]:
    """Every message as stored, in publishing order: its fields and whether run_at is now() + its delay."""
    return conn.execute(
        "SELECT queue, job_id, tenant_id, correlation_id, payload, replay_of, traceparent, tracestate,"
        "       run_at - now(), enqueued_at = now(), attempts"
        "  FROM core.queue_messages ORDER BY id"
    ).fetchall()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(minutes=5)])
def test_publish_many_queues_every_message_whole_in_order_on_the_database_clock(conn, delay):
    """publish_many stores each envelope's fields as given, in order, run_at = the transaction's now() + delay."""
    sent = [
        ("q.a", Envelope(job_id=uuid.uuid4(), payload={"n": 1}, tenant_id=TENANT)),
        ("q.b", Envelope(job_id=uuid.uuid4(), payload=[1, "two", None, True, 2.5], correlation_id="corr-1")),
        ("q.a", Envelope(job_id=uuid.uuid4(), payload="text", replay_of=7, traceparent=TRACEPARENT, tracestate="v=1")),
    ]
    with conn.transaction():
        PgQueue(conn).publish_many(sent, delay=delay)
        assert queued(conn) == [
            (
                q,
                e.job_id,
                e.tenant_id,
                e.correlation_id,
                e.payload,
                e.replay_of,
                e.traceparent,
                e.tracestate,
                delay,
                True,
                0,
            )
            for q, e in sent
        ]


# Every character COPY, JSON or the database treats specially, in every text a message carries.
AWKWARD = 'tab\there, new\nline, cr\r, back\\slash \\N \\. \\u0000 \\ud800 "quoted" é 😀 [{'


def test_publish_many_keeps_every_character_of_its_texts(conn):
    """Tabs, newlines, backslashes, \\N and \\. (COPY's own), escapes, non-ASCII and emoji come back unchanged."""
    payload = {AWKWARD: [AWKWARD, {"nested": AWKWARD}], "pair": "\ud83d\ude00", "brackets": "[" * 500}
    envelope = Envelope(
        job_id=uuid.uuid4(), payload=payload, correlation_id=AWKWARD, traceparent=TRACEPARENT, tracestate=AWKWARD
    )
    PgQueue(conn).publish_many([(AWKWARD, envelope)])
    stored = {**payload, "pair": "😀"}  # a surrogate pair is one character in jsonb, as publish stores it
    assert queued(conn)[0][:8] == (
        AWKWARD,
        envelope.job_id,
        envelope.tenant_id,
        AWKWARD,
        stored,
        None,
        TRACEPARENT,
        AWKWARD,
    )
    assert [d.envelope.payload for d in PgQueue(conn).claim(AWKWARD, 10)] == [stored]


def test_publish_many_stores_a_payload_as_publish_does(conn):
    """Non-string keys become their JSON text, tuples lists, and a payload exactly MAX_PAYLOAD_DEPTH deep is accepted."""
    payload = {
        1: "one",
        None: "none",
        False: "false",
        1.5: "float",
        float("nan"): "nan",
        "t": (1, 2),
        "deep": _nested(MAX_PAYLOAD_DEPTH - 1),
    }
    PgQueue(conn).publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload))
    PgQueue(conn).publish_many([(QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload))])
    one, many = (row[4] for row in queued(conn))
    assert one == many and set(many) == {"1", "null", "false", "1.5", "NaN", "t", "deep"}


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(minutes=5)])
def test_publish_many_writes_what_the_connections_json_dumps_writes_as_publish_does(conn, delay):
    """A consumer that set psycopg's json dumps on the connection (``set_json_dumps``) gets the same stored
    payload from publish_many's COPY as from publish — here a dumps that wraps and indents (a newline, escaped)."""
    set_json_dumps(lambda obj: json.dumps({"wrapped": obj, "note": "a\\tb"}, indent=2), conn)
    payload = {"member_id": "m-1", "text": "tab\there"}
    PgQueue(conn).publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload), delay=delay)
    PgQueue(conn).publish_many([(QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload))], delay=delay)
    one, many = (row[4] for row in queued(conn))
    assert one == many == {"wrapped": payload, "note": "a\\tb"}


def test_an_integer_is_refused_exactly_when_a_consumer_could_not_read_it(conn):
    """An integer of exactly sys.get_int_max_str_digits() digits is queued and read back; one digit more is refused."""
    digits = sys.get_int_max_str_digits()
    longest = -(10**digits - 1)
    PgQueue(conn).publish_many([(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": longest}))])
    assert [d.envelope.payload for d in PgQueue(conn).claim(QUEUE, 1)] == [{"n": longest}]
    with pytest.raises(InvalidPayload, match=re.escape(f"payload.n: an integer of more than {digits} digits")):
        PgQueue(conn).publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 10**digits}))


@pytest.mark.parametrize(("payload", "where"), REFUSED)
def test_publish_many_refuses_the_whole_batch_for_one_bad_payload(conn, payload, where):
    """One payload jsonb cannot store: InvalidPayload naming where, and not one message of the batch is queued."""
    good = (QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 1}))
    with pytest.raises(InvalidPayload, match=re.escape(where)):
        PgQueue(conn).publish_many([good, (QUEUE, Envelope(job_id=uuid.uuid4(), payload=payload)), good])
    assert row_counts(conn)["core.queue_messages"] == 0


def test_publish_many_queues_none_when_the_database_refuses_one_message(conn):
    """A message the database refuses (here a constraint of the deployment's own) fails the call, and the messages
    before it are not queued. (What the harness's tables refuse, publish refuses first: harness/queue/fields.py.)"""
    conn.execute("ALTER TABLE core.queue_messages ADD CONSTRAINT no_two CHECK (payload->>'n' IS DISTINCT FROM '2')")
    good = (QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 1}))
    with pytest.raises(psycopg.errors.CheckViolation, match="no_two"):
        PgQueue(conn).publish_many([good, good, (QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 2}))])
    assert row_counts(conn)["core.queue_messages"] == 0


def test_publish_many_joins_an_open_transaction(conn):
    """Inside the caller's transaction publish_many is part of it: rolled back with it, nothing is queued."""
    with pytest.raises(RuntimeError, match="caller gives up"), conn.transaction():
        PgQueue(conn).publish_many([(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": n})) for n in range(3)])
        assert row_counts(conn)["core.queue_messages"] == 3
        raise RuntimeError("caller gives up")
    assert row_counts(conn)["core.queue_messages"] == 0


def test_publish_many_inside_a_pipeline_queues_its_messages_with_the_rest(conn):
    """In a pipeline (a RESUME's writes), which cannot carry a COPY, publish_many still queues every message, due at now() + delay."""
    sent = [(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT)) for n in range(3)]
    with conn.transaction(), conn.pipeline():
        PgQueue(conn).publish_many(sent, delay=timedelta(seconds=30))
    assert [(row[1], row[4], row[8] > timedelta(0)) for row in queued(conn)] == [
        (e.job_id, e.payload, True) for _q, e in sent
    ]


@pytest.mark.parametrize("inside_a_pipeline", [False, True])
def test_publish_many_writes_a_payload_read_back_undecodable_exactly_as_stored(conn, inside_a_pipeline):
    """An UndecodablePayload (a RESUME of what Python cannot read) is queued as its stored text, backslashes and all."""
    text = '{"big": 1e400, "s": "back\\\\slash\\ttab"}'
    stored = conn.execute("SELECT %s::jsonb::text", (text,)).fetchone()[0]
    envelope = Envelope(job_id=uuid.uuid4(), payload=UndecodablePayload(stored, "too big"))
    with conn.transaction(), conn.pipeline() if inside_a_pipeline else nullcontext():
        PgQueue(conn).publish_many([(QUEUE, envelope)])
    assert scalar(conn, "SELECT payload::text FROM core.queue_messages") == stored


def test_publish_many_of_nothing_writes_nothing(conn):
    """An empty batch is no call to the database and no message."""
    PgQueue(conn).publish_many([])
    assert row_counts(conn)["core.queue_messages"] == 0


def test_claim_skips_rows_another_claimer_has_locked(database_url, conn):
    """FOR UPDATE SKIP LOCKED: a claim never waits for a row another transaction holds; it takes the others."""
    first = publish(conn, {"member_id": "a", "points": 1})
    publish(conn, {"member_id": "b", "points": 1})
    with psycopg.connect(database_url) as other:  # an open transaction holding the first message's row
        other.execute("SELECT 1 FROM core.queue_messages WHERE job_id = %s FOR UPDATE", (first,))
        claimed = PgQueue(conn).claim(QUEUE, 10)
        assert [d.envelope.payload["member_id"] for d in claimed] == ["b"]


def test_claim_takes_a_batch_in_run_at_order_and_counts_an_attempt(conn):
    """A claim leases up to `limit` ready messages, oldest run_at first, each at attempt 1 with its own token."""
    for member in ("a", "b", "c"):
        publish(conn, {"member_id": member, "points": 1})
    claimed = PgQueue(conn).claim(QUEUE, 2)
    assert [d.envelope.payload["member_id"] for d in claimed] == ["a", "b"]
    assert [d.attempt for d in claimed] == [1, 1]
    assert len({d.receipt[1] for d in claimed}) == 2
    assert [d.envelope.payload["member_id"] for d in PgQueue(conn).claim(QUEUE, 10)] == ["c"]


def test_a_scheduled_message_is_not_delivered_before_its_run_at(conn):
    """A message due in a minute is not claimable now; once its run_at has passed it is."""
    publish(conn, {"member_id": "a", "points": 1}, delay=timedelta(minutes=1))
    assert PgQueue(conn).claim(QUEUE, 10) == []
    make_due(conn)
    assert len(PgQueue(conn).claim(QUEUE, 10)) == 1


def test_lease_expiry_redelivers_with_a_new_token_and_the_next_attempt(conn):
    """A leased message is invisible until its lease expires; then it is delivered again, attempt 2, newer token."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    (first,) = queue.claim(QUEUE, 10)
    assert queue.claim(QUEUE, 10) == []
    expire_leases(conn)
    (second,) = queue.claim(QUEUE, 10)
    assert second.envelope == first.envelope
    assert second.attempt == 2
    assert second.receipt[1] > first.receipt[1]


def test_a_reference_queue_delivery_after_a_lease_expiry_is_marked_redelivered(conn):
    """A claim of a message whose lease expired unsettled (its worker died, perhaps of it) says redelivered, and so
    does the claim after it was released unstarted (still a suspect); a first claim, a claim after a fresh delivery's
    release, and one after a retry (it ran and failed: not a suspect) do not."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    (first,) = queue.claim(QUEUE, 10)
    assert queue.release([first]) == 1
    (fresh_again,) = queue.claim(QUEUE, 10)
    expire_leases(conn)
    (second,) = queue.claim(QUEUE, 10)
    assert queue.release([second]) == 1
    (third,) = queue.claim(QUEUE, 10)
    assert queue.retry(third, timedelta(0), "TransientError: ledger timed out")
    (fourth,) = queue.claim(QUEUE, 10)
    assert [d.redelivered for d in (first, fresh_again, second, third, fourth)] == [False, False, True, True, False]
    assert [d.attempt for d in (first, fresh_again, second, third, fourth)] == [1, 1, 2, 2, 3]


def test_a_claim_takes_at_most_one_redelivered_message_beside_the_fresh_ones(conn):
    """Three messages whose worker died and two fresh ones: a claim of ten takes the fresh two and the first of the
    three, in order; the next claims one redelivered message each."""
    dead = [publish(conn, {"member_id": f"dead-{n}", "points": 1}) for n in range(3)]
    queue = PgQueue(conn)
    assert len(queue.claim(QUEUE, 10)) == 3
    expire_leases(conn)
    fresh = [publish(conn, {"member_id": f"fresh-{n}", "points": 1}) for n in range(2)]
    claimed = queue.claim(QUEUE, 10)
    assert [(d.envelope.job_id, d.redelivered) for d in claimed] == [
        (dead[0], True),
        (fresh[0], False),
        (fresh[1], False),
    ]
    assert [[d.envelope.job_id for d in queue.claim(QUEUE, 10)] for _ in range(3)] == [[dead[1]], [dead[2]], []]


def test_a_stale_workers_late_ack_retry_and_dead_letter_change_nothing(conn):
    """After its lease expired and another worker claimed the message, the first worker's writes match no row."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    (stale,) = queue.claim(QUEUE, 10)
    expire_leases(conn)
    (current,) = queue.claim(QUEUE, 10)
    before = conn.execute("SELECT * FROM core.queue_messages").fetchall()
    assert queue.ack([stale]) == 0
    assert queue.retry(stale, timedelta(seconds=30), "TransientError: late") is False
    assert queue.dead_letter(stale, letter_for(stale)) is False
    assert conn.execute("SELECT * FROM core.queue_messages").fetchall() == before
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0
    assert queue.ack([current]) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_an_ack_after_the_lease_expired_changes_nothing_even_before_a_redelivery(conn):
    """A worker whose lease ran out cannot ack, even if nobody has claimed the message again yet."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    (late,) = queue.claim(QUEUE, 10)
    expire_leases(conn)
    assert queue.ack([late]) == 0
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1


def test_a_redelivery_after_lease_expiry_is_absorbed_by_the_fence(database_url, conn, metrics):
    """Work committed but never acked (the worker died after its commit) is redelivered after expiry; the fence makes it a duplicate."""
    job_id = publish(conn, {"member_id": "a", "points": 10})
    (first,) = PgQueue(conn).claim(QUEUE, 10)
    assert handle(conn, points_consumer, first, policy=RetryPolicy(), fence_ttl=TTL, metrics=metrics) == Acked()
    # ... and the worker dies here, before its ack.
    expire_leases(conn)
    stats = run_worker(database_url, points_consumer, metrics)
    assert (stats.processed, stats.duplicates) == (0, 1)
    assert points(conn, "a") == 10 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_retry_records_the_failure_and_schedules_on_the_database_clock(conn):
    """One statement: last_error, last_failed_at = now(), run_at = now() + delay, lease cleared."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    (d,) = queue.claim(QUEUE, 10)
    before = scalar(conn, "SELECT clock_timestamp()")
    assert queue.retry(d, timedelta(seconds=27.5), "TransientError: ledger timeout")
    after = scalar(conn, "SELECT clock_timestamp()")
    run_at, failed_at, *rest = conn.execute(
        "SELECT run_at, last_failed_at, last_error, lease_token, lease_expires_at, attempts FROM core.queue_messages"
    ).fetchone()
    assert before <= failed_at <= after
    assert run_at - failed_at == timedelta(seconds=27.5)
    assert rest == ["TransientError: ledger timeout", None, None, 1]


def test_release_gives_messages_back_at_once_without_using_an_attempt(conn):
    """Released deliveries are ready again immediately, their attempt count unchanged."""
    publish(conn, {"member_id": "a", "points": 1})
    queue = PgQueue(conn)
    claimed = queue.claim(QUEUE, 10)
    assert queue.release(claimed) == 1
    (again,) = queue.claim(QUEUE, 10)
    assert again.attempt == 1


# A deferred constraint trigger runs at COMMIT, so it sees the synchronous_commit that commit uses.
NOTE_QUEUE_COMMITS = """
CREATE TABLE public.queue_commits (id bigserial PRIMARY KEY, operation text NOT NULL, setting text NOT NULL);
CREATE FUNCTION public.note_queue_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.queue_commits (operation, setting) VALUES (TG_OP, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER note_queue_commit AFTER UPDATE OR DELETE ON core.queue_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.note_queue_commit();
"""


def test_claim_ack_and_release_each_commit_asynchronously_in_one_statement(database_url, conn):
    """On an idle connection a claim, an ack and a release are each one statement, one round trip, in a transaction of
    its own that commits without waiting for the WAL flush (a claim or ack lost to a crash is a redelivery, which the
    fence absorbs); the session's own setting is left as it was."""
    from support.round_trips import protocol_trace

    for member in ("a", "b"):
        publish(conn, {"member_id": member, "points": 1})
    conn.execute(NOTE_QUEUE_COMMITS)
    with psycopg.connect(database_url, autocommit=True) as worker:
        queue = PgQueue(worker)
        with protocol_trace(worker) as claimed_trace:
            first, second = queue.claim(QUEUE, 10)
        with protocol_trace(worker) as acked_trace:
            assert queue.ack([first]) == 1
        with protocol_trace(worker) as released_trace:
            assert queue.release([second]) == 1
        assert scalar(worker, "SHOW synchronous_commit") == "on"
    for trace in (claimed_trace, acked_trace, released_trace):
        sent = [line.split("\t")[2].split(" ")[0] for line in trace if line.startswith("F\t")]
        assert (sent.count("Execute"), sent.count("Sync"), "Query" in sent) == (1, 1, False), sent  # no BEGIN, COMMIT
    noted = conn.execute("SELECT operation, setting FROM public.queue_commits ORDER BY id").fetchall()
    assert noted == [("UPDATE", "off"), ("UPDATE", "off"), ("DELETE", "off"), ("UPDATE", "off")]


def test_a_claim_ack_or_release_inside_the_callers_transaction_leaves_its_commit_synchronous(database_url, conn):
    """Called inside a transaction of the caller's, the statement runs in a savepoint of it and the caller's commit
    keeps the caller's synchronous_commit: the caller's own writes in it are never committed asynchronously."""
    for member in ("a", "b", "c"):
        publish(conn, {"member_id": member, "points": 1})
    conn.execute(NOTE_QUEUE_COMMITS)
    with psycopg.connect(database_url) as caller:  # not autocommit: each block below is the caller's transaction
        queue = PgQueue(caller)
        first, second, _third = queue.claim(QUEUE, 10)
        caller.commit()
        assert queue.ack([first]) == 1
        caller.commit()
        assert queue.release([second]) == 1
        assert scalar(caller, "SHOW synchronous_commit") == "on"
        caller.commit()
    noted = conn.execute("SELECT operation, array_agg(DISTINCT setting) FROM public.queue_commits GROUP BY 1")
    assert dict(noted.fetchall()) == {"UPDATE": ["on"], "DELETE": ["on"]}


def test_transient_failures_retry_five_times_at_growing_jittered_intervals_then_dead_letter(
    database_url, conn, metrics
):
    """J-AC3: 5 attempts; the 4 waits, read from the scheduled run_at on the database clock, grow within ±20 %."""
    job_id = publish(conn, {"member_id": "m-down", "points": 5}, correlation_id="corr-down")
    consumer = make_consumer(OutageLedger(timeouts={"m-down": 99}))
    waits = []
    for attempt in range(1, 6):
        stats = run_worker(database_url, consumer, metrics)
        assert stats.retried + stats.dead_lettered == 1, f"attempt {attempt} was not delivered"
        if attempt < 5:
            wait, attempts = conn.execute(
                "SELECT run_at - last_failed_at, attempts FROM core.queue_messages"
            ).fetchone()
            assert attempts == attempt
            waits.append(wait.total_seconds())
            assert run_worker(database_url, consumer, metrics).retried == 0  # not due yet: nothing delivered
            make_due(conn)
    nominal = [30, 60, 120, 240]
    assert all(0.8 * n <= w <= 1.2 * n for w, n in zip(waits, nominal, strict=True)), waits
    assert waits == sorted(waits) and len(set(waits)) == 4
    assert waits != [float(n) for n in nominal]  # jittered, not the nominal schedule
    row = conn.execute("SELECT job_id, attempts, last_error, correlation_id FROM core.dead_letters").fetchone()
    assert row == (job_id, 5, "TransientError: loyalty ledger did not answer in 10 s", "corr-down")
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert metrics.value("retries", consumer="points.credit") == 4
    assert metrics.value("dead_lettered", consumer="points.credit", reason="exhausted") == 1


def test_poison_through_the_queue_is_a_dead_letter_after_one_delivery(database_url, conn, metrics):
    """J-AC4 end to end: the worker dead-letters a schema-invalid message on delivery 1 and leaves no message."""
    job_id = publish(conn, {"member_id": "m-1", "points": "many"})
    stats = run_worker(database_url, points_consumer, metrics)
    assert (stats.dead_lettered, stats.retried) == (1, 0)
    assert conn.execute("SELECT job_id, attempts FROM core.dead_letters").fetchone() == (job_id, 1)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


@pytest.mark.parametrize(
    "stored",
    ["[" * 3000 + "]" * 3000, '{"member_id": "m-1", "points": ' + "7" * 5000 + "}", "[" * 200 + "]" * 200],
    ids=["nested-3000", "integer-5000-digits", "nested-200"],
)
def test_a_payload_python_cannot_decode_is_that_deliverys_poison_dead_letter(database_url, conn, metrics, stored):
    """A stored payload the worker cannot decode (too deep, a number too long) is dead-lettered as poison on delivery 1, kept as stored, and the next message is processed."""
    bad_job = uuid.uuid4()
    conn.execute(
        "INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload) VALUES (%s, %s, %s, %s::jsonb)",
        (QUEUE, bad_job, uuid.UUID(int=0), stored),
    )
    publish(conn, {"member_id": "m-1", "points": 5})
    stats = run_worker(database_url, points_consumer, metrics)
    assert (stats.processed, stats.dead_lettered, stats.retried) == (1, 1, 0)
    letter = conn.execute("SELECT job_id, attempts, last_error, payload = %s::jsonb FROM core.dead_letters", (stored,))
    job_id, attempts, last_error, same_payload = letter.fetchone()
    assert (job_id, attempts, same_payload) == (bad_job, 1, True)
    assert last_error.startswith("PoisonMessage: payload cannot be decoded"), last_error
    assert metrics.value("dead_lettered", consumer="points.credit", reason="poison") == 1
    assert points(conn, "m-1") == 5


def test_successes_write_no_row_beyond_their_fences(database_url, conn, metrics):
    """J-AC8: after N successful jobs, processed_jobs gained N rows and no other table gained any."""
    members = [f"m-{i}" for i in range(25)]
    conn.execute(
        "INSERT INTO example.loyalty_points (tenant_id, member_id, points)"
        " SELECT '00000000-0000-4000-8000-0000000000aa', m, 0 FROM unnest(%s::text[]) AS m",
        (members,),
    )
    before = row_counts(conn)
    for member in members:
        publish(conn, {"member_id": member, "points": 2})
    stats = run_worker(database_url, points_consumer, metrics)
    assert stats.processed == 25
    after = row_counts(conn)
    assert after.pop("core.processed_jobs") == before.pop("core.processed_jobs") + 25
    assert after == before
    assert scalar(conn, "SELECT sum(points) FROM example.loyalty_points") == 50


def crash_looping(calls: list) -> Consumer:
    """The points consumer, recording each run of its handler."""
    credit = points_consumer.handler

    def handler(conn_, payload, ctx):
        calls.append(ctx.attempt)
        credit(conn_, payload, ctx)

    return Consumer(name=points_consumer.name, queue=QUEUE, payload_schema=CreditPoints, handler=handler)


def test_a_job_whose_deliveries_never_settled_is_dead_lettered_without_running_again(database_url, conn, metrics):
    """A message delivered max_attempts times without settling (each worker died mid-job) is dead-lettered on the next delivery, unrun."""
    job_id = publish(conn, {"member_id": "m-crash", "points": 5}, correlation_id="corr-crash")
    conn.execute("UPDATE core.queue_messages SET attempts = 5")  # five claims whose workers were killed
    calls: list[int] = []
    stats = run_worker(database_url, crash_looping(calls), metrics)
    assert calls == [] and stats.dead_lettered == 1
    row = conn.execute("SELECT job_id, attempts, last_error, correlation_id FROM core.dead_letters").fetchone()
    assert row[:2] == (job_id, 6) and row[3] == "corr-crash"
    assert row[2].startswith("DeliveriesExhausted: delivery 6 of a job allowed 5 attempts")
    assert points(conn, "m-crash") == 0 and fences(conn, job_id) == 0
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert metrics.value("dead_lettered", consumer="points.credit", reason="exhausted") == 1


def test_a_job_past_its_attempts_whose_work_committed_is_a_duplicate_not_a_dead_letter(database_url, conn, metrics):
    """Past max_attempts, a job whose fence exists (its work did commit before the worker died) is acked as a duplicate."""
    job_id = publish(conn, {"member_id": "m-done", "points": 5})
    (first,) = PgQueue(conn).claim(QUEUE, 10)
    assert handle(conn, points_consumer, first, policy=RetryPolicy(), fence_ttl=TTL, metrics=metrics) == Acked()
    conn.execute("UPDATE core.queue_messages SET attempts = 5, lease_token = NULL, lease_expires_at = NULL")
    calls: list[int] = []
    stats = run_worker(database_url, crash_looping(calls), metrics)
    assert calls == [] and (stats.duplicates, stats.dead_lettered) == (1, 0)
    assert points(conn, "m-done") == 5 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_an_error_message_with_a_nul_character_is_still_recorded(database_url, conn, metrics):
    """A handler error whose message holds a NUL (which PostgreSQL text refuses) is retried with the NUL escaped, not a crashed worker."""
    publish(conn, {"member_id": "m-1", "points": 1})

    def garbled(conn_, payload, ctx):
        raise TransientError("ledger answered b'\\x00' as \x00")

    consumer = Consumer(name=points_consumer.name, queue=QUEUE, payload_schema=CreditPoints, handler=garbled)
    assert run_worker(database_url, consumer, metrics).retried == 1
    assert (
        scalar(conn, "SELECT last_error FROM core.queue_messages") == "TransientError: ledger answered b'\\x00' as \\0"
    )


def test_a_worker_that_cannot_reach_the_database_again_logs_give_back_failed_and_gives_up_after_reconnect_for(
    database_url, conn, metrics
):
    """Connection lost mid-batch and no server answering a new one: give_back_failed is logged, the worker tries to
    reconnect for reconnect_for and then raises DatabaseUnavailable, and the batch waits out its lease."""
    for member in ("m-ok", "m-cut", "m-next"):
        publish(conn, {"member_id": member, "points": 1})
    credit = points_consumer.handler

    def cut_off(conn_, payload, ctx):
        if payload.member_id == "m-cut":
            worker.conninfo = "postgresql://postgres@127.0.0.1:1/nowhere"  # from now on, nothing answers
            conn_.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        credit(conn_, payload, ctx)

    # One transaction per job: m-ok's work is committed before m-cut's handler cuts the connection.
    consumer = Consumer(
        name=points_consumer.name, queue=QUEUE, payload_schema=CreditPoints, handler=cut_off, shares_transactions=False
    )
    config = replace(CONFIG, reconnect_for=timedelta(milliseconds=300))
    worker = Worker(database_url, consumer, policy=RetryPolicy(), config=config, metrics=metrics)
    with capture_logs() as logs, pytest.raises(DatabaseUnavailable, match="could not be reached again"):
        worker.run(once=True)
    (failed,) = [e for e in logs if e["event"] == "harness.worker.give_back_failed"]
    assert (failed["num_unacked"], failed["num_unreleased"]) == (1, 1)
    assert failed["error"].startswith("OperationalError: connection")
    assert conn.execute(
        "SELECT payload->>'member_id', attempts, lease_token IS NOT NULL FROM core.queue_messages ORDER BY id"
    ).fetchall() == [("m-ok", 1, True), ("m-cut", 1, True), ("m-next", 1, True)]
