"""The API's worker threads: who runs where, so that nothing slow takes the probes' or the tokens' turn.

Sync endpoints run on the event loop's default thread limiter, sized by
``CORE_JOBS_API_WORKER_THREADS`` (default 4: the API's Python runs on one core at a time, more
threads only interleave on it; docs/performance.md). A request waiting on the database holds one
of those threads, so what must answer even when they are all taken has threads of its own:

- token verification (a signature check, and a JWKS fetch when a ``kid`` is new — up to its 5 s
  timeout, behind PyJWT's lock): :data:`VERIFYING`, 8 threads;
- ``/readyz``'s database check: :data:`PROBING`, 2 threads. ``/healthz`` and ``/metrics`` do no
  I/O and run on the event loop itself.

Each limiter is per event loop (an anyio ``RunVar``, as anyio keeps its default limiter), made on
first use inside the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar

__all__ = ["PROBING", "VERIFYING", "run_on", "use_endpoint_threads"]

T = TypeVar("T")

VERIFYING = ("core_jobs_api_verifying", 8)
PROBING = ("core_jobs_api_probing", 2)

_limiters: dict[str, RunVar[CapacityLimiter]] = {name: RunVar(name) for name, _ in (VERIFYING, PROBING)}


def _limiter(threads: tuple[str, int]) -> CapacityLimiter:
    name, size = threads
    variable = _limiters[name]
    try:
        return variable.get()
    except LookupError:
        limiter = CapacityLimiter(size)
        variable.set(limiter)
        return limiter


def use_endpoint_threads(count: int) -> None:
    """Size the running event loop's default limiter, which runs every sync endpoint and dependency, to ``count``."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = count


async def run_on(threads: tuple[str, int], function: Callable[..., T], *args: object) -> T:
    """``function(*args)`` in a worker thread of ``threads`` (:data:`VERIFYING` or :data:`PROBING`), not the endpoints'."""
    return await anyio.to_thread.run_sync(function, *args, limiter=_limiter(threads))
