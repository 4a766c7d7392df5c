"""The dead-letter writer: one ``core.dead_letters`` row per job the harness gives up on (J-B4).

A dead letter carries the full payload, the attempts made, the last error as ``"Type:
message"`` bounded to :data:`MAX_ERROR_CHARS`, the correlation id, the queue, the consumer, the
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

    A NUL becomes the two characters ``\\0``: PostgreSQL text cannot hold it, and the retry or
    dead letter that records the error must not fail because of the error's own text.
    """
    message = str(error).strip().replace("\x00", "\\0")
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if len(text) <= limit:
        return text
    return text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


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
