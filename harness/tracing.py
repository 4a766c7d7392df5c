"""Traces: the W3C trace context a message carries, the harness's spans, and trace ids in the logs.

The harness uses the OpenTelemetry **API** only: without an SDK configured by the service
(``core-jobs-harness[otel]``, or the bundle's ``core-jobs[otel]``; docs/harness.md, "Traces")
every span is a no-op and no message carries a context — nothing to pay, nothing to configure.
With one, the harness records:

=============================  ========  ==========================================================
span                           kind      where
=============================  ========  ==========================================================
``<queue> publish``            PRODUCER  ``PgQueue.publish`` / ``publish_many``: its context is the
                                         message's ``traceparent`` (and ``tracestate``)
``<queue> process``            CONSUMER  the worker, per delivery, a child of the message's context:
                                         every attempt of the job is in the trace of its publish
``action <name>``              INTERNAL  a durable consumer's action call (harness/durable/run.py)
=============================  ========  ==========================================================

The context is a column of the message and of its dead letter (migration 0017), so it survives
retries, lease expiries and the dead letter: a **replay** republishes the letter's context
unchanged (it publishes no span of its own), and the replay's delivery joins the original trace —
the first attempt, its retries, the dead letter and the second attempt under one trace id. The
API role's publish guard holds a replay to its letter's context.

:func:`add_trace_context` is a structlog processor: an event logged while a span is active gets
``trace_id`` and ``span_id`` (hex, as a tracing backend shows them), so a log line finds its trace.
The bundle's logging has it (maintenance/runtime/logs.py); a service that uses the harness alone
adds it to its own structlog configuration.

**An error text leaves through a span too**, to a tracing backend that sees no log redactor: a
span's status and its exception event (the failure's one line and its stack trace,
``exception.type``/``.message``/``.stacktrace`` as OpenTelemetry's semantic conventions name them)
are written only through :func:`set_error`, which passes the text through the process's redactor
(:func:`set_redactor`; :func:`redact` for the dead letter's traceback, harness/errors.py). The harness imports no credential
detector of its own, so the default is the identity; the bundle installs its log's
``SecretRedactor`` when it configures logging (maintenance/runtime/logs.py), so a span says what
the log line says, credentials masked. The harness's spans neither record an escaping exception
nor set a status from it (the SDK's defaults would send its raw text and traceback): an
exception leaving a span marks it failed by its type's name; a caller that handles one (the worker, a
durable action) sets its described text through :func:`set_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "NO_SPAN",
    "TRACER_NAME",
    "Span",
    "TraceContext",
    "add_trace_context",
    "context_of",
    "current_context",
    "open_delivery_span",
    "provider_set",
    "records",
    "redact",
    "set_error",
    "set_redactor",
    "span",
    "tracer",
    "within",
]

TRACER_NAME = "harness"
_PROPAGATOR = TraceContextTextMapPropagator()

# What a delivery's span is when it could carry nothing (:func:`records`): no SDK, no context to pass on. Every
# operation on it is a no-op, and :func:`within` it costs nothing.
NO_SPAN: Span = trace.INVALID_SPAN
_NO_SPAN_CONTEXT = nullcontext(NO_SPAN)

# (traceparent, tracestate): the W3C headers as a message keeps them; (None, None) without a trace.
TraceContext = tuple[str | None, str | None]

# What every error text goes through before a span carries it: the identity until set_redactor.
_redact: Callable[[str], str] = str


def set_redactor(redact: Callable[[str], str]) -> None:
    """Make ``redact`` the masking of every error text a span carries from now on (the process's log redactor)."""
    global _redact
    _redact = redact


def redact(text: str) -> str:
    """``text`` masked by the process's redactor (:func:`set_redactor`): an error text that leaves the process."""
    return _redact(text)


def tracer() -> trace.Tracer:
    """The harness's tracer, from whatever provider the service set (a no-op one by default)."""
    return trace.get_tracer(TRACER_NAME)


def provider_set() -> bool:
    """Whether a tracer provider is set (an SDK): not the API's default proxy, nor its explicit no-op."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def records(traceparent: str | None, *, provider: bool | None = None) -> bool:
    """Whether a delivery's span could carry anything: a tracer provider is set (an SDK), or the message has a context
    to pass on (the API's no-op tracer hands it through to the handler's logs and publishes).

    False is the common case without an SDK — the worker then uses :data:`NO_SPAN` and skips the span's making and
    attributes, ~12 % of a drain's Python a job (docs/performance.md): the same observable result, for nothing.
    ``provider``: :func:`provider_set` as read once for a batch (it reads the environment when none is set).
    """
    if traceparent is not None:
        return True
    return provider_set() if provider is None else provider


def current_context() -> TraceContext:
    """The active span's context as W3C headers; (None, None) when no recording span is active."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")


def context_of(traceparent: str | None, tracestate: str | None) -> otel_context.Context | None:
    """The context a message's headers name, or None (a new trace) without a valid one."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})}
    extracted = _PROPAGATOR.extract(carrier)
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


@contextmanager
def span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: dict[str, Any] | None = None) -> Iterator[Span]:
    """A span of the harness's tracer, current inside the block; an exception escaping it is recorded."""
    with (
        tracer().start_as_current_span(
            name, kind=kind, attributes=_clean(attributes), record_exception=False, set_status_on_exception=False
        ) as current,
        _failing(current),
    ):
        yield current


def open_delivery_span(queue: str, traceparent: str | None, tracestate: str | None, attributes: dict[str, Any]) -> Span:
    """``<queue> process``, a child of the message's context (a new trace without one), started but not current: the
    caller makes it current with :func:`within` for each step (a batch's deliveries share a transaction: handled, committed
    together, then settled one by one) and ends it."""
    return tracer().start_span(
        f"{queue} process",
        context=context_of(traceparent, tracestate),
        kind=SpanKind.CONSUMER,
        attributes=_clean(attributes),
        record_exception=False,
        set_status_on_exception=False,
    )


def within(current: Span) -> AbstractContextManager[Span]:
    """``current`` the active span inside the block, not ended at its end; an exception leaving it marks it failed.
    Nothing at all for :data:`NO_SPAN`."""
    return _NO_SPAN_CONTEXT if current is NO_SPAN else _within(current)


@contextmanager
def _within(current: Span) -> Iterator[Span]:
    with (
        trace.use_span(current, end_on_exit=False, record_exception=False, set_status_on_exception=False),
        _failing(current),
    ):
        yield current


@contextmanager
def _failing(current: Span) -> Iterator[None]:
    """An exception leaving the block marks ``current`` failed by its type's name alone, never its text.

    The SDK's own record would export the raw message and traceback. A caller that handles an
    exception sets its described text itself, through :func:`set_error` (harness/worker.py).
    """
    try:
        yield
    except BaseException as exc:
        set_error(current, type(exc).__name__)
        raise


def set_error(current: Span, description: str, traceback: str | None = None) -> None:
    """Mark ``current`` failed with ``description``, masked by the process's redactor (:func:`set_redactor`);
    with the failure's ``traceback`` (:func:`harness.errors.describe_traceback`), also an ``exception`` event.

    The one way an error text reaches a span: a retry, a dead letter, a failed action or job. Nothing
    is masked for a span that records nothing (tracing off, or not sampled): this runs per failed delivery.
    The event is the one ``Span.record_exception`` would add, from the texts the harness recorded
    (the type is ``description``'s ``Type:`` prefix, as :func:`harness.errors.describe_error` writes it).
    """
    if not current.is_recording():
        return
    message = _redact(description)
    current.set_status(Status(StatusCode.ERROR, message))
    if traceback is not None:
        current.add_event(
            "exception",
            {
                "exception.type": description.partition(":")[0],
                "exception.message": message,
                "exception.stacktrace": _redact(traceback),
            },
        )


def _clean(attributes: dict[str, Any] | None) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int and float attributes: None is left out, anything else is text."""
    return {
        key: value if isinstance(value, str | bool | int | float) else str(value)
        for key, value in (attributes or {}).items()
        if value is not None
    }


def add_trace_context(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: ``trace_id`` and ``span_id`` of the active span, when one is recording."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict.setdefault("trace_id", format(context.trace_id, "032x"))
        event_dict.setdefault("span_id", format(context.span_id, "016x"))
    return event_dict
