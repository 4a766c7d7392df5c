"""An envelope's fields as the database constrains them: one predicate per field, the constraint's own.

Every field of an envelope reaches a table — ``core.queue_messages``, ``core.dead_letters``,
``core.executions`` — and a value the database refuses there cannot be recorded at all: neither the
message, nor its retry, nor its dead letter. A foreign producer's junk header would then loop
through ``harness.worker.delivery_failed`` forever, never a dead letter. So each constrained field
has one predicate here (``*_problem``: None, or why — never the value), and:

- **publish** (every adapter's ``publish`` and ``publish_many``, through
  :func:`harness.queue.port.check_envelope`) refuses an envelope with one such field:
  :class:`InvalidEnvelope` naming the field, before anything is written or sent;
- a **delivery** an adapter decodes from what another producer wrote keeps only what passes
  (:func:`received_trace_context`, :func:`received_correlation_id`): an invalid ``traceparent``
  drops the trace context whole and a new trace starts, an invalid ``tracestate`` alone is dropped
  alone — what W3C Trace Context asks of a receiver — and an invalid correlation id is dropped too
  (not altered: an altered id would match nothing the producer knows, and could match another
  job's). The job is handled once all the same.

The fields and their constraints (tests/harness/queue/test_envelope_fields.py holds each corpus against them):

- ``queue``: ``btrim(queue) <> ''`` on the three tables (0001, 0003, 0010); text.
- ``traceparent``: 0017's ``*_traceparent_w3c``: version ``00``, lower-case hex, neither id all zeros.
- ``tracestate``: 0017's ``*_tracestate_w3c`` (at most 512 characters, not blank) and
  ``*_tracestate_with_parent`` (only beside a ``traceparent``).
- ``correlation_id``: text, and indexed (``dead_letters_correlation_idx``), where a B-tree entry holds
  at most 2 704 bytes: at most :data:`MAX_CORRELATION_ID_BYTES` of UTF-8, which always fits.
- ``replay_of``: a ``bigint``. ``job_id`` and ``tenant_id`` are UUIDs by the envelope's type (an
  adapter decoding another producer's text makes one that is not a UUID a poison message).

"Text" is what a PostgreSQL ``text`` holds: no NUL, and UTF-8 (no lone surrogate).
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_CORRELATION_ID_BYTES",
    "MAX_TRACESTATE_CHARS",
    "InvalidEnvelope",
    "correlation_id_problem",
    "queue_problem",
    "received_correlation_id",
    "received_trace_context",
    "replay_of_problem",
    "trace_context_problem",
    "traceparent_problem",
    "tracestate_problem",
]

# Far below what one B-tree entry holds (2 704 bytes), whatever the value: an id, not a document.
MAX_CORRELATION_ID_BYTES = 1024
MAX_TRACESTATE_CHARS = 512  # the W3C limit, and 0017's
_BIGINT = range(-(2**63), 2**63)

# 0017's regular expression; fullmatch, as PostgreSQL's ``~ '^…$'`` (Python's ``$`` would allow a final newline).
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


class InvalidEnvelope(ValueError):
    """An envelope the database would refuse; the message names the field and why (never the value)."""


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"must be text, got {type(value).__name__}"
    if "\x00" in value:
        return "contains NUL, which PostgreSQL cannot store in text"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which is not UTF-8"
    return None


def queue_problem(queue: str) -> str | None:
    """Why ``queue`` cannot name a message's queue (``btrim(queue) <> ''``), or None."""
    return _text_problem(queue) or ("is blank" if queue.strip(" ") == "" else None)  # btrim trims spaces only


def traceparent_problem(traceparent: str) -> str | None:
    """Why ``traceparent`` is not a W3C version-00 traceparent as 0017 keeps it, or None."""
    if problem := _text_problem(traceparent):
        return problem
    if not _TRACEPARENT.fullmatch(traceparent):
        return "is not a W3C traceparent of version 00 in lower-case hex (00-<32 hex>-<16 hex>-<2 hex>)"
    if traceparent[3:35] == "0" * 32:
        return "has an all-zero trace id"
    return "has an all-zero parent id" if traceparent[36:52] == "0" * 16 else None


def tracestate_problem(tracestate: str) -> str | None:
    """Why ``tracestate`` cannot be kept (0017: at most 512 characters, not blank), or None."""
    if problem := _text_problem(tracestate):
        return problem
    if len(tracestate) > MAX_TRACESTATE_CHARS:
        return f"is longer than {MAX_TRACESTATE_CHARS} characters"
    return "is blank" if tracestate.strip(" ") == "" else None


def trace_context_problem(traceparent: str | None, tracestate: str | None) -> str | None:
    """Why the pair cannot be kept, naming the header (``tracestate`` needs a ``traceparent``), or None."""
    if traceparent is None:
        return None if tracestate is None else "tracestate: given without a traceparent"
    if problem := traceparent_problem(traceparent):
        return f"traceparent: {problem}"
    if tracestate is not None and (problem := tracestate_problem(tracestate)):
        return f"tracestate: {problem}"
    return None


def correlation_id_problem(correlation_id: str) -> str | None:
    """Why ``correlation_id`` cannot be stored and indexed, or None."""
    too_long = f"is longer than {MAX_CORRELATION_ID_BYTES} bytes of UTF-8"
    return _text_problem(correlation_id) or (
        too_long if len(correlation_id.encode("utf-8")) > MAX_CORRELATION_ID_BYTES else None
    )


def replay_of_problem(replay_of: int) -> str | None:
    """Why ``replay_of`` cannot name a dead letter (a ``bigint``), or None."""
    if isinstance(replay_of, bool) or not isinstance(replay_of, int):
        return f"must be an integer, got {type(replay_of).__name__}"
    return None if replay_of in _BIGINT else "is out of the bigint range"


def received_trace_context(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """The trace context a delivery keeps (W3C Trace Context, "Processing model"): an invalid ``traceparent``
    drops both headers (a new trace starts); an invalid ``tracestate`` beside a valid one drops it alone."""
    if traceparent is None or traceparent_problem(traceparent):
        return None, None
    return traceparent, tracestate if tracestate is not None and not tracestate_problem(tracestate) else None


def received_correlation_id(correlation_id: str | None) -> str | None:
    """The correlation id a delivery keeps: the one it carries, or None when it cannot be stored."""
    return correlation_id if correlation_id is not None and not correlation_id_problem(correlation_id) else None
