"""The broker path end to end on the real RabbitMQ: failure, dead letter, replay, outbox, relay, success — once.

A job is published on RabbitMQ (``rabbit_target``, tests/support/relay_support.py: the test
broker under a queue prefix of this test's own) and run by a ``Worker(queue_url=<rabbit>)``
whose ledger refuses it: one ``core.dead_letters`` row. The operator replays it through the
operations layer (``maintenance.operations.dead_letters.replay``, what ``core-jobs dead-letters
replay`` runs): the message goes into the outbox (``core.queue_messages``) in the replay's
transaction; a worker on the broker relays its own queue between batches and runs it. Through
all of it the dead letter holds the job's fences (``core.holds_fence``, the purge's rule) until
the replayed delivery is handled. Crashes are made, never waited for: a relay dying between the
broker's confirm and its outbox ack, a port whose TCP connection is cut before its ack; leases
are expired by back-dating them.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg
import pytest
from support.factories import QUEUE, TENANT
from support.harness_support import TTL, expire_leases, fences, points, replay_state, scalar
from support.relay_support import TAKE_WAIT, Crashing, RabbitTarget
from support.waiting import wait_until

from harness.consumer.consumer import JobContext
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import write_dead_letter
from harness.errors import PermanentError
from harness.examples.points import CreditPoints, make_consumer
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import DeadLettered, Envelope
from harness.queue.relay import Relay
from harness.worker import WorkerStats
from maintenance.operations.dead_letters import replay

PAYLOAD = {"member_id": "m-1", "points": 7}
INFINITY = "infinity"  # a purge cutoff however late: only a pending or outstanding letter holds a fence then

# The purge's rule on one dead letter (migration 0008): does it keep its job's fences from `protected_from` on?
HOLDS_FENCE = "SELECT core.holds_fence(d, %(protected_from)s::timestamptz) FROM core.dead_letters d WHERE d.id = %(id)s"


class Ledger:
    """The loyalty ledger: refuses every credit (``unknown`` member) until the operator fixes it; counts its calls."""

    def __init__(self) -> None:
        self.refusing = True
        self.calls = 0

    def confirm(self, payload: CreditPoints, ctx: JobContext) -> None:
        self.calls += 1
        if self.refusing:
            raise PermanentError(f"loyalty ledger has no member {payload.member_id}")


def run_worker(database_url: str, target: RabbitTarget, ledger: Ledger) -> WorkerStats:
    """A worker on the broker (it relays its own queue's outbox between batches), once over what is ready."""
    return target.run_worker(ledger)


def publish_on_broker(target: RabbitTarget) -> uuid.UUID:
    """The job, published on RabbitMQ as a producer on the broker does (confirmed); its job id."""
    job_id = uuid.uuid4()
    port = target.port(worker="producer")
    port.publish(QUEUE, Envelope(job_id=job_id, payload=PAYLOAD, tenant_id=TENANT, correlation_id="corr-e2e"))
    port.close()
    return job_id


def holds_fences(conn: psycopg.Connection, letter: int, protected_from: datetime | str = INFINITY) -> bool:
    return scalar(conn, HOLDS_FENCE, {"id": letter, "protected_from": protected_from})


def outbox(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM core.queue_messages")


def failed_permanently(database_url: str, conn: psycopg.Connection, target: RabbitTarget, ledger: Ledger):
    """A job on the broker whose worker's ledger refused it: one pending dead letter, nothing left on the broker."""
    job_id = publish_on_broker(target)
    stats = run_worker(database_url, target, ledger)
    assert (stats.dead_lettered, stats.processed, ledger.calls) == (1, 0, 1)
    (letter,) = conn.execute(
        "SELECT id FROM core.dead_letters WHERE job_id = %s AND status = 'pending_review'", (job_id,)
    ).fetchone()
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 1
    assert target.take(QUEUE) == []  # acked after the letter committed
    assert holds_fences(conn, letter)
    return letter, job_id


def test_a_job_dead_lettered_on_rabbitmq_and_replayed_succeeds_once_through_the_outbox(
    database_url, conn, rabbit_target
):
    """Failed permanently on RabbitMQ: one dead letter; replayed: an outbox row; a worker on the broker relays and runs it, credited once, the replay processed, the letter holding the fences until then."""
    ledger = Ledger()
    letter, job_id = failed_permanently(database_url, conn, rabbit_target, ledger)

    replay(conn, [letter], operator="ops:ana")
    status = scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter,))
    assert (status, outbox(conn)) == ("replayed", 1)  # the message, committed with the replay, in the outbox
    assert replay_state(conn, letter) == (None, False) and holds_fences(conn, letter)  # outstanding

    ledger.refusing = False  # the operator fixed the ledger
    stats = run_worker(database_url, rabbit_target, ledger)

    assert (stats.processed, stats.duplicates, stats.dead_lettered) == (1, 0, 0)
    assert (points(conn, "m-1"), fences(conn, job_id), ledger.calls) == (7, 1, 2)
    assert replay_state(conn, letter) == ("processed", True)
    assert outbox(conn) == 0 and rabbit_target.take(QUEUE) == []
    handled = scalar(conn, "SELECT replay_handled_at FROM core.dead_letters WHERE id = %s", (letter,))
    assert not holds_fences(conn, letter)  # handled: no longer holds them whatever the cutoff...
    assert holds_fences(conn, letter, handled)  # ...but for the margin after its handling (a lost ack)


