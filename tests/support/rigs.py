"""Whether the servers the tests start themselves must start: a developer without their binaries is skipped, CI fails.

The private PostgreSQL clusters (tests/support/private_cluster.py), the failover rig (tests/support/failover.py) and
the RabbitMQ cluster rig (tests/support/rabbit_cluster.py) need binaries a developer's machine may lack (``initdb``,
``pg_basebackup``, ``rabbitmq-server``): there each test that needs one is skipped, saying why. In CI a skip would
pass for a green run of tests that never ran — ``.ci/run`` exports ``CORE_JOBS_REQUIRE_CLUSTERS=1`` and the same
reason fails the test instead.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_VARIABLE = "CORE_JOBS_REQUIRE_CLUSTERS"


def required(*variables: str) -> bool:
    """Whether :data:`REQUIRE_VARIABLE` (or any of ``variables``) is set to 1."""
    return any(os.environ.get(name) == "1" for name in (REQUIRE_VARIABLE, *variables))


def unavailable(reason: str, *variables: str) -> NoReturn:
    """A rig cannot start here: skip the test with ``reason``, or — :func:`required` — fail it with the same reason."""
    if required(*variables):
        pytest.fail(f"{reason} (required here: {REQUIRE_VARIABLE}=1)", pytrace=False)
    pytest.skip(reason)
