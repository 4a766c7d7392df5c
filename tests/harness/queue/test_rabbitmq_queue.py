"""The RabbitMQ adapter (harness/queue/rabbitmq.py) against the real broker: the port's contract, its topology, its recoveries."""

from __future__ import annotations

import json
import math
import time
import uuid
from datetime import timedelta

import pika
import pytest
from support.factories import TENANT
from support.harness_support import TTL, fences, points, scalar
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.dead_letters import write_dead_letter
from harness.examples.points import OutageLedger, make_consumer
from harness.handling import handle
from harness.queue import rabbitmq
from harness.queue.port import (
    DeadLettered,
    Duplicate,
    Envelope,
    InvalidPayload,
    UndecodablePayload,
    settle,
)
from harness.queue.rabbitmq import (
    BUCKET_STRETCH,
    BrokerUnavailable,
    RabbitQueue,
    delay_bucket,
    delay_queue_name,
    redact_url,
    redelivery_horizon,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def envelope(payload=None, **fields) -> Envelope:
    fields.setdefault("job_id", uuid.uuid4())
    return Envelope(
        payload={"member_id": "m-1", "points": 5} if payload is None else payload, tenant_id=TENANT, **fields
    )


def claim_all(port: RabbitQueue, queue: str, expected: int, limit: int = 10):
    """Claim until ``expected`` deliveries arrived (the broker pushes them asynchronously)."""
    got = []
    wait_until(lambda: got.extend(port.claim(queue, limit)) or len(got) >= expected, what=f"{expected} deliveries")
    return got


def test_a_published_envelope_is_claimed_whole_and_an_ack_removes_it(rabbit, conn):
    """Identity, payload, tenant, correlation id, replay_of and trace context arrive unchanged; attempt 1; acked, it is gone."""
    port = rabbit.port(conn)
    sent = envelope(correlation_id="c" * 300, replay_of=42, traceparent=TRACEPARENT, tracestate="k=v")
    port.publish(rabbit.queue, sent)
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert delivery.envelope == sent
    assert (delivery.queue, delivery.attempt, delivery.redelivered) == (rabbit.queue, 1, False)
    assert port.ack([delivery]) == 1
    assert rabbit.port(conn).claim(rabbit.queue, 10) == []
    assert port.figures(rabbit.queue) == (0, 0.0)


def test_claim_hands_back_at_most_the_limit_and_the_rest_on_the_next_claim(rabbit, conn):
    """The prefetch is the batch: three messages with limit 2 come as two, then one."""
    port = rabbit.port(conn)
    port.publish_many([(rabbit.queue, envelope()) for _ in range(3)])
    first = claim_all(port, rabbit.queue, 2, limit=2)
    assert len(first) == 2
    port.ack(first)
    assert len(claim_all(port, rabbit.queue, 1, limit=2)) == 1


@pytest.mark.parametrize("bad", [math.nan, "a\u0000b", "\ud800", {"when": object()}])
def test_a_payload_jsonb_cannot_store_is_refused_and_nothing_is_published(rabbit, conn, bad):
    """publish_many checks every payload first: one bad payload raises InvalidPayload and the good one is not sent."""
    port = rabbit.port(conn)
    with pytest.raises(InvalidPayload):
        port.publish_many([(rabbit.queue, envelope()), (rabbit.queue, envelope({"x": [bad]}))])
    assert rabbit.ready() == 0


def test_a_retry_waits_in_a_delay_bucket_then_comes_back_as_the_next_attempt(rabbit, conn):
    """The copy sits in the rounded-up bucket, not the work queue; made due, it is attempt 2 of the same job."""
    port = rabbit.port(conn)
    sent = envelope(replay_of=7, traceparent=TRACEPARENT)
    port.publish(rabbit.queue, sent)
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert port.retry(delivery, timedelta(seconds=31), "TransientError: timed out")
    assert rabbit.delayed() == {delay_queue_name(rabbit.queue, 31_500): 1}
    assert rabbit.ready() == 0
    rabbit.make_due()
    [again] = claim_all(port, rabbit.queue, 1)
    assert (again.envelope, again.attempt, again.redelivered) == (sent, 2, False)
    assert again.receipt.properties.headers["x-core-jobs-last-error"] == "TransientError: timed out"


def test_a_retry_delay_is_held_by_the_broker_and_expires_back_to_the_work_queue(rabbit, conn):
    """A real 200 ms TTL: the message dead-letters back from its bucket without anyone moving it."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert port.retry(delivery, timedelta(milliseconds=200), "TransientError: busy")
    [again] = claim_all(port, rabbit.queue, 1)
    assert again.attempt == 2


def test_a_dropped_connection_redelivers_counting_the_attempt_and_the_old_deliveries_are_lost(rabbit, conn, logs):
    """After a crash another worker gets attempt 2, redelivered; the crashed port's settling is lease lost, and it reconnects."""
    crashed, other = rabbit.port(conn), rabbit.port(conn)
    sent = envelope(replay_of=3, traceparent=TRACEPARENT)
    crashed.publish(rabbit.queue, sent)
    [delivery] = claim_all(crashed, rabbit.queue, 1)
    rabbit.crash(crashed)
    [again] = claim_all(other, rabbit.queue, 1)
    assert (again.envelope, again.attempt, again.redelivered) == (sent, 2, True)
    assert crashed.ack([delivery]) == 0
    assert crashed.retry(delivery, timedelta(seconds=1), "late") is False
    assert crashed.claim(rabbit.queue, 10) == []
    assert len(logs.named("harness.rabbitmq.reconnected")) == 1
    assert other.ack([again]) == 1


def test_settling_on_a_closed_channel_is_lease_lost_and_writes_no_dead_letter(rabbit, conn):
    """A channel the broker closed (consumer timeout) already requeued its delivery: ack 0, retry and dead_letter False."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    delivery.receipt.channel.close()  # what the broker's consumer timeout does
    letter = delivery.letter("points.credit", attempts=1, last_error="x")
    assert port.ack([delivery]) == 0
    assert port.retry(delivery, timedelta(seconds=1), "x") is False
    assert port.dead_letter(delivery, letter) is False
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0
    [again] = claim_all(port, rabbit.queue, 1)
    assert again.attempt == 2


def test_a_delivery_in_hand_when_the_broker_closes_the_publishing_channel_comes_back_once_the_port_reconnects(
    rabbit, conn
):
    """A retry into a delay bucket another process declared differently closes the port's publishing channel (the
    connection lives on): the next claim opens a new connection and closes the old one, so the delivery still in hand
    is requeued by the broker and claimed again (attempt 2) — not held by a forgotten connection."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    bucket_ms = delay_bucket(timedelta(seconds=1))
    bucket = delay_queue_name(rabbit.queue, bucket_ms)
    arguments = {**RabbitQueue.bucket_arguments(rabbit.queue, bucket_ms), "x-expires": 7_200_000}
    with rabbit._channel() as channel:  # another version's bucket: another idle expiry
        channel.queue_declare(bucket, durable=True, arguments=arguments)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-expires"):
            port.retry(delivery, timedelta(seconds=1), "TransientError: busy")
        [again] = claim_all(port, rabbit.queue, 1)
        assert (again.envelope, again.attempt, again.redelivered) == (delivery.envelope, 2, True)
        assert port.ack([again]) == 1
    finally:
        with rabbit._channel() as channel:
            channel.queue_delete(bucket)


