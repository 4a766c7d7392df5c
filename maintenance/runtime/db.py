"""Connections to the core-jobs database (psycopg 3), named so they are easy to find in pg_stat_activity.

Opened by ``harness.pg.connect``, which pins DateStyle ISO, IntervalStyle postgres and TimeZone
UTC whatever the database's defaults (its docstring says why).
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from harness.pg import connect, server_now

APPLICATION_NAME = "core-jobs"


class Database:
    """Where the core schema lives. Opens short-lived connections; holds no pool."""

    def __init__(self, conninfo: str, *, application_name: str = APPLICATION_NAME) -> None:
        self.conninfo = conninfo
        self.application_name = application_name

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection:
        return connect(self.conninfo, autocommit=autocommit, application_name=self.application_name)

    def server_now(self) -> datetime:
        """PostgreSQL's clock, read once per run and passed down to the job."""
        with self.connect(autocommit=True) as conn:
            return server_now(conn)
