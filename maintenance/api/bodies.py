"""Request bodies the API can hold: JSON that UTF-8 and PostgreSQL can store, checked once before any route.

Python's JSON parser accepts more than UTF-8 text and PostgreSQL's ``jsonb`` can hold: a lone
surrogate escape (``"\\ud800"``), ``NaN``/``Infinity`` and numbers beyond a double (``1e999``
parses as infinity), and nesting as deep as the body is long. Fields typed as any JSON (a RESUME's
``result``) let these through the models, and they failed later — while the command was
fingerprinted, encoded or stored — as a 500. So :class:`~maintenance.api.app.Guard`
reads every JSON request body (already bounded by ``CORE_JOBS_API_MAX_BODY_BYTES``) and, before
any route runs, refuses with **422** ``invalid-request`` (each place named in ``errors``):

- a string or an object key holding a lone surrogate or a NUL (``\\u0000``: PostgreSQL text
  cannot hold it);
- ``NaN``, ``Infinity``, ``-Infinity`` or a number beyond a double's range;
- nesting deeper than :data:`MAX_JSON_DEPTH` arrays/objects (no request of this API needs more).

A body that is not JSON at all (a syntax error, nesting past the parser's own limit, an integer of
more than 4 300 digits) is left to the route's parser: 400 ``malformed-request``, as before. So no
route sees text it cannot encode or a number it cannot store, whatever its model says.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "body_problems", "is_json"]

MAX_JSON_DEPTH = 64
MAX_PROBLEMS = 50


class _NotFinite:
    """What NaN, Infinity and a number beyond a double's range parse to: refused where it stands."""


NOT_FINITE = _NotFinite()


def _finite(text: str) -> Any:
    number = float(text)
    return number if math.isfinite(number) else NOT_FINITE


def is_json(content_type: bytes | None) -> bool:
    """Whether the route's parser reads a body of this Content-Type as JSON (absent, ``*/json``, ``*/*+json``)."""
    if not content_type:
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media.endswith(b"/json") or media.endswith(b"+json")


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


def _printable(key: str) -> str:
    """A key as a location can show it: lone surrogates escaped, so the answer itself can be encoded."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def body_problems(body: bytes) -> list[tuple[list[str], str]]:
    """``(location, message)`` for each place of a JSON body that cannot be held; [] if none or not JSON at all."""
    try:
        document = json.loads(body, parse_constant=lambda _: NOT_FINITE, parse_float=_finite)
    except (ValueError, RecursionError):  # not JSON: the route's parser answers 400
        return []
    problems: list[tuple[list[str], str]] = []
    stack: list[tuple[Any, list[str]]] = [(document, ["body"])]
    while stack and len(problems) < MAX_PROBLEMS:  # iterative: no recursion on a hostile depth
        value, location = stack.pop()
        if len(location) > MAX_JSON_DEPTH + 1:
            problems.append((location[: MAX_JSON_DEPTH + 1], f"must not nest deeper than {MAX_JSON_DEPTH} levels"))
            continue
        if value is NOT_FINITE:
            problems.append((location, "must be a finite number (no NaN, Infinity or number beyond a double)"))
        elif isinstance(value, str):
            if (message := _text_problem(value)) is not None:
                problems.append((location, message))
        elif isinstance(value, list):
            stack.extend((item, [*location, str(index)]) for index, item in reversed(list(enumerate(value))))
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if (message := _text_problem(key)) is not None:
                    problems.append(([*location, _printable(key)], f"the field name {message}"))
                else:
                    stack.append((item, [*location, key]))
    return problems
