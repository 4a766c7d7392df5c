"""Keyset pages: one more row than asked tells whether a next page exists (operations, execution views).

A page statement orders by ``(<timestamp>, id)``, continues strictly after the previous page's
last row and ends in ``LIMIT %(limit)s``. It is executed unprepared, so each absent filter
folds away in a custom plan (never a generic one that would read the whole table).
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row

T = TypeVar("T")


def fetch_page(
    conn: psycopg.Connection, row_type: type[T], statement: str, params: dict[str, Any], limit: int
) -> tuple[list[T], bool]:
    """Up to ``limit`` (at least 1) rows of ``statement`` as ``row_type``, and whether more follow."""
    with conn.cursor(row_factory=class_row(row_type)) as cur:
        rows = cur.execute(statement, {**params, "limit": limit + 1}, prepare=False).fetchall()
    return rows[:limit], len(rows) > limit