def test_release_gives_a_delivery_back_without_counting_an_attempt(rabbit, conn):
    """Released, the same job comes back with the same attempt number."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert port.release([delivery]) == 1
    [again] = claim_all(port, rabbit.queue, 1)
    assert (again.envelope, again.attempt) == (delivery.envelope, 1)


def test_a_released_delivery_past_the_delivery_limit_comes_back_at_the_limit_never_as_a_first_attempt(rabbit, conn):
    """Two crashes take a job to attempt 3 under delivery limit 2 (the broker moves it on the third); released, its
    copy says the limit — above any max_attempts the limit allows, so still past the budget — not attempt 1."""
    rabbit.port(conn, delivery_limit=2).publish(rabbit.queue, envelope())
    for _ in range(2):
        crashing = rabbit.port(conn, delivery_limit=2)
        claim_all(crashing, rabbit.queue, 1)
        rabbit.crash(crashing)
    port = rabbit.port(conn, delivery_limit=2)
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert delivery.attempt == 3
    assert port.release([delivery]) == 1
    [again] = claim_all(rabbit.port(conn, delivery_limit=2), rabbit.queue, 1)
    assert (again.attempt, again.redelivered) == (2, True)


def test_close_gives_back_what_the_broker_pushed_but_no_claim_returned(rabbit, conn):
    """A message prefetched after the last claim is released on close: the next worker sees attempt 1."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    port.ack([delivery])
    port.publish(rabbit.queue, envelope())
    wait_until(lambda: port._link.connection.process_data_events(0) or port._link.consumers[rabbit.queue].buffer)
    port.close()
    [again] = claim_all(rabbit.port(conn), rabbit.queue, 1)
    assert again.attempt == 1


