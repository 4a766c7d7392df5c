"""Logging: structlog events with stable dotted names and snake_case fields, secrets redacted.

Output is JSON lines on stdout when stdout is not a TTY (Kubernetes, Better Stack's log
collector), a readable console on a TTY; ``CORE_JOBS_LOG_FORMAT`` forces either. Every string
in every event — including formatted exceptions, rendered as the harness renders a failure
(:func:`harness.errors.describe_traceback`: a database error by its message, not the row it quotes) — passes through :class:`SecretRedactor`, which
masks every configured secret value and every credential the one detector recognises
(``maintenance/runtime/credentials.py``: passwords in URLs, ``Authorization`` credentials, JWTs, PEM blocks,
provider keys, ``password=``/``token=`` pairs — the shapes a resolution's evidence is refused
for), so a token never reaches a log line however it got there. The same redactor masks every error text
that leaves the process by another way: :func:`redact` (a ``--json`` document, a job's outcome) and,
installed by :func:`configure_logging`, a span's status (:func:`harness.tracing.set_redactor`). An event logged inside a span
carries its ``trace_id`` and ``span_id`` (harness/tracing.py), so a log line leads to its trace.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

from harness import tracing
from harness.tracing import add_trace_context
from maintenance.runtime.credentials import MASK, mask_credentials
from maintenance.runtime.imports import import_without

# structlog imports rich when it is installed, for pretty tracebacks our events never use
# (_stack_trace renders exceptions as plain text; the console renderer is given
# plain_traceback): a third of a second per process (maintenance/runtime/imports.py).
import_without("structlog", hidden=("rich",))

import structlog  # noqa: E402  (imported just above, without rich)


class SecretRedactor:
    """A structlog processor that masks secrets in every string of an event.

    Strings found clean (nothing masked) of at most :data:`CLEAN_CHARS` characters are remembered,
    at most :data:`CLEAN_SIZE` of them: an event's name, level, route, method and subject repeat
    on every request, and the detector costs ~0.1-0.3 ms a string — most of an API request log
    line, written on the event loop. A string holding a credential is never remembered: it is
    masked again each time.
    """

    CLEAN_CHARS = 256
    CLEAN_SIZE = 4096

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self.clean: set[str] = set()

    def redact(self, text: str) -> str:
        if text in self.clean:
            return text
        masked = text
        for secret in self.secrets:
            masked = masked.replace(secret, MASK)
        masked = mask_credentials(masked)
        if masked == text and len(text) <= self.CLEAN_CHARS:
            if len(self.clean) >= self.CLEAN_SIZE:
                self.clean = set()
            self.clean.add(text)
        return masked

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._walk(v) for v in value)
        if isinstance(value, BaseException):  # a database error by its message, never the row its DETAIL quotes
            from harness.errors import describe_error  # here: it imports psycopg, which check-config never loads

            return self.redact(describe_error(value))
        return value

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        return {key: self._walk(value) for key, value in event_dict.items()}


_REDACTOR = SecretRedactor()  # configure_logging's, with the configured secrets


def _stack_trace(exc_info: Any) -> str:
    """An event's ``exc_info`` as the harness renders a failure (:func:`harness.errors.describe_traceback`): bounded,
    and each database error by its message, never psycopg's DETAIL quoting a row."""
    from harness.errors import describe_error, describe_traceback  # here: it imports psycopg (check-config does not)

    error = exc_info[1]
    if error is None:
        return ""
    return describe_traceback(error) or describe_error(error)


def redact(text: str) -> str:
    """``text`` masked as a log line would be: for an error text that leaves the process other than by the log."""
    return _REDACTOR.redact(text)


class _CurrentStdout:
    """sys.stdout as it is at each write, so a replaced stdout (pytest capture) is followed."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


def configure_logging(
    *, fmt: str = "auto", level: str = "INFO", secrets: Iterable[str] = (), stream: TextIO | None = None
) -> None:
    """Configure structlog for the whole process, and its redactor for spans and :func:`redact`. Safe to call more than once."""
    global _REDACTOR
    _REDACTOR = SecretRedactor(secrets)
    tracing.set_redactor(_REDACTOR.redact)
    out = stream if stream is not None else sys.stdout
    sink = stream if stream is not None else _CurrentStdout()
    as_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if as_json
        # plain_traceback whether rich is installed or not: the same console, and no rich to import.
        else structlog.dev.ConsoleRenderer(colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.ExceptionRenderer(_stack_trace),
            _REDACTOR,
            # After the redactor: values made here (the time, a span's hex ids), never a secret, and
            # new on every event — masking them cost most of a request log line.
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_context,  # trace_id, span_id while a span is active (maintenance/runtime/tracing.py)
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # structlog annotates TextIO but only calls write() and flush(), which _CurrentStdout has. One write per
        # line, its newline included (print() writes that apart): processes sharing one stdout pipe — the API's
        # children (maintenance/api/processes.py) — never cut into each other's lines, buffered or not.
        logger_factory=structlog.WriteLoggerFactory(sink),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def get_logger(**initial: Any) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(**initial)