def test_a_relay_crash_between_publish_and_ack_publishes_the_replay_twice_and_it_succeeds_once(
    database_url, conn, rabbit_target
):
    """The relay dies after the broker confirmed the replay: it is on the broker and still in the outbox; the worker relays it again and gets both copies: one credit, one Duplicate, the replay processed."""
    ledger = Ledger()
    letter, job_id = failed_permanently(database_url, conn, rabbit_target, ledger)
    replay(conn, [letter], operator="ops:ana")
    with pytest.raises(KeyboardInterrupt):
        Relay(PgQueue(conn, worker="relay"), Crashing(rabbit_target.port()), [QUEUE]).run_once()
    assert (rabbit_target.ready(QUEUE), outbox(conn)) == (1, 1)  # on the broker, and leased in the outbox
    assert replay_state(conn, letter) == (None, False) and holds_fences(conn, letter)  # still outstanding
    expire_leases(conn)  # the dead relay's lease runs out

    ledger.refusing = False
    stats = run_worker(database_url, rabbit_target, ledger)

    assert (stats.processed, stats.duplicates, stats.dead_lettered) == (1, 1, 0)
    assert (points(conn, "m-1"), fences(conn, job_id), ledger.calls) == (7, 1, 2)
    assert replay_state(conn, letter) == ("processed", True)
    assert outbox(conn) == 0 and rabbit_target.take(QUEUE) == []


def test_a_redelivery_whose_dead_letter_committed_before_its_lost_ack_is_acked_unrun_by_the_worker(
    database_url, conn, rabbit_target, logs
):
    """Its dead letter committed, the port dies before the ack: RabbitMQ redelivers it (redelivered), and the worker acks it without running the handler, logging harness.job.already_dead_lettered once; one dead letter."""
    ledger = Ledger()
    job_id = publish_on_broker(rabbit_target)
    consumer = make_consumer(ledger)
    with psycopg.connect(database_url, autocommit=True) as dying_conn:
        dying = rabbit_target.port(worker="dying", claim_wait=TAKE_WAIT)
        (delivery,) = dying.claim(QUEUE, 1)
        assert not delivery.redelivered
        outcome = handle(dying_conn, consumer, delivery, policy=RetryPolicy(), fence_ttl=TTL)
        assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent"
        assert write_dead_letter(dying_conn, outcome.letter)  # what RabbitQueue.dead_letter commits before its ack ...
        rabbit_target.crash(dying)  # ... and the process dies instead of acking
    wait_until(lambda: rabbit_target.ready(QUEUE) == 1, what="the broker requeued the unacked delivery")
    # Only a delivery the broker marks redelivered is checked against its pending dead letter (harness/handling.py):
    # with the flag lost, the handler would run again.

    stats = run_worker(database_url, rabbit_target, ledger)

    assert (stats.duplicates, stats.dead_lettered, stats.processed, ledger.calls) == (1, 0, 0, 1)
    assert [e["job_id"] for e in logs.named("harness.job.already_dead_lettered")] == [str(job_id)]
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", (job_id,)) == 1
    assert rabbit_target.take(QUEUE) == []  # acked: nothing comes back
