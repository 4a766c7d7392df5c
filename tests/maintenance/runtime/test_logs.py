"""Logs are structured, named events, and never carry a secret (issue 2, point 4)."""

from __future__ import annotations

import io
import json

import pytest

from maintenance.runtime.logs import SecretRedactor, configure_logging, get_logger

pytestmark = pytest.mark.pure


def test_json_lines_when_not_a_tty():
    """On a non-TTY stream each event is one JSON object with the dotted name and snake_case fields."""
    stream = io.StringIO()
    configure_logging(fmt="auto", stream=stream)
    get_logger().info("maintenance.purge.batch_deleted", num_deleted=10)
    event = json.loads(stream.getvalue().strip())
    assert event["event"] == "maintenance.purge.batch_deleted"
    assert event["num_deleted"] == 10
    assert event["level"] == "info"


class Writes(io.StringIO):
    """A stream that keeps each write apart, as an unbuffered stdout (PYTHONUNBUFFERED) passes each to the pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_event_is_one_write_with_its_newline():
    """One write per event, newline included: processes sharing one stdout pipe (the API's children) never
    interleave a line — print()'s separate newline write let another process's line in between."""
    stream = Writes()
    configure_logging(fmt="json", stream=stream)
    get_logger().info("maintenance.api.process_started", pid=1, slot=0)
    get_logger().info("maintenance.api.process_started", pid=2, slot=1)
    assert len(stream.writes) == 2
    assert all(w.endswith("\n") and w.count("\n") == 1 and json.loads(w) for w in stream.writes)


class TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_readable_console_on_a_tty():
    """On a TTY the same event is a readable console line with key=value fields, not JSON."""
    stream = TtyStream()
    configure_logging(fmt="auto", stream=stream)
    get_logger().info("maintenance.purge.batch_deleted", num_deleted=10)
    line = stream.getvalue()
    assert not line.lstrip().startswith("{")
    assert "maintenance.purge.batch_deleted" in line and "num_deleted" in line and "10" in line


def test_configured_secrets_urls_and_bearer_tokens_are_masked():
    """A configured secret, a URL password and a Bearer token are masked wherever they appear."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream, secrets=["tok-abcdef123456"])
    get_logger().error(
        "alerts.feed.post_failed",
        error="401 for token tok-abcdef123456",
        url="postgresql://app:pw-9876@db/core",
        headers={"Authorization": "Bearer zzzzyyyyxxxx"},
    )
    text = stream.getvalue()
    assert "tok-abcdef123456" not in text and "pw-9876" not in text and "zzzzyyyyxxxx" not in text
    event = json.loads(text)
    assert event["url"] == "postgresql://app:***@db/core"
    assert event["headers"]["Authorization"] == "Bearer ***"


def test_exceptions_are_redacted_too():
    """A formatted traceback that contains a secret is masked."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream, secrets=["tok-abcdef123456"])
    try:
        raise RuntimeError("connect failed with tok-abcdef123456")
    except RuntimeError:
        get_logger().exception("maintenance.run.error")
    assert "tok-abcdef123456" not in stream.getvalue()
    assert "RuntimeError" in stream.getvalue()


def test_short_strings_are_not_treated_as_secrets():
    """Secrets shorter than 4 characters are ignored, so they cannot mask ordinary words."""
    assert SecretRedactor(["ab"]).redact("about") == "about"
