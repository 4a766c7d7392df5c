"""Test kits shipped with the harness, for the authors of what plugs into it (needs pytest).

:mod:`harness.testing.conformance` — the queue port's contract as tests: an adapter's test module
subclasses :class:`~harness.testing.conformance.QueuePortContract` and overrides one fixture
(docs/writing-an-adapter.md). The harness does not depend on pytest; importing this package
does, so only a test suite imports it.
"""

from harness.testing.conformance import QueuePortContract, QueueUnderTest

__all__ = ["QueuePortContract", "QueueUnderTest"]
