"""Without a tracer provider (no SDK: the API's default), the worker makes no span for a delivery whose message carries
no trace context — it would record nothing and carry nothing — and a message that does carry one still hands it on to
its handler, as the API's no-op tracer did (harness/tracing.py, ``records``)."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from support.factories import TENANT
from support.harness_support import TTL

from harness import tracing
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.worker import Worker, WorkerConfig

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Anything(BaseModel):
    model_config = {"extra": "allow"}


@pytest.fixture
def no_tracer_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process as a deployment without the SDK sees it: the API's proxy provider, nothing set."""
    proxy = trace.ProxyTracerProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: proxy)


def drain(database_url: str, conn, traceparent: str | None) -> list[tuple[trace.Span, tracing.TraceContext]]:
    """Publish one job (with ``traceparent``) and run a worker once; what its handler saw: the current span, and the
    context a message it published would carry."""
    seen: list[tuple[trace.Span, tracing.TraceContext]] = []
    queue = f"tracing.off.{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        name=queue,
        queue=queue,
        payload_schema=Anything,
        handler=lambda _conn, _payload, _ctx: seen.append((trace.get_current_span(), tracing.current_context())),
    )
    envelope = Envelope(job_id=uuid.uuid4(), payload={}, tenant_id=TENANT, traceparent=traceparent)
    PgQueue(conn).publish(queue, envelope)
    worker = Worker(
        database_url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL),
        metrics=HarnessMetrics(CollectorRegistry()),
    )
    assert worker.run(once=True).processed == 1
    return seen


def test_records_only_with_a_provider_set_or_a_context_to_pass_on(no_tracer_provider):
    assert tracing.records(None) is False
    assert tracing.records(TRACEPARENT) is True


def test_a_delivery_without_a_context_gets_no_span_without_a_provider(database_url, conn, no_tracer_provider):
    """The handler runs with no span current (NO_SPAN made nothing current) and would publish no context."""
    ((span, context),) = drain(database_url, conn, None)
    assert span is tracing.NO_SPAN and not span.get_span_context().is_valid
    assert context == (None, None)


def test_a_message_context_still_reaches_the_handler_without_a_provider(database_url, conn, no_tracer_provider):
    """A message published by a traced producer: its context is current in the handler, and what the handler
    publishes carries it on (the no-op tracer's non-recording span), as before the shortcut."""
    ((span, context),) = drain(database_url, conn, TRACEPARENT)
    assert not span.is_recording()
    assert format(span.get_span_context().trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert context[0] is not None and context[0].split("-")[1] == TRACEPARENT.split("-")[1]
