"""How every surface shows a stored JSON value: the value, or — when Python cannot decode it — its text and why.

The connections of the CLI and the API read jsonb without raising (maintenance/runtime/db.py): a
payload, a checkpoint's result or a recorded body nested deeper than Python's recursion limit, or
holding an integer over its 4 300 digits, is read as an
:class:`~harness.queue.port.UndecodablePayload`. A surface shows it as ``<name>: null`` beside
``<name>_undecodable: {"text": <the jsonb as PostgreSQL prints it>, "reason": <why>}``; for every
other value ``<name>_undecodable`` is null and ``<name>`` is what it always was.
"""

from __future__ import annotations

from typing import Any

from harness.queue.port import UndecodablePayload

__all__ = ["UndecodablePayload", "shown"]


def shown(name: str, value: Any) -> dict[str, Any]:
    """``{name: value, name_undecodable: None}``, or ``{name: None, name_undecodable: {text, reason}}``."""
    if isinstance(value, UndecodablePayload):
        return {name: None, f"{name}_undecodable": {"text": value.text, "reason": value.reason}}
    return {name: value, f"{name}_undecodable": None}
