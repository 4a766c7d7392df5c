"""Job ids the harness mints when a producer gives none: UUID version 7 (RFC 9562), time-ordered.

A fence's primary key is its job id. Random (v4) ids land on a random leaf of that index, so each
insert dirties a page the last checkpoint has not seen and writes a full-page image to the WAL;
time-ordered ids land on the index's right edge. bench/fence_scale.py measured about 6x less WAL
per fence and a denser index (docs/performance.md, "The fence at scale"). The id shows the
millisecond it was minted, nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from uuid import UUID

__all__ = ["new_job_id"]

_MS_BITS = (1 << 48) - 1


def new_job_id(now_ns: Callable[[], int] = time.time_ns) -> UUID:
    """A version 7 UUID of ``now_ns()``: 48 bits of Unix milliseconds, the version, 74 random bits, the variant."""
    ms = now_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & _MS_BITS) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64 | 0b10 << 62 | rand & ((1 << 62) - 1)
    return UUID(int=value)