def test_a_message_that_keeps_killing_its_consumer_lands_in_exhausted_and_is_dead_lettered_unrun(rabbit, conn):
    """Past the broker's delivery limit the message moves to .exhausted; claimed from there beyond the budget, the harness dead-letters it."""
    sent = envelope()
    rabbit.port(conn, delivery_limit=1).publish(rabbit.queue, sent)
    for _ in range(2):  # delivery limit 1: two deliveries, then the broker gives up on it
        port = rabbit.port(conn, delivery_limit=1)
        claim_all(port, rabbit.queue, 1)
        rabbit.crash(port)
    wait_until(lambda: rabbit.exhausted() == 1, what="the message in .exhausted")
    port = rabbit.port(conn, delivery_limit=1)
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert (delivery.envelope, delivery.attempt, delivery.redelivered) == (sent, 3, True)
    outcome = handle(
        conn, make_consumer(queue=rabbit.queue), delivery, policy=RetryPolicy(max_attempts=2), fence_ttl=TTL
    )
    assert isinstance(outcome, DeadLettered) and outcome.reason == "exhausted"
    assert settle(port, delivery, outcome)
    assert points(conn, "m-1") == 0
    assert scalar(conn, "SELECT attempts FROM core.dead_letters WHERE job_id = %s", (sent.job_id,)) == 3
    assert port.claim(rabbit.queue, 10) == [] and rabbit.exhausted() == 0


def test_a_dead_letter_whose_ack_is_lost_is_false_and_its_redelivery_finds_the_letter(rabbit, conn, monkeypatch):
    """The letter commits, then the channel closes before the ack: False (the lease was lost, the broker redelivers);
    the redelivery is a duplicate of the recorded failure, and there is one letter."""
    port = rabbit.port(conn)
    sent = envelope({"member_id": "m-unknown", "points": 5})
    port.publish(rabbit.queue, sent)
    [delivery] = claim_all(port, rabbit.queue, 1)
    consumer = make_consumer(OutageLedger(unknown=frozenset({"m-unknown"})), queue=rabbit.queue)
    outcome = handle(conn, consumer, delivery, policy=RetryPolicy(), fence_ttl=TTL)
    assert isinstance(outcome, DeadLettered)

    def write_then_lose_the_channel(*args, **kwargs):
        written = write_dead_letter(*args, **kwargs)
        delivery.receipt.channel.close()  # as the broker's consumer timeout would: the delivery is requeued
        return written

    monkeypatch.setattr(rabbitmq, "write_dead_letter", write_then_lose_the_channel)
    assert port.dead_letter(delivery, outcome.letter) is False
    monkeypatch.undo()
    [again] = claim_all(port, rabbit.queue, 1)
    assert again.redelivered
    second = handle(conn, consumer, again, policy=RetryPolicy(), fence_ttl=TTL)
    assert second == Duplicate(already_dead_lettered=True)
    assert settle(port, again, second)
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", (sent.job_id,)) == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [(b"\xff\xfe", "not UTF-8"), (b"{not json", "not valid JSON"), (b'{"x": NaN}', "finite"), (b'"a\\u0000"', "u0000")],
)
def test_a_body_the_harness_cannot_read_is_poison_dead_lettered_never_an_error_in_claim(rabbit, conn, body, says):
    """claim hands an UndecodablePayload; the harness dead-letters it with the body kept as a JSON string."""
    port = rabbit.port(conn)
    port.figures(rabbit.queue)  # declares the topology
    job_id = uuid.uuid4()
    rabbit.publish_raw(body, pika.BasicProperties(message_id=str(job_id), delivery_mode=2))
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert isinstance(delivery.envelope.payload, UndecodablePayload) and says in delivery.envelope.payload.reason
    outcome = handle(conn, make_consumer(queue=rabbit.queue), delivery, policy=RetryPolicy(), fence_ttl=TTL)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "poison"
    assert settle(port, delivery, outcome)
    stored = scalar(conn, "SELECT payload FROM core.dead_letters WHERE job_id = %s", (job_id,))
    assert isinstance(stored, str)


