"""The purge tests' fixtures: PostgreSQL's clock read once, and the log events at debug."""

from __future__ import annotations

from datetime import datetime

import pytest
from support.logcapture import LoggedEvents


@pytest.fixture
def now(db) -> datetime:
    return db.server_now()


@pytest.fixture
def events(logs: LoggedEvents) -> LoggedEvents:
    """The log events of this test, debug included (the purge logs each batch at debug)."""
    return logs.at_level("DEBUG")
