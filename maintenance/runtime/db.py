"""Connections to the core-jobs database (psycopg 3), named so they are easy to find in pg_stat_activity.

Opened by ``harness.pg.connect``, which pins DateStyle ISO, IntervalStyle postgres and TimeZone
UTC whatever the database's defaults (its docstring says why).

Every connection opened here — and every API connection (maintenance/api/server.py) — reads
``json``/``jsonb`` with :func:`read_stored_json`: a stored value Python cannot decode (nested
deeper than its recursion limit, an integer over its 4 300 digits: written by SQL or an older
version) becomes an :class:`~harness.queue.port.UndecodablePayload` — its text as stored and why —
instead of an exception, so no stored row can make a list, a detail, a replay or a job fail.
Each surface shows it as such (``payload_undecodable``: docs/api.md, docs/cli.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.abc import AdaptContext
from psycopg.types.json import set_json_loads

from harness.pg import connect, server_now
from harness.queue.port import decode_payload

APPLICATION_NAME = "core-jobs"


class Database:
    """Where the core schema lives. Opens short-lived connections; holds no pool."""

    def __init__(self, conninfo: str, *, application_name: str = APPLICATION_NAME) -> None:
        self.conninfo = conninfo
        self.application_name = application_name

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection:
        conn = connect(self.conninfo, autocommit=autocommit, application_name=self.application_name)
        read_stored_json(conn)
        return conn

    def server_now(self) -> datetime:
        """PostgreSQL's clock, read once per run and passed down to the job."""
        with self.connect(autocommit=True) as conn:
            return server_now(conn)


def read_stored_json(context: AdaptContext) -> None:
    """Read json and jsonb on ``context`` (a connection) with :func:`harness.queue.port.decode_payload`:
    never an exception, an :class:`~harness.queue.port.UndecodablePayload` for what Python cannot read."""
    set_json_loads(_stored_json, context)


def _stored_json(data: bytes | bytearray | memoryview | str) -> Any:
    return decode_payload(data if isinstance(data, str) else bytes(data).decode("utf-8"))