@pytest.mark.parametrize("base", [0, -1_000, 21, 10**12])
def test_an_attempt_header_out_of_range_is_read_as_a_first_attempt(rabbit, conn, base):
    """Another producer's x-core-jobs-attempt of 0, negative, or above the delivery limit (20) — which the harness
    never writes — reads as 1: a transient failure is a retry (not a RetryPolicyError out of handle, which stops the
    worker, nor a dead letter of a job never run)."""
    port = rabbit.port(conn)
    port.figures(rabbit.queue)  # declares the topology
    job_id = uuid.uuid4()
    headers = {"x-core-jobs-attempt": base, "x-core-jobs-tenant-id": str(TENANT)}
    body = json.dumps({"member_id": "m-1", "points": 5}).encode()
    rabbit.publish_raw(body, pika.BasicProperties(message_id=str(job_id), delivery_mode=2, headers=headers))
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert delivery.attempt == 1
    consumer = make_consumer(OutageLedger(timeouts={"m-1": 1}), queue=rabbit.queue)
    outcome = handle(conn, consumer, delivery, policy=RetryPolicy(), fence_ttl=TTL)
    assert type(outcome).__name__ == "RetryAfter"
    assert settle(port, delivery, outcome)


def test_the_harness_drains_a_queue_on_rabbitmq_with_exactly_one_effect_per_job(rabbit, conn):
    """handle + settle over claims: transient failures retry through delay buckets, a crash redelivers; each job credits once."""
    members = [f"m-{n}" for n in range(12)]
    consumer = make_consumer(OutageLedger(timeouts={"m-0": 2, "m-1": 1}), queue=rabbit.queue)
    port = rabbit.port(conn)
    sent = [envelope({"member_id": m, "points": 10}) for m in members]
    jobs = [e.job_id for e in sent]
    port.publish_many([(rabbit.queue, e) for e in sent])
    crashing = rabbit.port(conn)
    batch = claim_all(crashing, rabbit.queue, 3, limit=3)
    for delivery in batch:  # the work commits (or fails), then the worker dies before settling anything
        handle(conn, consumer, delivery, policy=RetryPolicy(), fence_ttl=TTL)
    rabbit.crash(crashing)
    outcomes = []
    while True:
        deliveries = port.claim(rabbit.queue, 5)
        if not deliveries:
            rabbit.make_due()
            deliveries = port.claim(rabbit.queue, 5)
            if not deliveries and not rabbit.delayed_total():
                break
        for delivery in deliveries:
            outcome = handle(conn, consumer, delivery, policy=RetryPolicy(), fence_ttl=TTL)
            outcomes.append(type(outcome).__name__)
            assert settle(port, delivery, outcome)
    assert [points(conn, m) for m in members] == [10] * 12
    assert [fences(conn, job) for job in jobs] == [1] * 12
    assert outcomes.count("RetryAfter") >= 1 and outcomes.count("Duplicate") >= 1
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 0


