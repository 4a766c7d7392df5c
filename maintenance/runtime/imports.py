"""Importing a library without the optional extras it would load for nothing.

Some libraries import an optional package at their own import whenever it is installed, for a
feature core-jobs never uses: structlog imports ``rich`` (pretty tracebacks; our events render
exceptions as plain text), httpx imports ``click``, ``rich`` and ``pygments`` (its command-line
client). Development tools install them, and they cost more than everything else a
``core-jobs check-config`` imports. :func:`import_without` imports the library with those
packages hidden — ``None`` in ``sys.modules`` makes an import fail as if the package were
absent, which the library expects — then un-hides them, so they stay importable for anything
else. A production install, which has none of them, behaves the same.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

__all__ = ["import_without", "moved_module"]


def import_without(module: str, hidden: tuple[str, ...]) -> ModuleType:
    """``import module`` with the packages ``hidden`` made unimportable for its duration.

    A no-op hiding when ``module`` is already imported (it is returned) or a hidden package is:
    hiding it then would change nothing but break what already uses it.
    """
    if module in sys.modules:
        return sys.modules[module]
    hide = [name for name in hidden if name not in sys.modules]
    for name in hide:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(module)
    finally:
        for name in hide:
            del sys.modules[name]


def moved_module(old: str, new: str) -> None:
    """The deprecation shim at ``old`` warns and becomes the module ``new``, its new home, so every name is the very
    same object; the shim goes in the next minor version. ``new`` is imported by name: a shim adds no dependency
    between the packages (the import contracts see none)."""
    warnings.warn(
        f"{old} is deprecated and goes in the next minor version: import {new}", DeprecationWarning, stacklevel=3
    )
    sys.modules[old] = importlib.import_module(new)
