"""Traces from enqueue to replay (harness/tracing.py, maintenance/runtime/tracing.py, migration 0017).

Spans are read with the OpenTelemetry SDK's in-memory exporter (the ``spans`` fixture,
tests/support/tracing_support.py), messages and dead letters from the real PostgreSQL, the API over HTTP.
"""

from __future__ import annotations

import sys
import threading
import uuid

import psycopg
import pytest
from opentelemetry.trace import SpanKind, StatusCode
from support.factories import QUEUE, TENANT, publish
from support.harness_support import run_worker
from support.ledger_support import PAYLOAD
from support.tracing_support import span_id, trace_id

from harness.consumer.consumer import Consumer
from harness.dead_letters import DeadLetter, write_dead_letter
from harness.errors import PermanentError
from harness.examples.points import CreditPoints, make_consumer
from harness.queue.fields import InvalidEnvelope
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from maintenance.errors import ConfigError
from maintenance.operations.dead_letters import replay
from maintenance.runtime.tracing import configure_tracing, exporter_asked
from maintenance.service.runner import run_jobs
from maintenance.service.telemetry import Telemetry

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def refusing() -> Consumer[CreditPoints]:
    """The points consumer's name and queue, its handler refusing every job (a permanent error: dead-lettered at once)."""

    def refuse(conn, payload, ctx):
        raise PermanentError("member closed")

    return Consumer(name="points.credit", queue=QUEUE, payload_schema=CreditPoints, handler=refuse)


def message_context(conn: psycopg.Connection, job_id) -> tuple[str | None, str | None]:
    return conn.execute(
        "SELECT traceparent, tracestate FROM core.queue_messages WHERE job_id = %s", (job_id,)
    ).fetchone()


def test_a_delivery_is_a_child_of_the_publish_span_its_message_carries(spans, database_url, conn):
    """publish stores its PRODUCER span's traceparent on the message; the delivery's CONSUMER span is its child, same trace."""
    job_id = publish(conn, {"member_id": "m-1", "points": 5})
    sent = spans.one(f"{QUEUE} publish")
    assert sent.kind is SpanKind.PRODUCER
    traceparent, tracestate = message_context(conn, job_id)
    assert (traceparent.rsplit("-", 1)[0], tracestate) == (f"00-{trace_id(sent)}-{span_id(sent)}", None)

    assert run_worker(database_url).processed == 1
    handled = spans.one(f"{QUEUE} process")
    assert handled.kind is SpanKind.CONSUMER
    assert trace_id(handled) == trace_id(sent) and handled.parent.span_id == sent.context.span_id
    assert handled.attributes["core_jobs.job_id"] == str(job_id) and handled.attributes["core_jobs.outcome"] == "acked"


def test_a_replay_joins_the_trace_of_the_job_it_replays(spans, database_url, conn):
    """The dead letter keeps the message's traceparent; its replay republishes it, so the second attempt is in the first's trace."""
    job_id = publish(conn, {"member_id": "m-1", "points": 5})
    published = message_context(conn, job_id)
    assert run_worker(database_url, consumer=refusing()).dead_lettered == 1
    first = spans.one(f"{QUEUE} process")
    assert first.status.status_code is StatusCode.ERROR
    letter_id, kept = conn.execute(
        "SELECT id, (traceparent, tracestate)::text FROM core.dead_letters WHERE job_id = %s", (job_id,)
    ).fetchone()
    assert kept == f"({published[0]},)"

    spans.clear()
    replay(conn, [letter_id], operator="ops:ana")
    assert message_context(conn, job_id) == published  # unchanged: no span of the replay's own
    assert spans.named(f"{QUEUE} publish") == []
    assert run_worker(database_url, consumer=make_consumer()).processed == 1
    second = spans.one(f"{QUEUE} process")
    assert trace_id(second) == trace_id(first) and second.parent.span_id == first.parent.span_id
    assert second.attributes["core_jobs.replay_of"] == letter_id


