"""Every connection pins the session settings it relies on, whatever the database's defaults (issue 9, item 7).

psycopg parses timestamps only in DateStyle ISO and intervals only in IntervalStyle postgres;
a database (or role) default of ``SQL, DMY`` or ``sql_standard`` must not break a job, the
worker or an operator command.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from support.factories import QUEUE, TENANT, add_dead_letter, add_fence, publish
from support.harness_support import points, scalar
from support.logcapture import events_in

import harness.pg
from maintenance.cli import main
from maintenance.errors import EXIT_OK
from maintenance.runtime.db import Database


def set_database_defaults(conn, database_url: str, **settings: str) -> None:
    """ALTER DATABASE … SET for each setting: every later session of that database starts with them."""
    name = sql.Identifier(conninfo_to_dict(database_url)["dbname"])
    for setting, value in settings.items():
        conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(name, sql.Identifier(setting), sql.Literal(value)))


@pytest.fixture
def odd_styles(clean_env, conn, database_url) -> str:
    """This test's database with DateStyle 'SQL, DMY' and IntervalStyle sql_standard by default, set for the CLI."""
    set_database_defaults(conn, database_url, DateStyle="SQL, DMY", IntervalStyle="sql_standard")
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return database_url


def test_run_once_runs_every_job_whatever_the_database_date_and_interval_styles(odd_styles, conn, capsys):
    """With DateStyle 'SQL, DMY' and IntervalStyle sql_standard, run-once purges, alerts and counts: every job ends ok."""
    now = scalar(conn, "SELECT now()")
    add_fence(conn, processed_at=now - timedelta(days=30), expires_at=now - timedelta(days=23))
    add_dead_letter(conn, age="4 days")
    assert main(["run-once"]) == EXIT_OK
    seen = {e["event"]: e for e in events_in(capsys.readouterr().out)}
    assert [seen[f"{p}.stop"]["ok"] for p in ("maintenance.purge", "alerts.feed", "maintenance.metrics")] == [True] * 3
    assert seen["maintenance.purge.stop"]["num_deleted"] == 1
    assert seen["alerts.feed.stop"]["dry_run_incidents"] >= 1
    assert seen["maintenance.metrics.stop"]["dead_letters_pending"] == 1


def test_worker_and_enqueue_work_whatever_the_database_date_and_interval_styles(odd_styles, conn):
    """With DateStyle 'SQL, DMY' and IntervalStyle sql_standard, enqueue publishes and the worker credits one job and dead-letters a poison one."""
    assert (
        main(["enqueue", QUEUE, "--payload", '{"member_id": "m-1", "points": 7}', "--tenant-id", str(TENANT)])
        == EXIT_OK
    )
    publish(conn, {"member_id": "m-2", "points": -1})  # poison: points must be positive
    assert main(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK
    assert points(conn, "m-1") == 7
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_dead_letters_list_works_whatever_the_database_date_and_interval_styles(odd_styles, conn, capsys):
    """With DateStyle 'SQL, DMY' and IntervalStyle sql_standard, dead-letters list prints the letter's UTC time, as text and JSON."""
    add_dead_letter(conn, created_at=datetime(2024, 2, 1, 10, 30, tzinfo=UTC))
    assert main(["dead-letters", "list"]) == EXIT_OK
    assert "2024-02-01 10:30:00" in capsys.readouterr().out
    assert main(["dead-letters", "list", "--json"]) == EXIT_OK
    (row,) = json.loads(capsys.readouterr().out)
    assert datetime.fromisoformat(row["created_at"]) == datetime(2024, 2, 1, 10, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "connect",
    [lambda url: Database(url).connect(), lambda url: harness.pg.connect(url)],
    ids=["maintenance.runtime.db", "harness.pg"],
)
def test_connections_add_a_day_as_24_hours_whatever_the_database_time_zone(conn, database_url, connect):
    """In a database whose TimeZone keeps summer time, timestamptz + 1 day across the change is still 24 hours."""
    set_database_defaults(conn, database_url, TimeZone="Europe/Madrid")  # summer time from 2024-03-31 02:00
    before = datetime(2024, 3, 30, 12, tzinfo=UTC)
    with connect(database_url) as c:
        (after,) = c.execute("SELECT %s::timestamptz + %s", (before, timedelta(days=1))).fetchone()
    assert after - before == timedelta(hours=24)


@pytest.mark.parametrize("autocommit", [False, True])
def test_connect_pins_the_session_and_keeps_the_mode_and_the_url_options(conn, database_url, autocommit):
    """harness.pg.connect pins DateStyle, IntervalStyle and TimeZone, yet returns an idle connection in the mode asked for, the URL's libpq options applied."""
    set_database_defaults(conn, database_url, DateStyle="SQL, DMY", IntervalStyle="sql_standard", TimeZone="Asia/Tokyo")
    url = database_url + ("&" if "?" in database_url else "?") + "options=-c%20lock_timeout%3D1234"
    with harness.pg.connect(url, autocommit=autocommit) as c:
        assert c.autocommit is autocommit and c.info.transaction_status.name == "IDLE"
        shown = [
            c.execute(f"SHOW {name}").fetchone()[0]
            for name in ("DateStyle", "IntervalStyle", "TimeZone", "lock_timeout")
        ]
        assert shown == ["ISO, DMY", "postgres", "UTC", "1234ms"]
