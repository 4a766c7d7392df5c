"""The conventions every list endpoint of the operations API follows: keyset cursors and known parameters.

- A **cursor** is opaque to the client: base64url of the last row's ``(timestamp, id)`` and a
  digest of the list's filters. The next page reads strictly after that position, so pages are
  keyset pages (page 100 costs what page 1 costs; a row written meanwhile neither repeats nor
  skips a row). A cursor that is not one of ours is 400; one used with other filters is 400
  saying so.
- A page (or any read's answer) is serialised once, by :func:`as_json`.
- A query parameter the endpoint does not know is 400 naming it and the known ones (a typo in
  a filter must not silently list everything).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from maintenance.api.problems import Problem

MAX_ID = 2**63 - 1


def _filter_digest(where: Any) -> str:
    return hashlib.sha256(json.dumps(where.__dict__, sort_keys=True, default=str).encode()).hexdigest()[:16]


def encode_position(at: datetime, row_id: int, where: Any) -> str:
    """The cursor of a page that ended at ``(at, row_id)`` of the list filtered by ``where`` (a dataclass)."""
    raw = json.dumps({"t": at.isoformat(), "i": row_id, "f": _filter_digest(where)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_position(cursor: str, where: Any) -> tuple[datetime, int]:
    """The ``(timestamp, id)`` a cursor encodes; 400 when it is not one of ours or belongs to other filters."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        at, row_id, digest = datetime.fromisoformat(data["t"]), int(data["i"]), data["f"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError):
        raise Problem(400, "malformed-request", "cursor is not a cursor this API returned") from None
    if at.tzinfo is None or not 0 < row_id <= MAX_ID:
        raise Problem(400, "malformed-request", "cursor is not a cursor this API returned")
    if digest != _filter_digest(where):
        raise Problem(
            400,
            "malformed-request",
            "cursor belongs to a list with other filters: "
            "keep the filters of the first page, or start again without a cursor",
        )
    return at, row_id


def refuse_unknown_parameters(request: Request, known: Iterable[str]) -> None:
    """400 naming every query parameter of ``request`` that is not in ``known``."""
    known = frozenset(known)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise Problem(
            400,
            "malformed-request",
            f"unknown query parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}",
        )


def as_json(model: BaseModel) -> Response:
    """The model as JSON, serialised once (a response_model would validate it a second time)."""
    return Response(model.model_dump_json(), media_type="application/json")
