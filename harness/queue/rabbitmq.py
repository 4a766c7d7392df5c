"""The RabbitMQ adapter: the harness's queue port on durable quorum queues (pika, one blocking connection).

``RabbitQueue(url, conn, worker=…, lease=…)`` — or :meth:`RabbitQueue.from_url`, which is what
``CORE_JOBS_QUEUE_URL=amqp://user:password@host:5672/vhost?delivery_limit=20`` selects — holds its
own pika ``BlockingConnection`` (one per worker thread: pika is not thread-safe) and the worker's
psycopg connection ``conn`` (autocommit), on which it writes dead letters. docs/rabbitmq.md. What needs no
pika — the URL's options, queue names, delay buckets, the redelivery horizon — lives in
:mod:`harness.queue.rabbitmq_topology` and is re-exported here.

Topology, declared idempotently on first use of a harness queue ``q`` (``prefix`` + ``q``):

- ``q``: the work queue — quorum (replicated, durable), ``x-delivery-limit`` (default
  :data:`DEFAULT_DELIVERY_LIMIT`), dead-lettering ``at-least-once`` (hence ``x-overflow:
  reject-publish``) to ``q.exhausted``.
- ``q.exhausted``: quorum; what the broker's delivery limit removed from ``q``. :meth:`claim`
  reads it too and hands such a delivery back numbered beyond the limit, so the harness
  dead-letters it unrun (harness/handling.py) — a message that kills its consumer every time ends
  as a ``core.dead_letters`` row, never lost nor looping on the broker.
- ``q.delay.<ms>ms``: delay buckets, quorum, created when a retry first needs one: queue-level
  ``x-message-ttl`` of ``<ms>``, dead-lettering (at-least-once) back to ``q`` when it expires, and
  ``x-expires`` (the TTL + :data:`BUCKET_IDLE`) so a bucket no one uses vanishes. The broker holds
  the delayed message; no worker sleeps. A delay is rounded **up** to the next bucket of the R10
  series (100, 125, 160, 200, 250, 315, 400, 500, 630, 800 ms, × 10ⁿ): never shorter, at most 28 %
  longer (:func:`delay_bucket`); a delay under 100 ms waits 100 ms; one over ~46 days is refused.

Messages: the body is the payload as JSON (UTF-8); ``message_id`` is the job id; headers carry the
tenant, correlation id, ``replay_of``, the W3C trace context and the harness's **attempt base**
``x-core-jobs-attempt``; persistent delivery mode; published with **publisher confirms** (a publish
returns once the broker has the message on its quorum). A delivery's ``attempt`` is the base plus
the broker's ``x-delivery-count`` (deliveries returned unsettled — a consumer that died, a channel
closed by the consumer timeout), so a crashed worker's redelivery counts an attempt, as on the
reference queue (a base header outside ``1..delivery_limit``, which the harness never writes, reads
as 1, and an attempt is at most :data:`MAX_ATTEMPT`: another producer's header can neither make the
retry policy or the dead letter's write fail on every delivery, nor get a job dead-lettered unrun).
``redelivered`` is the broker's flag, or ``x-core-jobs-redelivered`` on a released copy of a
redelivered delivery. What else another producer can claim (docs/rabbitmq.md): a
message without ``message_id`` is poison under a fresh random job id; a trace context or correlation
id the tables would refuse is dropped (harness/queue/fields.py), logged ``harness.rabbitmq.header_dropped``. A body that is not JSON the harness could
store (not UTF-8, not JSON, NaN, ``\\u0000``, too deep…) becomes an
:class:`~harness.queue.port.UndecodablePayload` — that delivery's poison dead letter, whose payload
is then the body as a JSON *string* (what jsonb can keep) — never an exception in ``claim``.

Settling:

- **claim**: a consumer per queue (``basic_qos(prefetch_count=limit)``, manual acks): the
  prefetch is the batch. It returns what is deliverable now, up to ``limit``, waiting at most
  ``claim_wait`` (default 50 ms) for messages the broker reports ready. What the broker pushed
  beyond what a claim returned waits for the next claim (:meth:`close` gives it back uncounted).
  A claim returns at most one redelivered delivery; when it does, nothing else may be at stake
  while it runs (it may be what killed the last worker, and a delivery returned by a death is
  counted): the consumer is cancelled, what it had pushed beyond the claim released, and the next
  claim consumes anew. A consumer is cancelled once its window is full, or nothing is ready to fill
  it, or after :data:`STOP_WAIT`: cancelled with room, the messages on their way into it would come
  back counted (:meth:`_Consumer.stop`, docs/rabbitmq.md "Only a death counts a delivery").
- **ack**: ``basic.ack`` on the channel that delivered it. A closed channel means the broker
  already requeued the message: lease lost (0).
- **retry**: publish a copy (attempt base = this attempt + 1, ``x-core-jobs-last-error``) into the
  delay bucket, confirmed, then ack the original. A crash between the two leaves two copies; the
  fence absorbs the second.
- **dead_letter**: write the dead letter on ``conn`` and commit, then ack; True once acked, whether
  the letter was written now or the job's failure was already a pending letter (as on the reference
  queue); False when the lease was lost, before the write or at the ack. A crash or a lost ack
  between the two redelivers the message; the harness makes that a duplicate (one pending dead letter per job).
- **release**: publish a copy with the same attempt (not counted), confirmed, then ack — a
  ``nack`` with requeue would count a delivery towards the broker's limit. The copy goes to the
  back of the queue; a redelivered one's copy says ``x-core-jobs-redelivered`` (it is still a suspect).

The lease is the broker's ``consumer_timeout`` (global in RabbitMQ 3.10, default 30 min): a
delivery unacked that long gets its channel closed and the message requeued; the adapter's ``lease``
is not enforced by the broker, and ``consumer_timeout`` (URL option, ms) must say what the broker
is configured with: :func:`redelivery_horizon` uses it.

Connection loss: the next ``claim`` reconnects (at most :data:`RECONNECT_ATTEMPTS` tries, logged
``harness.rabbitmq.reconnected``); deliveries of the old connection settle as lease lost — the
broker requeued them, counted. So does a publishing channel the broker closed on a live connection
(a declare it refused): the old connection is closed, not left holding its deliveries. A publish that meets a dead connection reconnects and publishes
again (a copy may already be there: the fence absorbs it). The URL's password never appears in a
log, an error or a repr.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit
from uuid import NAMESPACE_URL, UUID, uuid4, uuid5

import pika
import pika.exceptions
import psycopg
import structlog
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from harness import replication
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import DeadLetter, UndecodablePayload, write_dead_letter
from harness.errors import describe_error
from harness.queue.adapters import QueueUrlError
from harness.queue.fields import (
    correlation_id_problem,
    received_correlation_id,
    received_trace_context,
    trace_context_problem,
)
from harness.queue.port import (
    NO_TENANT,
    Delivery,
    Envelope,
    InvalidPayload,
    check_envelope,
    check_payload,
    decode_payload,
)
from harness.queue.publishing import publish_span
from harness.queue.rabbitmq_topology import (  # the pika-free part, re-exported: names, delays, URL options, horizon
    BUCKET_IDLE,
    BUCKET_REDECLARE,
    BUCKET_STRETCH,
    BUCKETS_MS,
    DEFAULT_CLAIM_WAIT,
    DEFAULT_CONSUMER_TIMEOUT,
    DEFAULT_DELIVERY_LIMIT,
    broker_address,
    delay_bucket,
    delay_queue_name,
    delivery_limit_problem,
    exhausted_queue_name,
    redact_url,
    redelivery_horizon,
    split_hosts,
    url_options,
    url_problem,
)
from harness.urls import MASK, url_secrets

__all__ = [
    "BUCKETS_MS",
    "BUCKET_STRETCH",
    "DEFAULT_CONSUMER_TIMEOUT",
    "DEFAULT_DELIVERY_LIMIT",
    "BrokerUnavailable",
    "RabbitQueue",
    "delay_bucket",
    "delay_queue_name",
    "delivery_limit_problem",
    "describe_broker_error",
    "exhausted_queue_name",
    "redact_url",
    "redelivery_horizon",
    "url_options",
]

log = structlog.get_logger()

ATTEMPT_HEADER = "x-core-jobs-attempt"
LAST_ERROR_HEADER = "x-core-jobs-last-error"
TENANT_HEADER = "x-core-jobs-tenant-id"
CORRELATION_HEADER = "x-core-jobs-correlation-id"
REPLAY_OF_HEADER = "x-core-jobs-replay-of"
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
# On a released copy of a redelivered delivery: the copy is redelivered too (the broker's flag does not survive a copy).
REDELIVERED_HEADER = "x-core-jobs-redelivered"
# Headers the broker writes on a message's way (dead-lettering, redelivery): a republished copy drops them.
_BROKER_HEADERS = (
    "x-delivery-count",
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
)
# The largest attempt a delivery says (core.dead_letters.attempts is an integer); the smallest is 1.
MAX_ATTEMPT = 2**31 - 1
# The last error travels in a header (the copy's own record); the dead letter keeps the whole one.
MAX_HEADER_ERROR_CHARS = 1_000

RECONNECT_ATTEMPTS = 3
RECONNECT_BACKOFF_S = (0.0, 0.2, 1.0)
# A consumer is cancelled once its window is full (nothing in flight to come back counted): waited for this long at most,
# polling every STOP_POLL while the broker still reports messages ready to fill it; once it reports none, what it had
# already checked out to the consumer is taken in for STOP_SETTLE.
STOP_WAIT = timedelta(seconds=1)
STOP_POLL = timedelta(milliseconds=5)
STOP_SETTLE = timedelta(milliseconds=10)
# A nacked publish is sent again after these pauses (the last one repeated), for at most PUBLISH_RETRY_WINDOW in all.
PUBLISH_RETRY_WINDOW = timedelta(seconds=30)
PUBLISH_RETRY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)

_CONNECTION_ERRORS = (pika.exceptions.AMQPConnectionError, pika.exceptions.ConnectionWrongStateError)


class BrokerUnavailable(ConnectionError):
    """The broker could not be reached (after :data:`RECONNECT_ATTEMPTS` tries); names its ``host:port`` and why,
    never the password (``core-jobs`` reports it as one ``broker error`` line, exit 1)."""


@dataclass(eq=False)
class _Link:
    """One broker connection, its confirm-mode publishing channel and its consumers."""

    connection: BlockingConnection
    publisher: BlockingChannel
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    set_aside: list[BlockingChannel] = field(default_factory=list)  # cancelled consumers' channels, closed next claim
    declared: set[str] = field(default_factory=set)  # work queues whose topology this link declared
    buckets: dict[str, float] = field(default_factory=dict)  # delay queue → monotonic time of its last declare

    @property
    def alive(self) -> bool:
        return bool(self.connection.is_open and self.publisher.is_open)


@dataclass(eq=False)
class _Consumer:
    """A channel consuming one work queue and its ``.exhausted`` queue; deliveries wait in ``buffer``."""

    channel: BlockingChannel
    work_queue: str
    prefetch: int  # the work queue's: the claim's limit when it was created
    buffer: list[Delivery] = field(default_factory=list)
    claimed: list[Delivery] = field(default_factory=list)  # what the last claim returned of it

    def stop(self, link: _Link) -> bool:
        """Cancel both subscriptions once the work queue's window is full, or nothing is ready to fill it; False when
        :data:`STOP_WAIT` ran out first (cancelled all the same).

        A quorum queue counts every message it takes back unsettled as a delivery (``x-delivery-count``).
        A consumer cancelled while its window has room may have had messages checked out to it that it
        never receives — the broker takes them back, counted — and pika's cancel rejects, requeued and
        counted, what arrives before the Cancel-OK. Either way a job that never ran would use up an
        attempt at every such cancel (a suspect's claim cancels its consumer) and be dead-lettered unrun
        after a few crashes. With the window full (the claimed deliveries not yet settled, beside the
        :attr:`buffer`) nothing can be in flight, and everything pushed is in the buffer for the caller to
        release uncounted (copy + ack). When the queue reports nothing ready, what it had already checked
        out to this consumer is still taken in for :data:`STOP_SETTLE` (the broker's ready count drops
        before those deliveries arrive). What can still come back counted: a message checked out to it
        later than that, as the queue empties, and a delivery on its way to the ``.exhausted`` consumer
        (its attempt is past the limit already)."""
        deadline = time.monotonic() + STOP_WAIT.total_seconds()
        link.connection.process_data_events(time_limit=0)
        full = True
        while self._room() > 0:
            if time.monotonic() >= deadline:
                full = False
                break
            if not link.publisher.queue_declare(self.work_queue, passive=True).method.message_count:
                link.connection.process_data_events(time_limit=STOP_SETTLE.total_seconds())
                break
            link.connection.process_data_events(time_limit=STOP_POLL.total_seconds())
        link.connection.process_data_events(time_limit=0)  # nothing left undispatched for pika's cancel to reject
        self.channel.stop_consuming()
        return full

    def _room(self) -> int:
        """How many more deliveries of the work queue the broker may push to this consumer now."""
        held = (*self.claimed, *self.buffer)
        return self.prefetch - sum(1 for d in held if d.receipt.source == self.work_queue and not d.receipt.settled)


@dataclass(eq=False)
class _Receipt:
    """What settles a delivery: the channel that delivered it and its tag; the message, to republish it.

    ``settled`` once acked: a delivery is settled once, and a second ack, retry, dead letter or
    release of it changes nothing (a second ``basic.ack`` of a tag would close the channel, a
    second retry would publish a second copy)."""

    link: _Link
    channel: BlockingChannel
    tag: int
    source: str  # the broker queue it came from: the work queue or its .exhausted queue
    work_queue: str
    body: bytes
    properties: pika.BasicProperties
    offset: int  # what the queue it came from adds to the attempt: 0, or the delivery limit + 1 for .exhausted
    settled: bool = False

    @property
    def alive(self) -> bool:
        """Not settled yet, and its channel still open (closed: the broker requeued it, the lease is lost)."""
        return not self.settled and self.channel.is_open and self.link.connection.is_open


def _url_parameters(url: str) -> list[pika.URLParameters]:
    """pika's reading of ``url``, one per node of a multi-host URL (:func:`split_hosts`); QueueUrlError naming the
    problem (an option pika refuses: which one), the URL masked.

    pika's own messages quote what they could not read, which may be a piece of the password: they are masked
    (:func:`~harness.urls.url_secrets`), and the host part is checked first (:func:`url_problem`).
    """
    problem = url_problem(url)
    if problem is None:
        try:
            return [pika.URLParameters(one) for one in split_hosts(url)]
        except Exception as exc:
            problem = f"pika cannot read the queue URL{_refused_option(url)}: {type(exc).__name__}: {exc}"
            for secret in sorted(url_secrets(url), key=len, reverse=True):
                problem = problem.replace(secret, MASK)
    raise QueueUrlError(f"{problem}: {redact_url(url)}") from None


def _refused_option(url: str) -> str:
    """`` (its option name=…)``: the first of the URL's query options pika refuses on its own; empty when none does."""
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        try:
            pika.URLParameters("amqp://localhost/?" + urlencode({name: value}))
        except Exception:
            return f" (its option {name})"
    return ""


class RabbitQueue:
    """The :class:`~harness.queue.port.QueuePort` on RabbitMQ quorum queues; see the module docstring."""

    system = "rabbitmq"

    def __init__(
        self,
        url: str,
        conn: psycopg.Connection,
        *,
        worker: str = "",
        lease: timedelta = timedelta(seconds=30),
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
        prefix: str = "",
        consumer_timeout: timedelta = DEFAULT_CONSUMER_TIMEOUT,
        claim_wait: timedelta = DEFAULT_CLAIM_WAIT,
    ) -> None:
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        if isinstance(delivery_limit, bool) or not isinstance(delivery_limit, int) or delivery_limit < 1:
            raise ValueError(f"delivery_limit must be an integer of at least 1, got {delivery_limit!r}")
        if consumer_timeout <= timedelta(0):
            raise ValueError(f"consumer_timeout must be positive, got {consumer_timeout}")
        if claim_wait < timedelta(0):
            raise ValueError(f"claim_wait must not be negative, got {claim_wait}")
        self._url = url
        self.url = redact_url(url)
        self._parameters = _url_parameters(url)
        for parameters in self._parameters:
            parameters.client_properties = {"connection_name": f"core-jobs {worker}".strip()}
        self._next_node = 0  # where the next connection starts trying: the node after the last one connected to
        self.publishes_retried = 0  # publishes sent again: nacked (a quorum queue's leader lost) or never confirmed
        self.address = broker_address(url)
        self.conn = conn
        self.worker = worker
        self.lease = lease
        self.delivery_limit = delivery_limit
        self.prefix = prefix
        self.consumer_timeout = consumer_timeout
        self.claim_wait = claim_wait
        self._link: _Link | None = None
        self.delay_queues: set[str] = set()  # every delay bucket this port declared (what an operator may look at)
        self._connected = False  # once connected, a new connection is a reconnection (logged)

    @classmethod
    def redelivery_horizon(cls, url: str | None, policy: RetryPolicy) -> timedelta:
        """How much longer than ``policy``'s retry window a job may still be delivered (the TTL guard's horizon,
        harness/ttl_guard.py), from the URL's ``consumer_timeout`` and ``delivery_limit``."""
        from harness.queue import rabbitmq_topology as topology

        _pika_url, options = topology.url_options(url or "")
        return topology.redelivery_horizon(
            policy,
            consumer_timeout=options.get("consumer_timeout", topology.DEFAULT_CONSUMER_TIMEOUT),
            delivery_limit=options.get("delivery_limit", topology.DEFAULT_DELIVERY_LIMIT),
        )

    @classmethod
    def from_url(
        cls, url: str, conn: psycopg.Connection, *, worker: str = "", lease: timedelta = timedelta(seconds=30)
    ) -> RabbitQueue:
        """The adapter a ``CORE_JOBS_QUEUE_URL`` names. Options of ours in its query, pika's own (``heartbeat``,
        ``connection_attempts``…) passed on: ``delivery_limit`` (int), ``prefix`` (queue name prefix),
        ``consumer_timeout`` (ms, what the broker is configured with), ``claim_wait`` (ms)."""
        pika_url, options = url_options(url)
        return cls(pika_url, conn, worker=worker, lease=lease, **options)

    @classmethod
    def check_url(cls, url: str) -> None:
        """QueueUrlError when :meth:`from_url` would refuse ``url`` (an option of ours or pika's, its host part), before
        any connection (:func:`harness.queue.adapters.adapter_class` calls it)."""
        _url_parameters(url_options(url)[0])

    def __repr__(self) -> str:  # the URL masked: self.url
        return f"RabbitQueue({self.url!r}, worker={self.worker!r}, delivery_limit={self.delivery_limit})"

    # -- publishing ----------------------------------------------------------------------------------------------

    def publish(self, queue: str, envelope: Envelope, *, delay: timedelta = timedelta(0)) -> UUID:
        """Publish ``envelope`` on ``queue``, deliverable after ``delay`` (rounded up to a bucket); return its job id.

        Confirmed: it returns once the broker has the message. A payload jsonb cannot store raises
        :class:`~harness.queue.port.InvalidPayload` before anything is sent.
        """
        self.publish_many([(queue, envelope)], delay=delay)
        return envelope.job_id

    def publish_many(self, messages: Sequence[tuple[str, Envelope]], *, delay: timedelta = timedelta(0)) -> None:
        """Publish every ``(queue, envelope)``, each confirmed; every payload is checked before the first is sent.

        Not atomic on the broker: a connection lost midway leaves the first ones published (the
        adapter reconnects once and publishes the rest again; a copy sent twice is absorbed by the fence).
        An error raised after some were confirmed says how many: its ``published`` attribute (the
        first ``published`` of ``messages`` are on the broker), which the relay acks in its outbox.
        """
        for queue, envelope in messages:
            check_envelope(queue, envelope)
        if not messages:
            return
        bucket = delay_bucket(delay)
        with publish_span(messages, system=self.system) as traced:
            prepared = [(queue, _body(envelope), _properties(envelope, attempt_base=1)) for queue, envelope in traced]
            sent = 0
            unconfirmed = False  # a publish whose connection was lost before its confirm: sent again, counted

            def send(link: _Link) -> None:
                nonlocal sent, unconfirmed
                for queue, body, properties in prepared[sent:]:
                    target = self._target(link, self._name(queue), bucket)
                    if unconfirmed:
                        self._retried(target, properties, reason="connection lost before the confirm")
                    unconfirmed = True
                    self._confirmed_publish(link, target, body, properties)
                    unconfirmed = False
                    sent += 1

            try:
                self._with_link(send)
            except Exception as exc:
                exc.published = sent  # type: ignore[attr-defined]  # the first `sent` are on the broker (harness/queue/port.py)
                raise

    # -- claiming ------------------------------------------------------------------------------------------------

    def claim(self, queue: str, limit: int) -> list[Delivery]:
        """Up to ``limit`` deliveries of ``queue`` (and of its ``.exhausted`` queue), waiting at most ``claim_wait``."""
        if limit < 1:
            return []
        deliveries: list[Delivery] = self._with_link(lambda link: self._claim(link, queue, limit))
        return deliveries

    def _claim(self, link: _Link, queue: str, limit: int) -> list[Delivery]:
        while link.set_aside:  # the last claim's deliveries on them are settled by now
            channel = link.set_aside.pop()
            if channel.is_open:
                channel.close()
        consumer = self._consumer(link, queue, limit)
        link.connection.process_data_events(time_limit=0)
        if len(consumer.buffer) < limit and self.claim_wait > timedelta(0):
            ready = self._ready(link, self._name(queue))
            wanted = min(limit, len(consumer.buffer) + ready)
            deadline = time.monotonic() + self.claim_wait.total_seconds()
            while len(consumer.buffer) < wanted and (left := deadline - time.monotonic()) > 0:
                link.connection.process_data_events(time_limit=left)
        if not consumer.channel.is_open:  # closed by the broker meanwhile (consumer timeout): requeued
            link.consumers.pop(queue, None)
            return []
        taken, consumer.buffer[:] = _at_most_one_redelivered(consumer.buffer, limit)
        consumer.claimed = taken
        if any(delivery.redelivered for delivery in taken):
            self._set_aside(link, queue, consumer)
        return taken

    def _cancel(self, link: _Link, queue: str, consumer: _Consumer) -> None:
        """Cancel ``consumer`` (:meth:`_Consumer.stop`) and give back, uncounted, what it was pushed beyond the claims;
        a cancel with room in its window after :data:`STOP_WAIT` is logged: what was on its way may come back counted
        (docs/rabbitmq.md, "Only a death counts a delivery")."""
        if not consumer.stop(link):
            log.warning(
                "harness.rabbitmq.cancelled_with_room",
                url=self.url,
                worker=self.worker,
                queue=queue,
                waited_s=STOP_WAIT.total_seconds(),
            )
        self.release(consumer.buffer)
        consumer.buffer.clear()

    def _set_aside(self, link: _Link, queue: str, consumer: _Consumer) -> None:
        """Nothing else of ``queue`` at stake while a redelivered delivery runs: if it kills this worker, only it
        returns counted. The consumer is cancelled (nothing more is pushed), what it buffered released (a
        redelivered one stays so), and its channel kept open for the claimed deliveries until the next claim."""
        self._cancel(link, queue, consumer)
        link.consumers.pop(queue, None)
        link.set_aside.append(consumer.channel)

    def _consumer(self, link: _Link, queue: str, limit: int) -> _Consumer:
        consumer = link.consumers.get(queue)
        if consumer is not None and consumer.channel.is_open:
            return consumer
        name = self._name(queue)
        self._declare(link, name)
        channel = link.connection.channel()
        consumer = _Consumer(channel, work_queue=name, prefetch=limit)

        def deliver(source: str, offset: int) -> Any:
            def on_message(
                channel: BlockingChannel, method: Any, properties: pika.BasicProperties, body: bytes
            ) -> None:
                consumer.buffer.append(self._delivery(link, channel, queue, source, offset, method, properties, body))

            return on_message

        channel.basic_qos(prefetch_count=limit)  # the batch: at most `limit` unacked deliveries of the work queue
        channel.basic_consume(name, deliver(name, 0))
        channel.basic_qos(prefetch_count=1)  # and one at a time of what the delivery limit removed
        channel.basic_consume(exhausted_queue_name(name), deliver(exhausted_queue_name(name), self.delivery_limit + 1))
        link.consumers[queue] = consumer
        return consumer

    def _delivery(
        self,
        link: _Link,
        channel: BlockingChannel,
        queue: str,
        source: str,
        offset: int,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> Delivery:
        headers = properties.headers or {}
        base = _int_header(headers, ATTEMPT_HEADER, 1)
        if not 1 <= base <= self.delivery_limit:  # not a base the harness writes (docs/rabbitmq.md): a fresh job's
            base = 1
        counted = _int_header(headers, "x-delivery-count", 0)
        receipt = _Receipt(
            link=link,
            channel=channel,
            tag=method.delivery_tag,
            source=source,
            work_queue=self._name(queue),
            body=body,
            properties=properties,
            offset=offset,
        )
        return Delivery(
            queue=queue,
            envelope=_envelope(queue, properties, headers, body),
            # Another producer's header may say anything: an attempt the retry policy and the database can count.
            attempt=min(base + offset + counted, MAX_ATTEMPT),
            receipt=receipt,
            redelivered=bool(method.redelivered) or offset > 0 or bool(headers.get(REDELIVERED_HEADER)),
        )

    def figures(self, queue: str) -> tuple[int, float]:
        """(messages ready in ``queue`` and its ``.exhausted`` queue, 0.0): RabbitMQ does not tell their age."""

        def read(link: _Link) -> int:
            name = self._name(queue)
            self._declare(link, name)
            return self._ready(link, name)

        return self._with_link(read), 0.0

    @staticmethod
    def _ready(link: _Link, name: str) -> int:
        """Messages ready in the work queue ``name`` and its ``.exhausted`` queue (both declared)."""
        return sum(
            link.publisher.queue_declare(q, passive=True).method.message_count
            for q in (name, exhausted_queue_name(name))
        )

    # -- settling ------------------------------------------------------------------------------------------------

    def ack(self, deliveries: Sequence[Delivery]) -> int:
        """Ack each delivery on the channel that delivered it; return how many were (a closed channel: lease lost)."""
        return sum(1 for delivery in deliveries if _ack(delivery.receipt))

    def retry(self, delivery: Delivery, delay: timedelta, error: str) -> bool:
        """Publish the next attempt into the delay bucket (confirmed), then ack this one; False if the lease was lost."""
        receipt: _Receipt = delivery.receipt
        if not receipt.alive:
            return False
        headers = {LAST_ERROR_HEADER: error[:MAX_HEADER_ERROR_CHARS]}
        target = self._target(receipt.link, receipt.work_queue, delay_bucket(delay))
        if not self._republish(receipt, target, attempt_base=delivery.attempt + 1, extra=headers):
            return False
        return _ack(receipt)

    def dead_letter(self, delivery: Delivery, letter: DeadLetter) -> bool:
        """Write the dead letter on ``conn`` and commit, then ack; False (nothing written) if the lease was lost."""
        receipt: _Receipt = delivery.receipt
        if not receipt.alive:
            return False
        since = replication.uncertain_commits(self.conn)
        with self.conn.transaction():
            write_dead_letter(self.conn, letter)  # or finds the job's failure already a pending letter: settled too
        replication.after_commit(self.conn, since)  # uncertain, or behind the barrier unreplicated: no ack
        return _ack(receipt)  # lost: the broker redelivers it, and the harness finds the letter already written

    def release(self, deliveries: Sequence[Delivery]) -> int:
        """Give deliveries back uncounted: a copy with the same attempt where each came from, then the ack."""
        released = 0
        for delivery in deliveries:
            receipt: _Receipt = delivery.receipt
            if receipt.alive and self._republish(
                receipt,
                receipt.source,
                attempt_base=delivery.attempt - receipt.offset,
                extra={REDELIVERED_HEADER: 1} if delivery.redelivered else None,
            ):
                released += _ack(receipt)
        return released

    def close(self) -> None:
        """Give back what the broker pushed but no claim returned, then close the connection. Idempotent."""
        link, self._link = self._link, None
        if link is None:
            return
        try:
            if link.alive:
                for queue, consumer in link.consumers.items():
                    if consumer.channel.is_open:
                        self._cancel(link, queue, consumer)
        except Exception as exc:  # the broker requeues whatever was left, counted
            log.warning("harness.rabbitmq.close_failed", url=self.url, error=describe_error(exc))
        finally:
            self._drop(link)  # closed whatever happened before: a connection left open would hold its deliveries

    # -- the connection ------------------------------------------------------------------------------------------

    def _with_link(self, operation: Any) -> Any:
        """``operation(link)`` on a live connection: reconnecting, at most RECONNECT_ATTEMPTS times, when it is lost."""
        last: BaseException | None = None
        for attempt, backoff in enumerate(RECONNECT_BACKOFF_S[:RECONNECT_ATTEMPTS], start=1):
            link = self._link
            if link is None or not link.alive:
                if link is not None:  # a channel the broker closed: the connection goes too, so the broker
                    self._drop(link)  # requeues its deliveries now instead of holding them for a forgotten one
                if backoff:
                    time.sleep(backoff)
                try:
                    link = self._connect(attempt=attempt)
                except (
                    *_CONNECTION_ERRORS,
                    OSError,
                ) as exc:  # OSError: the host's name does not resolve (pika lets it through)
                    last = exc
                    continue
            try:
                return operation(link)
            except _CONNECTION_ERRORS as exc:
                last = exc
                self._drop(link)
            except pika.exceptions.ChannelWrongStateError as exc:  # a channel closed under us, its connection too
                if link.connection.is_open:
                    raise
                last = exc
                self._drop(link)
        raise BrokerUnavailable(
            f"RabbitMQ at {self.address} unreachable after {RECONNECT_ATTEMPTS} attempts: {describe_broker_error(last)}"
            if last is not None
            else f"RabbitMQ at {self.address} unreachable"
        ) from None

    def _connect(self, *, attempt: int) -> _Link:
        """A new connection: pika tries the nodes in turn, from the one after the node last connected to (a
        reconnection goes to the next node of a cluster, not back to the one that was just lost)."""
        start = self._next_node % len(self._parameters)
        connection = pika.BlockingConnection(self._parameters[start:] + self._parameters[:start])
        node = _connected_node(connection, self._parameters, start)
        self._next_node = node + 1
        publisher = connection.channel()
        publisher.confirm_delivery()
        self._link = _Link(connection, publisher)
        if self._connected:
            log.info(
                "harness.rabbitmq.reconnected",
                url=self.url,
                worker=self.worker,
                attempt=attempt,
                node=broker_address(split_hosts(self._url)[node]),
            )
        self._connected = True
        return self._link

    def _drop(self, link: _Link) -> None:
        """Forget a dead link: its deliveries settle as lease lost (the broker requeued them)."""
        if self._link is link:
            self._link = None
        with contextlib.suppress(Exception):  # already gone
            link.connection.close()

    def _name(self, queue: str) -> str:
        return f"{self.prefix}{queue}"

    def _declare(self, link: _Link, name: str) -> None:
        """The work queue ``name`` and its ``.exhausted`` queue, once per connection (idempotent on the broker)."""
        if name in link.declared:
            return
        exhausted = exhausted_queue_name(name)
        link.publisher.queue_declare(exhausted, durable=True, arguments={"x-queue-type": "quorum"})
        link.publisher.queue_declare(name, durable=True, arguments=self.work_arguments(name))
        link.declared.add(name)

    def work_arguments(self, name: str) -> dict[str, Any]:
        """The arguments of work queue ``name`` (docs/rabbitmq.md): a redeclare with others is refused by the broker."""
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": exhausted_queue_name(name),
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # what at-least-once dead-lettering requires
        }

    @staticmethod
    def bucket_arguments(work_queue: str, bucket_ms: int) -> dict[str, Any]:
        """The arguments of a delay bucket: hold ``bucket_ms``, then dead-letter back to ``work_queue``."""
        return {
            "x-queue-type": "quorum",
            "x-message-ttl": bucket_ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work_queue,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-expires": bucket_ms + int(BUCKET_IDLE / timedelta(milliseconds=1)),
        }

    def _target(self, link: _Link, work_queue: str, bucket_ms: int) -> str:
        """The broker queue to publish into for ``work_queue`` after ``bucket_ms`` (declared as needed)."""
        self._declare(link, work_queue)
        if not bucket_ms:
            return work_queue
        name = delay_queue_name(work_queue, bucket_ms)
        now = time.monotonic()
        if now - link.buckets.get(name, -math.inf) > BUCKET_REDECLARE.total_seconds():
            link.publisher.queue_declare(name, durable=True, arguments=self.bucket_arguments(work_queue, bucket_ms))
            link.buckets[name] = now
            self.delay_queues.add(name)
        return name

    def _republish(
        self, receipt: _Receipt, target: str, *, attempt_base: int, extra: dict[str, Any] | None = None
    ) -> bool:
        """Publish a copy of the delivered message into ``target`` (confirmed) with a new attempt base.

        A base past the delivery limit is written as the limit: one above it reads as a first attempt
        (:meth:`_delivery`), and the limit is above any ``max_attempts`` (``delivery_limit_problem``), so the
        copy is still past the budget."""
        headers = {
            k: v
            for k, v in (receipt.properties.headers or {}).items()
            if k not in _BROKER_HEADERS and k != REDELIVERED_HEADER
        }
        headers[ATTEMPT_HEADER] = min(attempt_base, self.delivery_limit)
        headers.update(extra or {})
        properties = pika.BasicProperties(
            content_type=receipt.properties.content_type,
            delivery_mode=pika.DeliveryMode.Persistent,
            message_id=receipt.properties.message_id,
            correlation_id=receipt.properties.correlation_id,
            headers=headers,
        )
        try:
            self._confirmed_publish(receipt.link, target, receipt.body, properties)
        except (*_CONNECTION_ERRORS, pika.exceptions.ChannelWrongStateError, pika.exceptions.ChannelClosed):
            return False  # the connection is gone: the broker requeued the delivery, nothing was copied
        return True

    def _confirmed_publish(self, link: _Link, queue: str, body: bytes, properties: pika.BasicProperties) -> None:
        """Publish on the link's confirm channel (default exchange, mandatory) and wait for the broker's confirm.

        A nack — the quorum queue could not take it: its leader died — is retried on the new leader, the same
        message (its ``message_id``: a copy the broker did keep is absorbed by the fence), with a backoff, for at
        most :data:`PUBLISH_RETRY_WINDOW` and half the port's lease; then :class:`pika.exceptions.NackError` is raised. Each retry goes on a
        **new** channel: a channel that published while the queue had no leader keeps being nacked after a new
        one is elected (RabbitMQ 3.10), a new channel reaches the new leader. An unroutable message raises at once.
        """
        # Within half the lease too: what is being published (a relay's outbox rows, a delivery's retry copy) is held
        # by a lease, and a confirm that came later than it would be acted on too late (the rows published again).
        window = min(PUBLISH_RETRY_WINDOW, self.lease / 2)
        deadline = time.monotonic() + window.total_seconds()
        for attempt in itertools.count():
            backoff = PUBLISH_RETRY_BACKOFF_S[min(attempt, len(PUBLISH_RETRY_BACKOFF_S) - 1)]
            try:
                link.publisher.basic_publish("", queue, body, properties, mandatory=True)
                return
            except pika.exceptions.NackError:
                if time.monotonic() + backoff > deadline:
                    raise
                self._retried(queue, properties, reason="nacked")
                time.sleep(backoff)
                stale, link.publisher = link.publisher, link.connection.channel()
                link.publisher.confirm_delivery()
                with contextlib.suppress(Exception):
                    stale.close()
        raise AssertionError("unreachable")

    def _retried(self, queue: str, properties: pika.BasicProperties, *, reason: str) -> None:
        self.publishes_retried += 1
        log.warning(
            "harness.rabbitmq.publish_retried",
            url=self.url,
            worker=self.worker,
            queue=queue,
            job_id=_text(properties.message_id),
            reason=reason,
            retried=self.publishes_retried,
        )


def _at_most_one_redelivered(buffer: list[Delivery], limit: int) -> tuple[list[Delivery], list[Delivery]]:
    """(the claim, what stays buffered): up to ``limit`` deliveries in order, at most one of them redelivered
    (harness/queue/port.py: a job that killed its worker runs alone, its batch-mates not at stake)."""
    taken: list[Delivery] = []
    kept: list[Delivery] = []
    redelivered = False
    for delivery in buffer:
        if len(taken) < limit and not (delivery.redelivered and redelivered):
            taken.append(delivery)
            redelivered |= delivery.redelivered
        else:
            kept.append(delivery)
    return taken, kept


def describe_broker_error(error: BaseException) -> str:
    """A broker error as text (``Type: message``); pika's connection errors say nothing in ``str()``: their
    arguments tell the cause (``ConnectionRefusedError(111, 'Connection refused')``)."""
    if str(error).strip() or not error.args:
        return describe_error(error)
    # e.g. AMQPConnectionError(AMQPConnectorSocketConnectError(ConnectionRefusedError(111, 'Connection refused')))
    return f"{type(error).__name__}: {'; '.join(repr(arg) for arg in error.args)}"[:MAX_HEADER_ERROR_CHARS]


def _ack(receipt: _Receipt) -> bool:
    if not receipt.alive:
        return False
    try:
        receipt.channel.basic_ack(receipt.tag)
    except (*_CONNECTION_ERRORS, pika.exceptions.ChannelWrongStateError, pika.exceptions.ChannelClosed):
        return False
    receipt.settled = True
    return True


def _connected_node(connection: BlockingConnection, parameters: list[pika.URLParameters], start: int) -> int:
    """The index in ``parameters`` of the node ``connection`` reached (pika keeps the parameters it used)."""
    used = connection._impl.params  # pika's Connection.params: the ConnectionParameters it connected with
    for offset in range(len(parameters)):
        index = (start + offset) % len(parameters)
        if parameters[index] is used or (parameters[index].host, parameters[index].port) == (used.host, used.port):
            return index
    return start


def _body(envelope: Envelope) -> bytes:
    return json.dumps(envelope.payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _properties(envelope: Envelope, *, attempt_base: int) -> pika.BasicProperties:
    headers: dict[str, Any] = {ATTEMPT_HEADER: attempt_base, TENANT_HEADER: str(envelope.tenant_id)}
    for name, value in (
        (CORRELATION_HEADER, envelope.correlation_id),
        (REPLAY_OF_HEADER, envelope.replay_of),
        (TRACEPARENT_HEADER, envelope.traceparent),
        (TRACESTATE_HEADER, envelope.tracestate),
    ):
        if value is not None:
            headers[name] = value
    correlation = envelope.correlation_id
    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=str(envelope.job_id),
        # The AMQP property is a short string (255 bytes): a longer id travels in the header alone.
        correlation_id=correlation if correlation is not None and len(correlation.encode()) <= 255 else None,
        headers=headers,
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int_header(headers: dict[str, Any], name: str, default: int) -> int:
    value = headers.get(name)
    try:
        return int(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError):
        return default


def _envelope(queue: str, properties: pika.BasicProperties, headers: dict[str, Any], body: bytes) -> Envelope:
    """The envelope a message carries; what cannot be read makes its payload an UndecodablePayload (poison).

    A trace context or correlation id the database would refuse is dropped (harness/queue/fields.py), logged
    ``harness.rabbitmq.header_dropped`` naming the header and why: the job goes on without it.
    """
    problems: list[str] = []
    if properties.message_id is None:  # no identity: each delivery its own poison letter, never merged with another
        problems.append("no message_id: a job needs its id (a UUID) to be run once")
        job_id = uuid4()
    else:
        try:
            job_id = UUID(_text(properties.message_id) or "")
        except ValueError:
            problems.append(f"message_id {properties.message_id!r} is not a job id (a UUID)")
            job_id = uuid5(NAMESPACE_URL, f"rabbitmq-message:{properties.message_id!r}:{body!r}")
    tenant_text = _text(headers.get(TENANT_HEADER))
    try:
        tenant_id = UUID(tenant_text) if tenant_text else NO_TENANT
    except ValueError:
        problems.append(f"{TENANT_HEADER} {tenant_text!r} is not a UUID")
        tenant_id = NO_TENANT
    replay_of = headers.get(REPLAY_OF_HEADER)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        payload: Any = _undecodable(body, f"not UTF-8: {exc}")
    else:
        payload = decode_payload(text)
        if isinstance(payload, UndecodablePayload):
            payload = _undecodable(body, payload.reason)
        else:
            try:
                check_payload(payload)
            except InvalidPayload as exc:
                payload = _undecodable(body, str(exc))
    if problems and not isinstance(payload, UndecodablePayload):
        payload = _undecodable(body, "; ".join(problems))
    sent_parent, sent_state = _text(headers.get(TRACEPARENT_HEADER)), _text(headers.get(TRACESTATE_HEADER))
    traceparent, tracestate = received_trace_context(sent_parent, sent_state)
    if (traceparent, tracestate) != (sent_parent, sent_state):
        log.warning(
            "harness.rabbitmq.header_dropped",
            queue=queue,
            job_id=str(job_id),
            header=TRACEPARENT_HEADER if traceparent is None and sent_parent is not None else TRACESTATE_HEADER,
            problem=trace_context_problem(sent_parent, sent_state),
        )
    sent_correlation = _text(headers.get(CORRELATION_HEADER)) or _text(properties.correlation_id)
    correlation_id = received_correlation_id(sent_correlation)
    if sent_correlation is not None and correlation_id != sent_correlation:
        log.warning(
            "harness.rabbitmq.header_dropped",
            queue=queue,
            job_id=str(job_id),
            header=CORRELATION_HEADER,
            problem=correlation_id_problem(sent_correlation),
        )
    return Envelope(
        job_id=job_id,
        payload=payload,
        tenant_id=tenant_id,
        correlation_id=correlation_id,
        replay_of=replay_of if isinstance(replay_of, int) and not isinstance(replay_of, bool) else None,
        traceparent=traceparent,
        tracestate=tracestate,
    )


def _undecodable(body: bytes, reason: str) -> UndecodablePayload:
    """The body kept as a JSON string jsonb can store (NUL written ``\\x00``), with why it cannot be read."""
    text = body.decode("utf-8", errors="backslashreplace").replace("\x00", "\\x00")
    return UndecodablePayload(json.dumps(text), reason)
