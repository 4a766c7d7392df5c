"""The purge tests' fixtures, a plugin of the suite (tests/conftest.py): ``now``, PostgreSQL's clock read once, and
``events``, the test's log events at debug (the purge logs each batch at debug), in support/ with
the suite's other fixtures (a folder's conftest.py applies to its folder only)."""

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
