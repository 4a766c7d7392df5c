"""How a handler says what went wrong, and so what the harness does next.

- :class:`TransientError` — worth retrying (a timeout, an HTTP 503). Retried on the consumer's
  policy; ``retry_after`` (seconds, an HTTP-date, or a timedelta, as the peer sent it) is
  honoured up to the policy's bound. **Any exception the handler does not classify is treated
  as transient**: an unknown failure is retried, not dropped.
- :class:`NotSent` — a transient failure that certainly happened before the request left (the
  connection was refused, the name did not resolve): a ``NON_IDEMPOTENT_WRITE`` raising it is
  retried like any other action instead of going to reconciliation (harness/durable/actions.py).
- :class:`PermanentError` — will never succeed as it is (the member does not exist, the
  provider said 4xx): a dead letter at once, no retries (J-B4).
- :class:`PoisonMessage` — the payload itself is invalid; the harness raises it when the
  consumer's schema rejects a payload (J-B5): a dead letter at once, zero retries.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = ["NotSent", "PermanentError", "PoisonMessage", "TransientError"]


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