def test_from_url_takes_its_options_from_the_query_and_passes_pikas_on(rabbit_url, conn):
    """delivery_limit, prefix and consumer_timeout are ours; heartbeat is pika's and still works."""
    port = RabbitQueue.from_url(
        f"{rabbit_url}?delivery_limit=7&prefix=app.&consumer_timeout=60000&heartbeat=30", conn, worker="w"
    )
    assert (port.delivery_limit, port.prefix, port.consumer_timeout) == (7, "app.", timedelta(minutes=1))
    assert [p.heartbeat for p in port._parameters] == [30]
    with pytest.raises(ValueError, match="delivery_limit='many'"):
        RabbitQueue.from_url(f"{rabbit_url}?delivery_limit=many", conn)


def test_the_urls_password_never_appears_in_a_repr_an_error_or_a_log(conn, logs):
    """An unreachable broker's error and the port's repr name the host, never the password."""
    url = "amqp://app:s3cr3t-pw@127.0.0.1:1/%2F?connection_attempts=1&socket_timeout=1"
    port = RabbitQueue(url, conn)
    with pytest.raises(BrokerUnavailable) as raised:
        port.claim("q", 1)
    assert "127.0.0.1" in str(raised.value)
    for text in (str(raised.value), repr(port), logs.text, redact_url(url)):
        assert "s3cr3t" not in text


def test_a_broker_host_that_does_not_resolve_is_broker_unavailable_naming_the_host(conn):
    """A DNS failure is retried like a refused connection, then BrokerUnavailable naming the host, not a bare gaierror."""
    port = RabbitQueue("amqp://app:s3cr3t@broker.invalid:5672/%2F?connection_attempts=1&socket_timeout=1", conn)
    with pytest.raises(BrokerUnavailable) as raised:
        port.claim("q", 1)
    assert "broker.invalid" in str(raised.value) and "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize(
    ("user", "password"),
    [
        ("app", "pa/ss-s3cr3t"),
        ("app", "pa#ss-s3cr3t"),
        ("app", "pa?ss-s3cr3t"),
        ("app", "pa@ss-s3cr3t"),
        ("app", "pa:ss-s3cr3t"),
        ("svc@team", "pw-s3cr3t"),
        ("svc@team", "pa@ss-s3cr3t"),
    ],
)
def test_a_password_with_a_character_urls_reserve_never_appears_in_an_error_or_a_repr(conn, logs, user, password):
    """A user name or password written unencoded with / # ? : or @ (which URL parsers read as the path, fragment,
    query, port or host) is still hidden: in the error of a URL pika cannot read, in redact_url, in the port's url
    and repr, in the unreachable error and in the adapter's events; the host is still named."""
    url = f"amqp://{user}:{password}@127.0.0.1:1/%2F?connection_attempts=1&socket_timeout=1"
    texts = [redact_url(url)]
    try:
        port = RabbitQueue(url, conn)
    except ValueError as exc:
        texts.append(str(exc))
    else:
        texts += [repr(port), port.url]
        with pytest.raises(BrokerUnavailable) as raised:
            port.claim("q", 1)
        texts.append(str(raised.value))
        port.close()
    for text in texts:
        assert "s3cr3t" not in text and "127.0.0.1" in text
    assert "s3cr3t" not in logs.text


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("amqp://app:pw-s3cr3t@127.0.0.1:notaport/%2F", "port"),
        ("amqp://app:pw-s3cr3t@127.0.0.1:99999/%2F", "port"),
        ("amqp://app:pw-s3cr3t@[::1/%2F", "IPv6"),
        ("amqp://svc@team:pw-s3cr3t@[::1/%2F", "IPv6"),
        ("amqp://app:pw-s3cr3t@127.0.0.1:1/%2F?connection_attempts=many", "connection_attempts"),
        ("amqp://app:pw-s3cr3t@127.0.0.1:1/%2F?no_such_option=1", "no_such_option"),
    ],
)
def test_a_url_pika_cannot_read_is_a_queue_url_error_naming_the_problem_never_the_password(conn, url, problem):
    """from_url refuses a URL pika would refuse with a QueueUrlError (a ValueError) that names the problem and shows
    the URL masked, before any connection."""
    from harness.queue.adapters import QueueUrlError

    with pytest.raises(QueueUrlError) as raised:
        RabbitQueue.from_url(url, conn)
    assert problem in str(raised.value) and "s3cr3t" not in str(raised.value), raised.value
    assert "***@" in str(raised.value)