def test_a_batch_publish_gives_each_new_message_its_span_and_each_replay_its_own_context(spans, conn):
    """publish_many has one PRODUCER span; every new message carries its context, a replay or a given context its own."""
    fresh = [Envelope(job_id=uuid.uuid4(), payload={"n": n}, tenant_id=TENANT) for n in range(3)]
    replayed = Envelope(job_id=uuid.uuid4(), payload={}, replay_of=1, traceparent=TRACEPARENT, tracestate="v=1")
    unlinked = Envelope(job_id=uuid.uuid4(), payload={}, replay_of=2)
    PgQueue(conn).publish_many(
        [(QUEUE, fresh[0]), (QUEUE, replayed), (QUEUE, fresh[1]), (QUEUE, unlinked), (QUEUE, fresh[2])]
    )
    sent = spans.one(f"{QUEUE} publish")
    assert sent.kind is SpanKind.PRODUCER and sent.attributes["messaging.batch.message_count"] == 5
    for envelope in fresh:
        traceparent, tracestate = message_context(conn, envelope.job_id)
        assert (traceparent.rsplit("-", 1)[0], tracestate) == (f"00-{trace_id(sent)}-{span_id(sent)}", None)
    assert message_context(conn, replayed.job_id) == (TRACEPARENT, "v=1")
    assert message_context(conn, unlinked.job_id) == (None, None)


def test_without_tracing_a_message_carries_no_trace_context(database_url, conn):
    """With no SDK provider (the default), publish stores no traceparent and the delivery still runs."""
    job_id = publish(conn, {"member_id": "m-1", "points": 5})
    assert message_context(conn, job_id) == (None, None)
    assert run_worker(database_url).processed == 1


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    ],
)
@pytest.mark.parametrize("table", ["queue_messages", "dead_letters"])
def test_refuses_a_traceparent_that_is_not_w3c(conn, table, traceparent):
    """Neither a message nor a dead letter stores a traceparent outside the W3C version-00 format."""
    columns = "job_id, queue, payload, traceparent" + (
        ", attempts, last_error" if table == "dead_letters" else ", tenant_id"
    )
    values = "gen_random_uuid(), 'q', '{}', %s" + (", 1, 'e'" if table == "dead_letters" else f", '{TENANT}'")
    with pytest.raises(psycopg.errors.CheckViolation, match="traceparent_w3c"):
        conn.execute(f"INSERT INTO core.{table} ({columns}) VALUES ({values})", (traceparent,))


def test_refuses_a_tracestate_without_its_traceparent(conn):
    """A tracestate alone is meaningless: the database refuses it, and publish refuses it first, naming the field."""
    with pytest.raises(psycopg.errors.CheckViolation, match="tracestate_with_parent"):
        conn.execute(
            "INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload, tracestate)"
            " VALUES (%s, %s, %s, '{}', 'vendor=1')",
            (QUEUE, TENANT, TENANT),
        )
    with pytest.raises(InvalidEnvelope, match="tracestate"):
        PgQueue(conn).publish(QUEUE, Envelope(job_id=TENANT, payload={}, tenant_id=TENANT, tracestate="vendor=1"))


def test_the_api_role_replays_a_letter_with_its_trace_context(as_api_role, conn):
    """The API role's replay carries the letter's traceparent and tracestate, which the publish guard accepts."""
    letter = write_dead_letter(
        conn,
        DeadLetter(
            job_id=uuid.uuid4(),
            queue=QUEUE,
            consumer="points.credit",
            payload={"points": 1},
            attempts=1,
            last_error="e",
            traceparent=TRACEPARENT,
            tracestate="v=1",
        ),
    )
    with as_api_role.transaction():
        replay(as_api_role, [letter], operator="ops:ana")
    assert conn.execute("SELECT traceparent, tracestate FROM core.queue_messages").fetchall() == [(TRACEPARENT, "v=1")]


def test_a_durable_delivery_has_a_span_per_action(spans, database_url, conn, ledger_consumer):
    """Each action call of a durable consumer is an ``action <name>`` span, a child of the delivery's span."""
    publish(conn, PAYLOAD, queue=ledger_consumer.queue)
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    delivery = spans.one(f"{ledger_consumer.queue} process")
    actions = [s for s in spans.get_finished_spans() if s.name.startswith("action ")]
    assert [s.name for s in actions] == [f"action {a.name}" for a in ledger_consumer.actions]
    assert all(s.parent.span_id == delivery.context.span_id for s in actions)
    assert actions[0].attributes["core_jobs.action"] == ledger_consumer.actions[0].name


class Done:
    ok = True

    def fields(self) -> dict[str, int]:
        return {"num_done": 1}


class LogsAJob:
    def run_once(self, now):
        return Done()


def test_a_job_run_is_a_span_and_its_events_carry_its_trace_id(spans, db, logs):
    """run_jobs opens ``job <name>`` per run; its start and stop events carry that span's trace_id and span_id."""
    from support.jobs import spec

    run_jobs([(spec("traced"), LogsAJob())], db, Telemetry(), stop=threading.Event())
    run = spans.one("job traced")
    events = logs.by_name()
    for name in ("test.traced.start", "test.traced.stop"):
        assert (events[name]["trace_id"], events[name]["span_id"]) == (trace_id(run), span_id(run))


