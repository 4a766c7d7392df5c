"""Everything the project publishes goes through the queue port: ``core.queue_messages`` is written by PgQueue only.

The table is the reference queue and, for queues that live on a broker, the **outbox** a relay
drains (harness/queue/relay.py, docs/outbox.md): a message written by a statement of its own
would bypass the port's checks (payload, trace context) and whatever a later adapter does.
"""

from __future__ import annotations

import re

import pytest
from support import ROOT

pytestmark = pytest.mark.pure

# A statement that writes the table: INSERT INTO, UPDATE, DELETE FROM, TRUNCATE, COPY … FROM.
WRITES = re.compile(
    r"(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(\s+TABLE)?|COPY)\s+core\.queue_messages\b", re.IGNORECASE
)
# The one adapter of the table; the migrations that define it.
OWNER = ROOT / "harness" / "queue" / "pgqueue.py"


def test_only_the_reference_adapter_writes_the_queue_table():
    """No module of maintenance/ or harness/ but harness/queue/pgqueue.py has a statement writing core.queue_messages."""
    writers = [
        str(path.relative_to(ROOT))
        for package in ("maintenance", "alerts", "harness")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != OWNER and WRITES.search(path.read_text())
    ]
    assert writers == []


def test_the_reference_adapter_does_write_it():
    """The pattern finds the adapter's own statements (so an empty list above means something)."""
    assert WRITES.search(OWNER.read_text())