@pytest.mark.pure
@pytest.mark.parametrize("ms", [1, 99, 100, 101, 200, 251, 31_000, 3_600_000, 4_000_000_000])
def test_a_delay_is_rounded_up_to_a_bucket_never_shorter_and_at_most_28_percent_longer(ms):
    """delay_bucket never shortens a delay; from 100 ms on, the bucket is within BUCKET_STRETCH of it."""
    bucket = delay_bucket(timedelta(milliseconds=ms))
    assert bucket >= ms
    assert bucket <= max(100, ms * BUCKET_STRETCH)
    assert BUCKET_STRETCH == 1.28


@pytest.mark.pure
def test_the_redelivery_horizon_adds_bucket_rounding_and_every_consumer_timeout_a_job_can_wait_out():
    """With the default policy, 30 min consumer timeout and limit 20: 28 % of the window + 26 timeouts, to the second."""
    policy = RetryPolicy()
    horizon = redelivery_horizon(policy)
    rounding = max_retry_window(policy) * (BUCKET_STRETCH - 1) + timedelta(milliseconds=400)
    assert horizon == timedelta(seconds=math.ceil((rounding + timedelta(minutes=30) * 26).total_seconds()))
    assert timedelta(hours=13) < horizon < timedelta(hours=13, minutes=5)


def test_a_port_without_tracing_publishes_a_body_of_plain_json(rabbit, conn):
    """The body on the broker is the payload as JSON, message_id the job id, persistent."""
    port = rabbit.port(conn)
    sent = envelope({"member_id": "é", "points": 1})
    port.publish(rabbit.queue, sent)
    [delivery] = claim_all(port, rabbit.queue, 1)
    assert json.loads(delivery.receipt.body) == sent.payload
    assert delivery.receipt.properties.message_id == str(sent.job_id)
    assert delivery.receipt.properties.delivery_mode == 2