def test_log_events_outside_a_span_carry_no_trace_id(db, logs):
    """Without a span (tracing off) an event has no trace_id field at all."""
    from support.jobs import spec

    run_jobs([(spec("plain"), LogsAJob())], db, Telemetry(), stop=threading.Event())
    assert "trace_id" not in logs.by_name()["test.plain.start"]


def test_an_api_request_is_a_span_joining_the_callers_trace(spans, api):
    """A request with a traceparent header is a SERVER span named after its route, in the caller's trace."""
    response = api.get("/v1/core/dead-letters", headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    served = spans.one("GET /v1/core/dead-letters")
    assert served.kind is SpanKind.SERVER
    assert trace_id(served) == TRACEPARENT.split("-")[1]
    assert format(served.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    assert served.attributes["http.response.status_code"] == 200


@pytest.mark.pure
@pytest.mark.parametrize(
    ("env", "exporter"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_tracing_is_on_only_when_the_environment_asks(env, exporter):
    """Off by default; on with OTEL_TRACES_EXPORTER or an OTLP endpoint; off with none or OTEL_SDK_DISABLED."""
    assert exporter_asked(env)[0] == exporter


@pytest.mark.pure
def test_refuses_an_unknown_exporter():
    """OTEL_TRACES_EXPORTER=jaeger (not supported) is a configuration error naming the variable."""
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='jaeger'"):
        configure_tracing({"OTEL_TRACES_EXPORTER": "jaeger"})


@pytest.mark.pure
def test_refuses_traces_asked_for_without_the_sdk(monkeypatch):
    """Asked for without the SDK installed, it is a configuration error naming the core-jobs[otel] extra."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # what an install without the extra has
    with pytest.raises(ConfigError, match=r"OTEL_EXPORTER_OTLP_ENDPOINT is set.*core-jobs\[otel\]"):
        configure_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})


def test_a_failed_deliverys_span_status_masks_credentials_as_the_log_does(spans, database_url, conn, logs):
    """A handler error quoting a URL password reaches the delivery span's status with the password masked, as in its log event."""

    def leak(conn, payload, ctx):
        raise RuntimeError("refused at postgresql://app:pw-9876@db/core")

    consumer = Consumer(name="points.credit", queue=QUEUE, payload_schema=CreditPoints, handler=leak)
    publish(conn, {"member_id": "m-1", "points": 5}, queue=QUEUE)
    run_worker(database_url, consumer=consumer)

    status = spans.one(f"{QUEUE} process").status
    assert status.status_code is StatusCode.ERROR
    assert status.description == "RuntimeError: refused at postgresql://app:***@db/core"
    assert status.description == logs.by_name()["harness.job.retry_scheduled"]["error"]


@pytest.mark.pure
def test_an_exception_escaping_a_harness_span_is_recorded_masked(spans):
    """An exception leaving a harness span sets its status and exception event without the password it quotes."""
    from harness import tracing

    with pytest.raises(RuntimeError), tracing.span("leaky"):
        raise RuntimeError("refused at postgresql://app:pw-9876@db/core")

    leaky = spans.one("leaky")
    texts = [leaky.status.description or ""] + [str(v) for e in leaky.events for v in e.attributes.values()]
    assert leaky.status.status_code is StatusCode.ERROR
    assert not [t for t in texts if "pw-9876" in t]


def test_every_exported_span_is_masked_whoever_made_it(monkeypatch):
    """A span made outside our code (a library's, FastAPI's) that records an exception with a database password leaves the exporter masked: status, attributes and the exception event."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    from maintenance.runtime.logs import configure_logging
    from maintenance.runtime.tracing import redacting

    configure_logging(fmt="json", level="INFO", secrets=())
    inner = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(redacting(inner)))
    leak = "postgresql://app:pw-9876@db/core"
    with provider.get_tracer("a.library").start_as_current_span("GET /x") as span:
        span.set_attribute("db.statement", f"connect {leak}")
        span.record_exception(RuntimeError(f"could not connect to {leak}"))
        span.set_status(Status(StatusCode.ERROR, f"failed at {leak}"))
    [exported] = inner.get_finished_spans()
    texts = [exported.status.description, *exported.attributes.values()]
    texts += [v for event in exported.events for v in event.attributes.values()]
    assert texts and not any("pw-9876" in str(t) for t in texts)
    assert any("app:***@" in str(t) for t in texts)
