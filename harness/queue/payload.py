"""The payload codec: what PostgreSQL's jsonb can store and a consumer can read back, checked before a message is
written (:func:`check_payload`, :func:`payload_json`), and a stored payload read back (:func:`decode_payload`). Every
adapter writes payloads through it; docs/harness.md ("The reference queue", Publish) says what is refused and why."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from harness.dead_letters import UndecodablePayload
from harness.queue.fields import InvalidEnvelope

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "InvalidPayload",
    "UndecodablePayload",
    "check_payload",
    "decode_payload",
    "payload_json",
]


class InvalidPayload(InvalidEnvelope):
    """A payload PostgreSQL's jsonb cannot store; the message says where and why (never the value)."""


# A UTF-16 surrogate without its partner: JSON may escape one, jsonb refuses it.
_LONE_SURROGATE = re.compile(r"[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


# Deeper than this, a consumer's decoding and validation would run out of Python's stack (its
# recursion limit is 1 000 frames); a real payload is a few levels deep.
MAX_PAYLOAD_DEPTH = 100
_TOO_DEEP = f"nested deeper than {MAX_PAYLOAD_DEPTH} levels, which a consumer cannot read"
_TOO_LONG = f"an integer of more than {sys.get_int_max_str_digits()} digits, which a consumer cannot read"


def _too_deep(value: Any) -> bool:
    """``value`` nests deeper than :data:`MAX_PAYLOAD_DEPTH` (measured without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > MAX_PAYLOAD_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def decode_payload(text: str) -> Any:
    """The payload stored as jsonb ``text``, or an :class:`UndecodablePayload` saying why it cannot be read."""
    try:
        value = json.loads(text)
    except RecursionError:
        return UndecodablePayload(text, _TOO_DEEP)
    except ValueError as exc:  # an integer over Python's 4 300 digits; text jsonb wrote is otherwise valid JSON
        why = _TOO_LONG if "integer" in str(exc) else f"not valid JSON: {exc}"
        return UndecodablePayload(text, why)
    return UndecodablePayload(text, _TOO_DEEP) if _too_deep(value) else value


def check_payload(payload: Any) -> None:
    """Raise :class:`InvalidPayload` at the first place of ``payload`` that jsonb cannot store, or a consumer could not read."""
    payload_json(payload)


# The fast path of payload_json: json.dumps's text (what psycopg's Jsonb sends), NaN and ±Infinity refused.
_ENCODER = json.JSONEncoder(allow_nan=False)


def payload_json(payload: Any) -> str:
    """``payload``'s JSON text, as ``json.dumps`` writes it, once it passes :func:`check_payload`'s checks.

    A payload that is fine is read once: written to text first (C), and everything :func:`check_payload`
    refuses either stops the writing (a value that is not JSON, NaN, an integer too long, a key of
    another type) or shows in the text — ``\\u0000``, a ``\\ud…`` escape (a surrogate, maybe lone), more
    than :data:`MAX_PAYLOAD_DEPTH` opening brackets (at most that many can never nest deeper). Only
    then is the payload walked, to say where the problem is, or that there is none: a surrogate pair,
    a backslash written before ``u0000`` in a string, brackets inside strings, a NaN key (json writes
    it as the text ``NaN``) are all fine.
    """
    if isinstance(payload, UndecodablePayload):
        raise InvalidPayload(f"payload: {payload.reason}")
    try:
        text = _ENCODER.encode(payload)
    except (TypeError, ValueError, RecursionError):
        return _walked_json(payload)
    if "\\u0000" in text or "\\ud" in text or text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH:
        return _walked_json(payload)
    return text


def _walked_json(payload: Any) -> str:
    """The slow path of :func:`payload_json`: walk ``payload``, raise at its first problem, else write it."""
    if _too_deep(payload):
        raise InvalidPayload(f"payload: {_TOO_DEEP}")
    problem = _jsonb_problem(payload, "payload")
    if problem is not None:
        raise InvalidPayload(problem)
    try:
        return json.dumps(payload)  # NaN allowed: only a key can be one here, which json writes as text
    except (TypeError, ValueError, RecursionError) as exc:  # nothing the walk found, and still not JSON
        raise InvalidPayload(f"payload: not JSON ({type(exc).__name__})") from None


def _jsonb_problem(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return f"{where}: {_TOO_LONG}" if _too_long(value) else None
    if isinstance(value, float):
        return (
            None if math.isfinite(value) else f"{where}: {value!r} is not a finite number (JSON has no NaN or Infinity)"
        )
    if isinstance(value, str):
        return _text_problem(value, where)
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                problem = _text_problem(key, f"{where}: a key")
            elif key is None or isinstance(key, bool | int | float):  # json writes these keys as text
                problem = None
            else:
                problem = f"{where}: a key of type {type(key).__name__} is not JSON"
            problem = problem or _jsonb_problem(item, f"{where}.{key}")
            if problem is not None:
                return problem
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            problem = _jsonb_problem(item, f"{where}[{index}]")
            if problem is not None:
                return problem
        return None
    return f"{where}: a {type(value).__name__} is not JSON"


def _too_long(value: int) -> bool:
    """More digits than Python reads (``sys.get_int_max_str_digits()``): exactly what json.dumps refuses to write."""
    digits = sys.get_int_max_str_digits()
    if not digits or value.bit_length() <= 3 * digits:  # 3 < log2(10): fewer digits than the limit
        return False
    try:
        int.__repr__(value)
    except ValueError:
        return True
    return False


def _text_problem(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where} contains \\u0000, which PostgreSQL cannot store in text"
    if _LONE_SURROGATE.search(text):
        return f"{where} contains a lone UTF-16 surrogate (\\ud800-\\udfff without its pair)"
    return None
