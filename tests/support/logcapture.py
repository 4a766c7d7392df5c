"""The one way tests read log events: the ``logs`` fixture (in-process code) and :func:`events_in` (a CLI's stdout).

Loaded as a pytest plugin by conftest.py. ``logs`` (autouse) points structlog, as JSON, at a
buffer of this test only before it starts — an earlier test may have left it on a closed capture
stream; a test that reads the events asks for the fixture by name. A command run through
``main([...])`` configures its own logging to stdout: read what it printed with
``events_in(capsys.readouterr().out, name)``.
"""

from __future__ import annotations

import io
import json

import pytest

from maintenance.runtime.logs import configure_logging


def events_in(text: str, name: str | None = None) -> list[dict]:
    """The JSON log events in ``text`` (lines that are not JSON objects skipped), only those called ``name`` if given."""
    parsed = []
    for line in text.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if name is None or event.get("event") == name:
                parsed.append(event)
    return parsed


class LoggedEvents:
    """The structured events logged since the fixture started (or since :meth:`at_level`)."""

    def __init__(self, level: str = "INFO") -> None:
        self.at_level(level)

    def at_level(self, level: str) -> LoggedEvents:
        """Start over, capturing from ``level`` up (``DEBUG`` for a job's per-batch events)."""
        self.stream = io.StringIO()
        configure_logging(fmt="json", level=level, stream=self.stream)
        return self

    @property
    def text(self) -> str:
        """Everything logged, as written (for asserting that a secret never appears)."""
        return self.stream.getvalue()

    def named(self, name: str) -> list[dict]:
        return events_in(self.text, name)

    def names(self) -> list[str]:
        return [event["event"] for event in events_in(self.text)]

    def by_name(self) -> dict[str, dict]:
        """The last event of each name, in order of first appearance."""
        return {event["event"]: event for event in events_in(self.text)}


@pytest.fixture(autouse=True)
def logs() -> LoggedEvents:
    """Log events of this test only, JSON, captured from INFO up; autouse, so no test logs onto a stream an earlier one closed."""
    return LoggedEvents()
