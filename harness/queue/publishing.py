"""The publish side of a trace, shared by the queue adapters: one ``<queue> publish`` span (PRODUCER) per write.

A message that keeps its own context is left as it is: a replay keeps its dead letter's context (or
none: harness/tracing.py), and a context already given is kept too. The others carry the context of
the publish span current around the write; without a recording span (no SDK) nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from opentelemetry.trace import SpanKind

from harness import tracing
from harness.queue.port import Envelope


def keeps_its_context(envelope: Envelope) -> bool:
    """A replay keeps its dead letter's context (or none) unchanged; a context already given is kept too."""
    return envelope.replay_of is not None or envelope.traceparent is not None


@contextmanager
def publish_span(
    messages: Sequence[tuple[str, Envelope]], *, system: str, keep_context: bool = False
) -> Iterator[list[tuple[str, Envelope]]]:
    """The messages, each with the context of a ``<queue> publish`` span (PRODUCER) current around the write.

    No span when every message keeps its own context (or ``keep_context``); none either, and the
    messages unchanged, without a recording span. ``system``: the adapter's ``messaging.system``.
    """
    with publish_context(messages, system=system, keep_context=keep_context) as (traceparent, tracestate):
        yield [
            (queue, envelope)
            if traceparent is None or keeps_its_context(envelope)
            else (queue, replace(envelope, traceparent=traceparent, tracestate=tracestate))
            for queue, envelope in messages
        ]


@contextmanager
def publish_context(
    messages: Sequence[tuple[str, Envelope]], *, system: str, keep_context: bool = False
) -> Iterator[tuple[str | None, str | None]]:
    """The ``(traceparent, tracestate)`` of a ``<queue> publish`` span (PRODUCER) current around the write.

    ``(None, None)`` and no span when every message keeps its own context, or ``keep_context``; without
    a recording span (no SDK), ``(None, None)`` too.
    """
    if keep_context or all(keeps_its_context(envelope) for _queue, envelope in messages):
        yield None, None
        return
    queues = sorted({queue for queue, _envelope in messages})
    attributes = {
        "messaging.system": system,
        "messaging.operation.type": "send",
        "messaging.destination.name": queues[0] if len(queues) == 1 else None,
        "messaging.batch.message_count": len(messages) if len(messages) > 1 else None,
    }
    with tracing.span(
        f"{queues[0] if len(queues) == 1 else '(many)'} publish", kind=SpanKind.PRODUCER, attributes=attributes
    ):
        yield tracing.current_context()
