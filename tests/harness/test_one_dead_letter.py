"""One dead letter per failure: a second letter of a job already pending for its consumer is not written, and a
redelivered delivery of a dead-lettered job is acked unrun — what makes "commit in PostgreSQL, then ack" safe."""

from __future__ import annotations

import uuid
from dataclasses import replace

from support.factories import CONSUMER, QUEUE, TENANT, dead_letter
from support.harness_support import TTL, points, replay_state, scalar

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import DeadLetter, write_dead_letter
from harness.errors import PermanentError
from harness.examples.points import CreditPoints, make_consumer
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import DeadLettered, Delivery, Duplicate, Envelope
from maintenance.operations.dead_letters import discard, replay

POLICY = RetryPolicy()
PENDING = "SELECT count(*) FROM core.dead_letters WHERE job_id = %s AND status = 'pending_review'"


def letter(job_id: uuid.UUID, *, consumer: str = CONSUMER, replay_of: int | None = None) -> DeadLetter:
    return DeadLetter(
        job_id=job_id,
        queue=QUEUE,
        consumer=consumer,
        payload={"member_id": "m-1", "points": 5},
        attempts=1,
        last_error="PermanentError: no such member",
        tenant_id=TENANT,
        replay_of=replay_of,
    )


def refusing() -> Consumer:
    """A points consumer whose handler credits, then refuses the job for good: every delivery is a dead letter."""
    credit = make_consumer().handler

    def handler(conn, payload, ctx):
        credit(conn, payload, ctx)
        raise PermanentError("no such member")

    return Consumer(name=CONSUMER, queue=QUEUE, payload_schema=CreditPoints, handler=handler)


def delivery(job_id: uuid.UUID, *, redelivered: bool, replay_of: int | None = None) -> Delivery:
    envelope = Envelope(job_id=job_id, payload={"member_id": "m-1", "points": 5}, tenant_id=TENANT, replay_of=replay_of)
    return Delivery(queue=QUEUE, envelope=envelope, attempt=1, redelivered=redelivered)


def test_a_second_dead_letter_of_a_job_pending_for_its_consumer_is_not_written(conn):
    """write_dead_letter returns the new letter's id, then None for the same job and consumer: one pending letter."""
    job_id = uuid.uuid4()
    first = write_dead_letter(conn, letter(job_id))
    assert isinstance(first, int)
    assert write_dead_letter(conn, letter(job_id)) is None
    assert scalar(conn, PENDING, (job_id,)) == 1


def test_another_consumer_of_the_same_job_gets_its_own_dead_letter(conn):
    """The rule is per (consumer, job_id): two consumers of one job each keep their failure."""
    job_id = uuid.uuid4()
    assert write_dead_letter(conn, letter(job_id)) is not None
    assert write_dead_letter(conn, letter(job_id, consumer="points.audit")) is not None
    assert scalar(conn, PENDING, (job_id,)) == 2


def test_a_job_fails_again_after_its_letter_was_discarded_and_gets_a_new_one(conn):
    """Once the pending letter is discarded, a new failure of the job is written: only pending letters are unique."""
    letter_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 5})
    discard(conn, [letter_id], operator="ana", reason="tested")
    assert write_dead_letter(conn, letter(job_id)) is not None
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", (job_id,)) == 2


def test_a_replay_failing_while_another_letter_of_its_job_is_pending_is_marked_dead_lettered(conn):
    """A no-op write still marks the replay handled: the pending letter already there holds the job's fences."""
    replayed_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 5})
    replay(conn, [replayed_id], operator="ana")
    conn.execute("DELETE FROM core.queue_messages")
    assert write_dead_letter(conn, letter(job_id)) is not None  # the job failed again on another path meanwhile
    assert write_dead_letter(conn, letter(job_id, replay_of=replayed_id)) is None
    assert replay_state(conn, replayed_id) == ("dead_lettered", True)
    assert scalar(conn, PENDING, (job_id,)) == 1


def test_the_reference_queue_removes_a_message_whose_failure_is_already_pending(conn):
    """PgQueue.dead_letter of a job already pending removes the message, reports it settled, writes no second letter."""
    job_id = uuid.uuid4()
    assert write_dead_letter(conn, letter(job_id)) is not None
    queue = PgQueue(conn)
    queue.publish(QUEUE, Envelope(job_id=job_id, payload={"member_id": "m-1", "points": 5}, tenant_id=TENANT))
    [claimed] = queue.claim(QUEUE, 1)
    assert queue.dead_letter(claimed, letter(job_id)) is True
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert scalar(conn, PENDING, (job_id,)) == 1


def test_a_redelivered_delivery_of_a_dead_lettered_job_is_a_duplicate_and_not_run(conn):
    """Dead-lettered, then redelivered (its ack lost): Duplicate, the handler not run again, still one letter."""
    job_id = uuid.uuid4()
    first = handle(conn, refusing(), delivery(job_id, redelivered=False), policy=POLICY, fence_ttl=TTL)
    assert isinstance(first, DeadLettered)
    assert write_dead_letter(conn, first.letter) is not None
    again = handle(conn, refusing(), delivery(job_id, redelivered=True), policy=POLICY, fence_ttl=TTL)
    assert again == Duplicate(already_dead_lettered=True)
    assert points(conn, "m-1") == 0  # rolled back the first time, never run the second
    assert scalar(conn, PENDING, (job_id,)) == 1


def test_a_delivery_not_marked_redelivered_is_run_whatever_letters_its_job_has(conn):
    """No probe without ``redelivered``: a first delivery of a job with a pending letter runs its handler."""
    job_id = uuid.uuid4()
    assert write_dead_letter(conn, letter(job_id)) is not None
    outcome = handle(conn, make_consumer(), delivery(job_id, redelivered=False), policy=POLICY, fence_ttl=TTL)
    assert outcome != Duplicate(already_dead_lettered=True)
    assert points(conn, "m-1") == 5


def test_a_redelivered_replay_is_run_until_its_replay_is_handled(conn):
    """A redelivered replay whose replay is still outstanding runs, even with another letter of its job pending."""
    replayed_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 5})
    replay(conn, [replayed_id], operator="ana")
    conn.execute("DELETE FROM core.queue_messages")
    assert write_dead_letter(conn, letter(job_id)) is not None  # the job failed again on another path meanwhile
    outcome = handle(
        conn, make_consumer(), delivery(job_id, redelivered=True, replay_of=replayed_id), policy=POLICY, fence_ttl=TTL
    )
    assert outcome != Duplicate(already_dead_lettered=True)
    assert points(conn, "m-1") == 5
    assert replay_state(conn, replayed_id) == ("processed", True)


def test_a_redelivered_replay_already_dead_lettered_is_a_duplicate(conn):
    """A replay that failed again (new letter, replay marked dead_lettered) and is redelivered is not run again."""
    replayed_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 5})
    replay(conn, [replayed_id], operator="ana")
    d = delivery(job_id, redelivered=False, replay_of=replayed_id)
    failed = handle(conn, refusing(), d, policy=POLICY, fence_ttl=TTL)
    assert isinstance(failed, DeadLettered)
    assert write_dead_letter(conn, failed.letter) is not None
    assert replay_state(conn, replayed_id) == ("dead_lettered", True)
    again = handle(conn, refusing(), replace(d, redelivered=True), policy=POLICY, fence_ttl=TTL)
    assert again == Duplicate(already_dead_lettered=True)
    assert scalar(conn, PENDING, (job_id,)) == 1
