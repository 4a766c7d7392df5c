"""How a handler says what went wrong, and so what the harness does next.

- :class:`TransientError` — worth retrying (a timeout, an HTTP 503). Retried on the consumer's
  policy; ``retry_after`` (seconds, an HTTP-date, or a timedelta, as the peer sent it) is
  honoured up to the policy's bound. **Any exception the handler does not classify is treated
  as transient**: an unknown failure is retried, not dropped.
- :class:`NotSent` — a transient failure that certainly happened before the request left (the
  connection was refused, the name did not resolve): a ``NON_IDEMPOTENT_WRITE`` raising it is
  retried like any other action instead of going to reconciliation (harness/consumer/actions.py).
- :class:`PermanentError` — will never succeed as it is (the member does not exist, the
  provider said 4xx): a dead letter at once, no retries (J-B4).
- :class:`PoisonMessage` — the payload itself is invalid; the harness raises it when the
  consumer's schema rejects a payload (J-B5): a dead letter at once, zero retries.

A failure is recorded twice: :func:`describe_error`'s one line (``last_error``, the log's
``error``) and :func:`describe_traceback`'s stack trace (the dead letter's ``traceback``, the log's
``traceback``, the span's exception event) — what an operator needs to find the helper that raised.
"""

from __future__ import annotations

import traceback
from datetime import timedelta

import psycopg
from pydantic import ValidationError

from harness import tracing

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_TRACEBACK_CHARS",
    "NotSent",
    "PermanentError",
    "PoisonMessage",
    "TransientError",
    "describe_error",
    "describe_traceback",
    "validation_problems",
]

MAX_ERROR_CHARS = 2000  # the longest error text the harness records (a dead letter's or a retry's last_error)
_ELLIPSIS = " …[truncated]"
# The longest traceback the harness records. 8 000 characters hold ~40 frames of a typical stack
# with a chained cause (Python already folds a recursion's repeats into one line), and keep the log
# line that carries it under the 16 KiB at which container runtimes split a line (Docker's
# json-file, containerd's CRI log) even in two-byte UTF-8; a dead letter's row stays small.
MAX_TRACEBACK_CHARS = 8000
_HEAD_CHARS = 2000  # of a longer one: its start (the outermost frames), then its end (the innermost, the error)


