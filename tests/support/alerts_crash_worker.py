"""Runs the alert feed once and dies hard (``os._exit``, no cleanup) right after Better Stack
confirmed the first incident and before the feed recorded it: the crash of issue 4's tests.

Usage: python alerts_crash_worker.py DATABASE_URL API_URL TOKEN
"""

from __future__ import annotations

import os
import sys

import psycopg

from alerts import feed as feed_module
from alerts.betterstack import BetterStackClient
from alerts.feed import AlertFeed
from alerts.settings import AlertsFields
from harness.pg import server_now

CRASH_EXIT = 77


def die_before_recording(*_args: object, **_kwargs: object) -> None:
    os._exit(CRASH_EXIT)


def main(database_url: str, api_url: str, token: str) -> None:
    feed_module.record_posted = die_before_recording
    feed = AlertFeed(
        AlertsFields(),
        connect=lambda: psycopg.connect(database_url, autocommit=True),
        client=BetterStackClient(api_url, token, sleep=lambda _s: None),
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        now = server_now(conn)
    feed.run_once(now)
    sys.exit("the crash did not happen")


if __name__ == "__main__":
    main(*sys.argv[1:4])
