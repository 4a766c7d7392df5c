"""The dead-letter writer: one ``core.dead_letters`` row per job the harness gives up on (J-B4).

A dead letter carries the full payload, the attempts made, the last error as ``"Type:
message"`` bounded to :data:`MAX_ERROR_CHARS` (:func:`describe_error`, which renders any
exception, even one that cannot be printed), the correlation id, the queue, the consumer, the
tenant and the job id, so that a replay republishes exactly the same job (J-B6). It is born
``pending_review``; the database enforces its lifecycle. The caller supplies the transaction —
the reference queue writes the letter in the one that removes the message, so a failure is
neither lost nor recorded twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["DeadLetter", "MAX_ERROR_CHARS", "describe_error", "write_dead_letter"]

MAX_ERROR_CHARS = 2000
_ELLIPSIS = " …[truncated]"


@dataclass(frozen=True)
class DeadLetter:
    job_id: UUID
    queue: str
    consumer: str
    payload: Any
    attempts: int
    last_error: str
    tenant_id: UUID | None = None
    correlation_id: str | None = None


def describe_error(error: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``"Type: message"`` (just the type when there is no message), cut to ``limit`` characters.

    The one way the harness turns an exception into text — the dead letter's ``last_error``, the
    retry's ``last_error``, the log events' ``error`` — and it never fails, whatever the error:

    - an exception whose ``__str__`` raises or returns a non-string is ``"Type: <message
      unprintable: WhyType: why>"``, so the type is always there;
    - a NUL becomes the two characters ``\\0`` (PostgreSQL text cannot hold it) and a lone
      surrogate such as ``\\udcff`` (bytes decoded with ``surrogateescape``) its escape, since
      UTF-8 cannot encode it: the write that records the error must not fail because of the
      error's own text.
    """
    message = _message(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    text = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    return text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def _message(error: BaseException) -> str:
    """``str(error)`` stripped; when that fails, what went wrong (its type, and its message if that one prints)."""
    try:
        return str(error).strip()
    except Exception as failure:  # noqa: BLE001 - a broken __str__ must not hide the error itself
        why = type(failure).__name__
        try:
            if detail := str(failure).strip():
                why = f"{why}: {detail}"
        except Exception:  # noqa: BLE001 - nor must a broken __str__ of that failure
            pass
        return f"<message unprintable: {why}>"


INSERT_DEAD_LETTER = """
INSERT INTO core.dead_letters
       (job_id, queue, consumer, payload, attempts, last_error, tenant_id, correlation_id)
VALUES (%(job_id)s, %(queue)s, %(consumer)s, %(payload)s, %(attempts)s, %(last_error)s,
        %(tenant_id)s, %(correlation_id)s)
RETURNING id
"""


def write_dead_letter(conn: psycopg.Connection, letter: DeadLetter) -> int:
    """Insert the dead letter in the caller's transaction; return its id."""
    row = conn.execute(
        INSERT_DEAD_LETTER,
        {
            "job_id": letter.job_id,
            "queue": letter.queue,
            "consumer": letter.consumer,
            "payload": Jsonb(letter.payload),
            "attempts": letter.attempts,
            "last_error": letter.last_error[:MAX_ERROR_CHARS],
            "tenant_id": letter.tenant_id,
            "correlation_id": letter.correlation_id,
        },
    ).fetchone()
    assert row is not None
    return row[0]
