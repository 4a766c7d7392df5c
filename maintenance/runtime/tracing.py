"""Traces, optional at run time: the OpenTelemetry SDK is set up only when the deployment asks for it.

Off by default: the spans of the jobs, the API, the worker and the durable actions are the
OpenTelemetry API's no-ops, and a message carries no trace context (harness/tracing.py). The
standard OpenTelemetry variables turn it on — no ``CORE_JOBS_`` setting of its own, so the
collector's usual configuration applies unchanged (docs/deployment.md, "Traces"):

* ``OTEL_TRACES_EXPORTER`` — ``otlp`` (OTLP over HTTP/protobuf), ``console`` (spans as JSON on
  stderr, for a look), ``none`` (off). Unset, tracing is on (``otlp``) when an OTLP endpoint is
  given (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``), else off.
* ``OTEL_SDK_DISABLED=true`` — off, whatever else is set.
* The rest is the SDK's own: ``OTEL_SERVICE_NAME`` (default ``core-jobs``), ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout), ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``.

Asked for without the SDK installed (the ``core-jobs[otel]`` extra; the image has it), the
command refuses to start with a :class:`~maintenance.errors.ConfigError` saying so, rather than
run untraced while the operator thinks otherwise. Spans are exported in batches by a background
thread and flushed when the process exits.

The bundle's own spans: ``job <name>`` per job run (maintenance/service/runner.py) and ``<METHOD>
<route>`` per API request (maintenance/api/app.py), a child of the request's ``traceparent``
header when it has a valid one. The harness's: publish, delivery and durable action
(harness/tracing.py). Log events carry ``trace_id`` and ``span_id`` while a span is active
(maintenance/runtime/logs.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

from maintenance.errors import ConfigError

__all__ = ["EXTRA_MISSING", "TRACER_NAME", "configure_tracing", "exporter_asked", "tracer"]

TRACER_NAME = "core-jobs"
EXPORTERS = ("otlp", "console", "none")
EXTRA_MISSING = (
    "traces are asked for ({why}) but the OpenTelemetry SDK is not installed: install core-jobs[otel] "
    "(or unset it: without it the spans are no-ops)"
)


def tracer() -> trace.Tracer:
    """The bundle's tracer, from the provider :func:`configure_tracing` set (a no-op one otherwise)."""
    return trace.get_tracer(TRACER_NAME)


def exporter_asked(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The exporter the environment asks for (None: tracing off), and which variable says so."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None, "OTEL_SDK_DISABLED=true"
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        if named not in EXPORTERS:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={named!r} is not one of {', '.join(EXPORTERS)}")
        return (None if named == "none" else named), f"OTEL_TRACES_EXPORTER={named}"
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if env.get(variable, "").strip():
            return "otlp", f"{variable} is set"
    return None, "no OTEL_TRACES_EXPORTER nor OTLP endpoint"


def configure_tracing(env: Mapping[str, str] | None = None) -> str | None:
    """Install the SDK's tracer provider when the environment asks for traces; the exporter used, or None (off).

    Raises :class:`ConfigError` when traces are asked for but the SDK (``core-jobs[otel]``) is missing.
    """
    env = os.environ if env is None else env
    exporter_name, why = exporter_asked(env)
    if exporter_name is None:
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise ConfigError(EXTRA_MISSING.format(why=why)) from exc
    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout is a --json command's document
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(EXTRA_MISSING.format(why=why)) from exc
        exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_* read by the exporter itself
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the name defaults to ours.
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or "core-jobs"})
    provider = TracerProvider(resource=resource)  # flushed and shut down at exit (shutdown_on_exit)
    provider.add_span_processor(BatchSpanProcessor(redacting(exporter)))
    trace.set_tracer_provider(provider)
    return exporter_name


def redacting(exporter: Any) -> Any:
    """``exporter`` behind the log's masking: every exported span's texts — status description, string
    attributes, event attributes (an exception's message and stack trace) — pass through
    :func:`maintenance.runtime.logs.redact` first, whoever made the span (ours, FastAPI's, a library's).
    The harness masks what it writes itself (``harness.tracing.set_error``); this is the same rule at
    the one door every span leaves by."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Status

    from maintenance.runtime.logs import redact

    def masked(attributes: Any) -> dict[str, Any]:
        return {k: redact(v) if isinstance(v, str) else v for k, v in (attributes or {}).items()}

    def copy(span: ReadableSpan) -> ReadableSpan:
        status = span.status
        if status.description:
            status = Status(status.status_code, redact(status.description))
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=masked(span.attributes),
            events=[Event(e.name, masked(e.attributes), e.timestamp) for e in span.events],
            links=span.links,
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Redacting(SpanExporter):
        def export(self, spans: Any) -> Any:
            return exporter.export([copy(span) for span in spans])

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Redacting()
