"""The ``spans`` fixture: the OpenTelemetry SDK with its in-memory exporter, for one test only.

Loaded as a pytest plugin by conftest.py. The process's tracer provider can be set once; it is
set here to a switch that is the API's no-op provider except inside a test that asks for
``spans``, where it is an SDK provider exporting every ended span to an
:class:`InMemorySpanExporter` (synchronously: a span is there as soon as it ends). So every other
test runs as a deployment without tracing does: no spans, no trace context on the messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Switch(trace.TracerProvider):
    """The process's provider: a no-op one, or the SDK's while a test records spans."""

    def __init__(self) -> None:
        self.target: trace.TracerProvider = trace.NoOpTracerProvider()

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return self.target.get_tracer(*args, **kwargs)


_SWITCH = _Switch()
trace.set_tracer_provider(_SWITCH)


class Spans(InMemorySpanExporter):
    """The spans ended so far, and the ones of a name."""

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.get_finished_spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in self.get_finished_spans()]}"
        return found[0]


def trace_id(span: ReadableSpan) -> str:
    """The span's trace id in hex, as a traceparent and the logs write it."""
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = Spans()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _SWITCH.target = provider
    try:
        yield exporter
    finally:
        _SWITCH.target = trace.NoOpTracerProvider()
        provider.shutdown()