class TransientError(Exception):
    """A failure that may go away: retry later, no sooner than ``retry_after`` if given."""

    def __init__(self, message: str, *, retry_after: str | float | int | timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotSent(TransientError):
    """The request never left this process (connection refused, DNS): no effect can have happened."""


class PermanentError(Exception):
    """A failure that retrying cannot fix: dead-letter the job now."""


class PoisonMessage(PermanentError):
    """A payload the consumer's schema rejects: it never becomes valid, so it is never retried."""


def describe_error(error: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``"Type: message"`` (just the type when there is no message), cut to ``limit`` characters.

    The one way the harness turns an exception into text — the dead letter's ``last_error``, the
    retry's ``last_error``, the log events' ``error`` — and it never fails, whatever the error:

    - an exception whose ``__str__`` raises or returns a non-string is ``"Type: <message
      unprintable: WhyType: why>"``, so the type is always there;
    - a database error is its primary message (and its hint), never psycopg's whole text: PostgreSQL's
      DETAIL and CONTEXT carry row data — ``Failing row contains (…)``, ``Key (card)=(…) already
      exists``, a payload's JSON — which must not reach a log, a header or a span (the message names
      the constraint, which is what an operator needs);
    - a NUL becomes the two characters ``\\0`` (PostgreSQL text cannot hold it) and a lone
      surrogate such as ``\\udcff`` (bytes decoded with ``surrogateescape``) its escape, since
      UTF-8 cannot encode it: the write that records the error must not fail because of the
      error's own text;
    - a credential the error quotes (a URL's password, a token) is masked by the process's redactor
      (:func:`harness.tracing.redact`, as :func:`describe_traceback` is) before the cut: the text is
      stored, shown by the API and the CLI, and sent to the alert feed.
    """
    message = _message(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    text = tracing.redact(_storable(text))
    if len(text) <= limit:
        return text
    return text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def describe_traceback(error: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str | None:
    """Python's rendering of ``error``'s stack trace and chained causes, masked and cut to ``limit`` characters;
    None when it was never raised (no frame to show: a poison built by the harness).

    What it shows is the frames' file, line, function and source line, and each exception's text —
    never a frame's locals, so a payload value is there only if an exception's own text quotes it
    (as ``last_error`` would). A database error in the chain (the one raised, a cause, a context) is
    shown by the text :func:`describe_error` gives it, its primary message and hint, never psycopg's
    DETAIL or CONTEXT that quote the row. Credentials are masked by the process's redactor
    (:func:`harness.tracing.redact`: the bundle's credential detector,
    maintenance/runtime/credentials.py) before the cut, so a cut never leaves part of a secret.
    A longer text keeps its first ``_HEAD_CHARS`` and its end, where the innermost frames and the
    error are, with the number of characters cut between them. Never fails: a traceback that
    cannot be rendered is None.
    """
    if error.__traceback__ is None and error.__cause__ is None and error.__context__ is None:
        return None
    try:
        rendering = traceback.TracebackException.from_exception(error)
        _database_errors_by_their_message(rendering, error)
        text = "".join(rendering.format())
    except Exception:
        return None
    text = tracing.redact(_storable(text))
    if len(text) <= limit:
        return text
    head = min(_HEAD_CHARS, limit // 4)
    tail = limit - head - len(f"\n  …[{len(text)} characters cut]…\n")  # the marker at its longest
    marker = f"\n  …[{len(text) - head - tail} characters cut]…\n"
    return text[:head] + marker + text[len(text) - tail :]


def _database_errors_by_their_message(rendering: traceback.TracebackException, error: BaseException) -> None:
    """Each database error of ``rendering`` — ``error``, its causes, its contexts, a group's members — shown by
    :func:`_message`'s text (its primary message and hint), as :func:`describe_error` shows it: psycopg's own text
    carries the DETAIL and CONTEXT that quote row data.

    The rendering keeps an exception's text in ``_str`` (CPython's ``format_exception_only`` writes it;
    tests/harness/test_database_errors.py fails if a Python version stops reading it).
    """
    pending: list[tuple[traceback.TracebackException, BaseException]] = [(rendering, error)]
    seen: set[int] = set()
    while pending:
        shown, raised = pending.pop()
        if id(shown) in seen:
            continue
        seen.add(id(shown))
        if isinstance(raised, psycopg.Error):
            shown._str = _message(raised)  # type: ignore[attr-defined]
        if shown.__cause__ is not None and raised.__cause__ is not None:
            pending.append((shown.__cause__, raised.__cause__))
        if shown.__context__ is not None and raised.__context__ is not None:
            pending.append((shown.__context__, raised.__context__))
        if shown.exceptions and isinstance(raised, BaseExceptionGroup):
            pending.extend(zip(shown.exceptions, raised.exceptions, strict=False))


def _storable(text: str) -> str:
    """``text`` as PostgreSQL text can hold it: NUL as ``\\0``, a lone surrogate as its escape."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def validation_problems(exc: ValidationError, whole: str) -> list[str]:
    """Each problem of a pydantic validation as ``where: what`` (``points: Input should be greater
    than 0``); ``whole`` names the place when the problem is the value itself."""
    return [
        f"{'.'.join(str(p) for p in error.get('loc', ())) or whole}: {error.get('msg', 'invalid')}"
        for error in exc.errors(include_url=False)
    ]


# What a refused privilege most often means for a consumer: `core-jobs worker` switched its session to its
# least-privilege role (migration 0020), which has no grant on the service's own tables until the service gives one.
PRIVILEGE_HINT = (
    "the session's role lacks it: `core-jobs worker` runs handlers as core_jobs_worker (CORE_JOBS_WORKER_DATABASE_ROLE);"
    " GRANT that role what the handler needs on the consumer's own tables"
)


def _message(error: BaseException) -> str:
    """``str(error)`` stripped — a database error's primary message and hint alone —; when that fails, what went
    wrong (its type, and its message if that one prints)."""
    try:
        if isinstance(error, psycopg.Error) and (primary := error.diag.message_primary):
            hint = error.diag.message_hint
            if hint is None and isinstance(error, psycopg.errors.InsufficientPrivilege):
                hint = PRIVILEGE_HINT
            return f"{primary.strip()} (HINT: {hint.strip()})" if hint else primary.strip()
        return str(error).strip()
    except Exception as failure:
        why = type(failure).__name__
        try:
            if detail := str(failure).strip():
                why = f"{why}: {detail}"
        except Exception:
            pass
        return f"<message unprintable: {why}>"