def test_a_publish_after_a_dropped_connection_reconnects_and_is_delivered_once(rabbit, conn, logs):
    """The port's connection cut while idle: the next publish reconnects, and exactly one message is on the queue."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    rabbit.crash(port)
    sent = envelope()
    port.publish(rabbit.queue, sent)
    assert len(logs.named("harness.rabbitmq.reconnected")) == 1
    assert port.figures(rabbit.queue) == (2, 0.0)


def test_a_queue_declared_with_another_delivery_limit_is_refused_naming_the_argument(rabbit, conn):
    """Every process must declare a queue alike: the broker refuses a different x-delivery-limit, and the error says so."""
    rabbit.port(conn, delivery_limit=5).publish(rabbit.queue, envelope())
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-delivery-limit"):
        rabbit.port(conn, delivery_limit=6).claim(rabbit.queue, 1)


def test_a_job_counts_an_attempt_only_when_a_worker_holding_it_dies(rabbit, conn):
    """Suspects claimed one at a time, each claim cancelling its consumer before the broker filled its window
    (``claim_wait`` 0): what the broker pushed before the Cancel-OK is given back uncounted, so every suspect
    arrives at attempt 2 and every fresh job at 1 (pika's own cancel rejects such deliveries: requeued, counted)."""
    suspects, fresh = [envelope() for _ in range(40)], [envelope() for _ in range(1000)]
    publisher = rabbit.port(conn)
    publisher.publish_many([(rabbit.queue, e) for e in suspects])
    crashing = rabbit.port(conn)
    claim_all(crashing, rabbit.queue, len(suspects), limit=len(suspects))
    rabbit.crash(crashing)  # every suspect comes back counted once: attempt 2, redelivered, ahead of the fresh ones
    publisher.publish_many([(rabbit.queue, e) for e in fresh])
    port = rabbit.port(conn, claim_wait=timedelta(0))
    attempts: dict[uuid.UUID, list[int]] = {}

    def claim_and_ack() -> bool:
        deliveries = port.claim(rabbit.queue, 10)
        for delivery in deliveries:
            attempts.setdefault(delivery.envelope.job_id, []).append(delivery.attempt)
        port.ack(deliveries)
        return len(attempts) == len(suspects) + len(fresh)

    wait_until(claim_and_ack, timeout=60, what="every job claimed")
    assert {e.job_id: attempts[e.job_id] for e in suspects} == {e.job_id: [2] for e in suspects}
    assert {e.job_id: attempts[e.job_id] for e in fresh} == {e.job_id: [1] for e in fresh}


def test_close_gives_back_uncounted_what_the_broker_was_still_pushing(rabbit, conn):
    """Ports that ack a claim and close at once, while the broker refills the window they opened: the deliveries in
    flight at the close are released, not requeued counted, so every job is claimed at attempt 1 in the end."""
    sent = [envelope() for _ in range(300)]
    rabbit.port(conn).publish_many([(rabbit.queue, e) for e in sent])
    attempts: dict[uuid.UUID, list[int]] = {}

    def claim_ack_and_close() -> bool:
        port = rabbit.port(conn, claim_wait=timedelta(0))
        deliveries = port.claim(rabbit.queue, 10)
        for delivery in deliveries:
            attempts.setdefault(delivery.envelope.job_id, []).append(delivery.attempt)
        port.ack(deliveries)
        port.close()
        return len(attempts) == len(sent)

    wait_until(claim_ack_and_close, timeout=60, what="every job claimed")
    assert {e.job_id: attempts[e.job_id] for e in sent} == {e.job_id: [1] for e in sent}


def test_close_closes_the_connection_even_when_its_queue_was_deleted_meanwhile(rabbit, conn, logs):
    """The queue deleted under a consumer: giving back what it was pushed fails (logged), the connection still closes."""
    port = rabbit.port(conn)
    port.publish(rabbit.queue, envelope())
    [delivery] = claim_all(port, rabbit.queue, 1)
    port.ack([delivery])
    link = port._link
    with rabbit._channel() as channel:
        channel.queue_delete(rabbit.queue)
    port.close()
    assert link.connection.is_closed
    assert len(logs.named("harness.rabbitmq.close_failed")) == 1


def test_close_with_deliveries_in_hand_counts_only_those_and_does_not_wait_out_the_window(rabbit, conn, logs):
    """A worker closing on an error path with a claim unsettled: its window is full with them, so the cancel neither
    waits for it to fill nor leaves room; the deliveries in hand come back counted (attempt 2), the rest at 1."""
    sent = [envelope() for _ in range(25)]
    rabbit.port(conn).publish_many([(rabbit.queue, e) for e in sent])
    port = rabbit.port(conn)
    in_hand = {delivery.envelope.job_id for delivery in claim_all(port, rabbit.queue, 10, limit=10)}
    started = time.monotonic()
    port.close()
    assert time.monotonic() - started < rabbitmq.STOP_WAIT.total_seconds() / 2
    assert logs.named("harness.rabbitmq.cancelled_with_room") == []
    other, attempts = rabbit.port(conn), {}

    def claim_and_ack() -> bool:
        deliveries = other.claim(rabbit.queue, 10)
        attempts.update({delivery.envelope.job_id: delivery.attempt for delivery in deliveries})
        other.ack(deliveries)
        return len(attempts) == len(sent)

    wait_until(claim_and_ack, what="every job claimed again")
    assert attempts == {e.job_id: 2 if e.job_id in in_hand else 1 for e in sent}
