"""The one bounded wait of the tests: :func:`wait_until` polls a condition another thread or process brings about.

No test sleeps for time to pass (rows are back-dated instead); this only waits for an event —
a backend waiting on a lock, a thread reaching a point — and fails the test if it never comes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``condition`` every 10 ms until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        threading.Event().wait(0.01)
    return value
