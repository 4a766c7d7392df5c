"""Arranging dead letters and building feeds for the alert-feed tests."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fake_betterstack import FakeBetterStack, make_client

from alerts.feed import AlertFeed, AlertFeedConfig
from maintenance.runtime.db import Database
from maintenance.runtime.logs import configure_logging


@pytest.fixture(autouse=True)
def fresh_logs() -> Iterator[io.StringIO]:
    """Logs of this test only: an earlier test may have left structlog on a closed capture stream."""
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    yield stream


CONFIG = AlertFeedConfig(
    policy_id="P-new",
    escalation_policy_id="P-esc",
    requester_email="oncall@example.com",
    ops_url_template="https://ops.example/dead-letters?queue={queue}",
)


def add_dead_letters(
    conn: psycopg.Connection,
    queue: str,
    count: int,
    *,
    age: str = "1 hour",
    error: str = "ProviderUnavailable: HTTP 503 from loyalty ledger",
) -> list[int]:
    """Insert ``count`` pending dead letters written ``age`` ago (a second apart); their ids."""
    rows = conn.execute(
        """INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id, created_at)
           SELECT gen_random_uuid(), %s, '{}'::jsonb, 5, %s, 'corr-' || %s || '-' || g,
                  now() - %s::interval - g * interval '1 second'
             FROM generate_series(1, %s) AS g
           RETURNING id""",
        (queue, error, queue, age, count),
    ).fetchall()
    return [r[0] for r in rows]


def handle(conn: psycopg.Connection, ids: list[int]) -> None:
    """Review dead letters: replay them."""
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = ANY(%s)", (ids,))


def make_feed(db: Database, fake: FakeBetterStack | None, config: AlertFeedConfig = CONFIG, **client: Any) -> AlertFeed:
    """A feed on the test database; dry (no client) when ``fake`` is None."""
    return AlertFeed(
        config,
        connect=lambda: db.connect(autocommit=True),
        client=make_client(fake, **client) if fake is not None else None,
    )


def alert_rows(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(
        "SELECT kind, queue, state, incident_id, num_dead_letters, name FROM core.dead_letter_alerts ORDER BY id"
    ).fetchall()


def coverage(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT kind, count(*) FROM core.dead_letter_alert_coverage GROUP BY kind").fetchall())
