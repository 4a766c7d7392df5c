"""What a consumer service declares: the consumer, its durable actions and their effect classes, retry policies.

``consumer`` (``Consumer``, ``JobContext``), ``actions`` (``Action``, ``ActionContext``, the
idempotency key of a write), ``effects`` (``Effect`` and ``RULES``: what the executor does for
each effect class) and ``retry`` (``RetryPolicy``, its delays and worst case, J-B7). The rest of
the harness reads these declarations and never the other way round (pyproject.toml's import
contracts); docs/harness.md.
"""

from __future__ import annotations

import sys
import warnings
from importlib import import_module
from types import ModuleType
from typing import Any

# Deprecated, for one minor version: ``harness.consumer`` was the module that defined these;
# they live in ``harness.consumer.consumer``, and a service imports them from ``harness``.
_MOVED = ("Consumer", "ConsumerError", "JobContext")


def replace_moved_module(old: str, new: ModuleType) -> None:
    """The shim at ``old`` (``harness.actions``, ``harness.retry``) warns and becomes the module at its new home."""
    warnings.warn(
        f"{old} is deprecated and goes in the next minor version: import {new.__name__} (or the names from harness)",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = new


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'harness.consumer' has no attribute {name!r}")
    warnings.warn(
        f"harness.consumer.{name} is deprecated and goes in the next minor version: use harness.{name}"
        f" (defined in harness.consumer.consumer)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module("harness.consumer.consumer"), name)
