"""Building feeds and reading their rows for the alert-feed tests (dead letters come from factories.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from alerts.feed import AlertFeed
from alerts.settings import AlertsFields
from maintenance.runtime.db import Database
from support.fake_betterstack import TOKEN, FakeBetterStack, make_client


def feed_settings(**fields: Any) -> AlertsFields:
    """The feed's settings of the tests (routing, requester and ops link set), with ``fields`` given."""
    return AlertsFields(
        **{
            "betterstack_policy_id": "P-new",
            "betterstack_escalation_policy_id": "P-esc",
            "betterstack_requester_email": "oncall@example.com",
            "ops_url_template": "https://ops.example/dead-letters?queue={queue}",
        }
        | fields
    )


CONFIG = feed_settings()


def handle(conn: psycopg.Connection, ids: list[int]) -> None:
    """Review dead letters: replay them."""
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = ANY(%s)", (ids,))


def make_feed(db: Database, fake: FakeBetterStack | None, settings: AlertsFields = CONFIG, **client: Any) -> AlertFeed:
    """A feed on the test database; dry (no client) when ``fake`` is None."""
    return AlertFeed(
        settings,
        connect=lambda: db.connect(autocommit=True),
        client=make_client(fake, **client) if fake is not None else None,
    )


def alert_rows(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(
        "SELECT kind, queue, state, incident_id, num_dead_letters, name FROM core.dead_letter_alerts ORDER BY id"
    ).fetchall()


def coverage(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT kind, count(*) FROM core.dead_letter_alert_coverage GROUP BY kind").fetchall())


CRASH_WORKER = Path(__file__).with_name("alerts_crash_worker.py")
CRASH_EXIT = 77


def run_crashing_feed(database_url: str, fake: FakeBetterStack) -> subprocess.CompletedProcess[str]:
    """Run the feed in a process that dies hard right after Better Stack confirmed its first incident."""
    return subprocess.run(
        [sys.executable, str(CRASH_WORKER), database_url, fake.url, TOKEN],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
