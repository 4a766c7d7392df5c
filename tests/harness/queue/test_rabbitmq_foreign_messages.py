"""What another producer's message on RabbitMQ can claim, run by a real worker on the real broker (docs/rabbitmq.md).

Each message is published raw with pika, as a producer that is not the harness would, and a
``Worker(queue_url=<rabbit>)`` runs over what is ready. A header the database would refuse (a
trace context of another version, upper-case hex, a blank ``tracestate``, a NUL in the correlation
id, an id too long to index) is dropped at the adapter's decode: the job is handled once — one
effect, or one dead letter — and never fails as a delivery (``harness.worker.delivery_failed``).
A message without ``message_id`` is poison under a job id of its own; an attempt header the
harness could not have written (above the broker's delivery limit) is ignored.
"""

from __future__ import annotations

import json
import secrets
import uuid

import pika
import pytest
from support.factories import QUEUE, TENANT, add_dead_letter
from support.harness_support import points, scalar
from support.rabbit_support import BrokerChannel
from support.relay_support import RabbitTarget

from harness.examples.points import OutageLedger

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
REFUSED = "m-refused"  # the ledger has no such member: a permanent failure, one dead letter

# Each bad header, and the (traceparent, tracestate, correlation_id) the job keeps of it.
BAD_HEADERS = {
    "junk traceparent": ({"traceparent": "not-a-traceparent"}, (None, None, None)),
    "version-01 traceparent": ({"traceparent": "01" + TRACEPARENT[2:], "tracestate": "k=v"}, (None, None, None)),
    "upper-case traceparent": ({"traceparent": TRACEPARENT.upper()}, (None, None, None)),
    "all-zero trace id": ({"traceparent": f"00-{'0' * 32}-b7ad6b7169203331-01"}, (None, None, None)),
    "blank tracestate": ({"traceparent": TRACEPARENT, "tracestate": "   "}, (TRACEPARENT, None, None)),
    "tracestate without traceparent": ({"tracestate": "k=v"}, (None, None, None)),
    "NUL in the correlation id": ({"x-core-jobs-correlation-id": "corr\x00id"}, (None, None, None)),
    "a correlation id too long to index": (
        {"x-core-jobs-correlation-id": secrets.token_urlsafe(4_000)},
        (None, None, None),
    ),
}


def publish_raw(target: RabbitTarget, member: str, headers: dict, *, message_id: str | None = None) -> None:
    """A message as a producer that is not the harness publishes it, on the (declared) work queue."""
    target.port(worker="declaring").figures(QUEUE)
    body = json.dumps({"member_id": member, "points": 5}).encode()
    properties = pika.BasicProperties(
        message_id=message_id, delivery_mode=2, headers={"x-core-jobs-tenant-id": str(TENANT), **headers}
    )
    with BrokerChannel(target.rabbit_url) as channel:
        channel.basic_publish("", f"{target.prefix}{QUEUE}", body, properties, mandatory=True)


@pytest.mark.parametrize(("headers", "kept"), BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_a_header_the_database_refuses_is_dropped_and_the_failing_job_is_dead_lettered_once(
    rabbit_target, database_url, conn, headers, kept
):
    """The refused job is one dead letter, carrying what was valid of its headers; no delivery failed."""
    job_id = uuid.uuid4()
    publish_raw(rabbit_target, REFUSED, headers, message_id=str(job_id))
    stats = rabbit_target.run_worker(OutageLedger(unknown=frozenset({REFUSED})))
    assert (stats.dead_lettered, stats.failed) == (1, 0)
    letter = conn.execute(
        "SELECT traceparent, tracestate, correlation_id FROM core.dead_letters WHERE job_id = %s", (job_id,)
    ).fetchall()
    assert letter == [kept]
    assert rabbit_target.ready(QUEUE) == 0


@pytest.mark.parametrize(("headers", "kept"), BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_a_header_the_database_refuses_is_dropped_and_the_job_runs_once(
    rabbit_target, database_url, conn, headers, kept
):
    """The job credits once, as without the header; nothing failed, nothing is left on the broker."""
    publish_raw(rabbit_target, "m-1", headers, message_id=str(uuid.uuid4()))
    stats = rabbit_target.run_worker(OutageLedger())
    assert (stats.processed, stats.failed, stats.dead_lettered) == (1, 0, 0)
    assert points(conn, "m-1") == 5
    assert rabbit_target.ready(QUEUE) == 0


def test_two_identical_messages_without_a_message_id_are_two_poison_letters(rabbit_target, database_url, conn):
    """No message_id: no identity a fence could hold, so never run; each is a poison dead letter of its own job id."""
    for _ in range(2):
        publish_raw(rabbit_target, "m-1", {})
    stats = rabbit_target.run_worker(OutageLedger())
    assert (stats.dead_lettered, stats.processed, stats.failed) == (2, 0, 0)
    rows = conn.execute("SELECT job_id, last_error FROM core.dead_letters").fetchall()
    assert len({job for job, _error in rows}) == 2
    assert all("message_id" in error for _job, error in rows)
    assert points(conn, "m-1") == 0


@pytest.mark.parametrize("base", [21, 2**31, 2**62])
def test_an_attempt_header_above_the_delivery_limit_is_ignored_and_the_job_runs(
    rabbit_target, database_url, conn, base
):
    """The harness never writes a base above the delivery limit (20): such a header is not its own, read as 1."""
    publish_raw(rabbit_target, "m-1", {"x-core-jobs-attempt": base}, message_id=str(uuid.uuid4()))
    stats = rabbit_target.run_worker(OutageLedger())
    assert (stats.processed, stats.dead_lettered, stats.failed) == (1, 0, 0)
    assert points(conn, "m-1") == 5
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0


@pytest.mark.parametrize(("member", "handled"), [("m-1", "processed"), (REFUSED, "dead_lettered")])
def test_a_replay_of_header_naming_another_jobs_letter_leaves_that_letter_untouched(
    rabbit_target, database_url, conn, member, handled
):
    """``x-core-jobs-replay-of`` claims a replay only of a letter of the message's own job (and consumer): naming
    another job's outstanding replay, the job runs (or fails) as its own and that replay stays outstanding."""
    other_letter = add_dead_letter(conn, status="replayed", job_id=uuid.uuid4())
    job_id = uuid.uuid4()
    publish_raw(rabbit_target, member, {"x-core-jobs-replay-of": other_letter}, message_id=str(job_id))
    stats = rabbit_target.run_worker(OutageLedger(unknown=frozenset({REFUSED})))
    assert (stats.processed, stats.dead_lettered, stats.failed) == ((1, 0, 0) if handled == "processed" else (0, 1, 0))
    assert scalar(conn, "SELECT replay_outcome FROM core.dead_letters WHERE id = %s", (other_letter,)) is None
    if handled == "dead_lettered":  # its own letter, pending
        assert scalar(conn, "SELECT status FROM core.dead_letters WHERE job_id = %s", (job_id,)) == "pending_review"


def test_a_replay_of_header_naming_the_jobs_own_letter_marks_its_replay(rabbit_target, database_url, conn):
    """The same header naming a letter of the message's own job is the replay it says: marked processed."""
    job_id = uuid.uuid4()
    own_letter = add_dead_letter(conn, status="replayed", job_id=job_id)
    publish_raw(rabbit_target, "m-1", {"x-core-jobs-replay-of": own_letter}, message_id=str(job_id))
    assert rabbit_target.run_worker(OutageLedger()).processed == 1
    assert scalar(conn, "SELECT replay_outcome FROM core.dead_letters WHERE id = %s", (own_letter,)) == "processed"
