"""Exactly once across a crash between Better Stack's confirmation and the record (issue 4, point 4)."""

from __future__ import annotations

from support.alerts_support import CRASH_EXIT, alert_rows, make_feed, run_crashing_feed
from support.factories import add_dead_letters

from harness.pg import server_now


def test_a_crash_after_the_post_is_recovered_by_metadata_without_a_duplicate(db, database_url, conn, fake_bs):
    """A worker dies right after the first 201; the next run finds that incident by its key and posts only the other."""
    add_dead_letters(conn, "points.credit", 3)
    add_dead_letters(conn, "notifications.email", 2)
    crashed = run_crashing_feed(database_url, fake_bs)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    [posted_before_crash] = list(fake_bs.incidents)
    assert [row[2] for row in alert_rows(conn)] == ["pending", "pending"]  # intents, nothing confirmed

    result = make_feed(db, fake_bs).run_once(server_now(conn))  # the lock died with the worker's session

    assert (result.incidents_recovered, result.incidents_posted, result.post_failures) == (1, 1, 0)
    assert len(fake_bs.posts()) == 2 and len(fake_bs.incidents) == 2
    rows = alert_rows(conn)
    assert [row[2] for row in rows] == ["open", "open"]
    assert rows[0][3] == posted_before_crash
    assert make_feed(db, fake_bs).run_once(server_now(conn)).incidents_posted == 0
