"""The alert feed pages RECONCILIATION_REQUIRED executions (issue 12): one incident per consumer,
exactly once per episode, escalated when left unresolved, resolved once they are resolved.

Real PostgreSQL and the stateful fake Better Stack (a real local HTTP server)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from support.alerts_support import CRASH_EXIT, alert_rows, feed_settings, make_feed, run_crashing_feed
from support.factories import add_dead_letters, add_execution, make_uncertain_again, resolve_execution
from support.fake_betterstack import Fault, metadata_values

from alerts.feed import METADATA_KEY, read_installation
from harness.pg import server_now
from maintenance.runtime import migrate


def execution_coverage(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT kind, count(*) FROM core.execution_alert_coverage GROUP BY kind").fetchall())


def uncertain(conn: psycopg.Connection, consumer: str, count: int, **options: object) -> list[int]:
    return [add_execution(conn, consumer=consumer, queue=consumer, **options) for _ in range(count)]


def test_one_incident_per_consumer_for_several_uncertain_executions(db, conn, fake_bs):
    """3 + 2 uncertain executions of two consumers give two incidents with reasons and samples; other states none."""
    uncertain(conn, "points.ledger", 2)
    uncertain(conn, "points.ledger", 1, reason="attempts exhausted", reason_action="credit")
    uncertain(conn, "payments.charge", 2)
    add_execution(conn, status="FAILED", consumer="points.ledger")
    add_execution(conn, status="RETRY_WAIT", consumer="points.ledger")

    result = make_feed(db, fake_bs).run_once(server_now(conn))

    assert (result.incidents_posted, result.executions_alerted, result.executions_unalerted, result.ok) == (
        2,
        5,
        0,
        True,
    )
    assert result.dead_letters_alerted == 0
    bodies = {p.body["name"]: p.body for p in fake_bs.posts()}
    assert set(bodies) == {
        "3 executions of points.ledger need reconciliation",
        "2 executions of payments.charge need reconciliation",
    }
    ledger = bodies["3 executions of points.ledger need reconciliation"]
    assert ledger["policy_id"] == "P-new"
    assert "2 × notify: the worker was lost while the request may have been sent" in ledger["description"]
    assert "1 × credit: attempts exhausted" in ledger["description"]
    assert "corr-" in ledger["description"] and "/v1/core/executions/{id}/resolve" in ledger["description"]
    assert metadata_values(ledger["metadata"], "core_jobs_kind") == ["reconciliation_required"]
    assert metadata_values(ledger["metadata"], "consumer") == ["points.ledger"]
    assert metadata_values(ledger["metadata"], "executions") == ["3"]
    assert metadata_values(ledger["metadata"], METADATA_KEY)[0].startswith(
        f"core-jobs:{read_installation(conn)}:reconciliation:"
    )
    assert sorted((k, q, s, n) for k, q, s, _, n, _ in alert_rows(conn)) == [
        ("reconciliation", "payments.charge", "open", 2),
        ("reconciliation", "points.ledger", "open", 3),
    ]
    assert execution_coverage(conn) == {"reconciliation": 5}


def test_no_execution_is_paged_twice_across_runs(db, conn, fake_bs):
    """A second run posts nothing; one more uncertain execution later gets exactly one incident, covering only it."""
    uncertain(conn, "points.ledger", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    assert feed.run_once(server_now(conn)).incidents_posted == 0
    [late] = uncertain(conn, "points.ledger", 1)
    result = feed.run_once(server_now(conn))
    assert (result.incidents_posted, result.executions_alerted) == (1, 1)
    assert [p.body["name"] for p in fake_bs.posts()] == [
        "2 executions of points.ledger need reconciliation",
        "1 execution of points.ledger needs reconciliation",
    ]
    assert f"Execution ids {late}–{late} (1)" in fake_bs.posts()[1].body["description"]


def test_dead_letters_and_executions_are_paged_and_resolved_apart(db, conn, fake_bs):
    """A dead letter and an uncertain execution give two incidents; handling the dead letter resolves only its own."""
    [letter] = add_dead_letters(conn, "points.credit", 1)
    uncertain(conn, "points.ledger", 1)
    feed = make_feed(db, fake_bs)
    first = feed.run_once(server_now(conn))
    assert (first.incidents_posted, first.dead_letters_alerted, first.executions_alerted) == (2, 1, 1)
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter,))
    assert feed.run_once(server_now(conn)).incidents_resolved == 1
    assert sorted((k, s) for k, _, s, *_ in alert_rows(conn)) == [("new", "resolved"), ("reconciliation", "open")]


def test_executions_left_unresolved_past_stale_after_escalate_once(db, conn, fake_bs):
    """Uncertain for 2 days 23 hours: an incident; 2 hours later (past 3 days): one escalation on P-esc; then none."""
    uncertain(conn, "points.ledger", 2, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    assert feed.run_once(now).incidents_posted == 1
    later = feed.run_once(now + timedelta(hours=2))
    assert (later.escalations_posted, later.executions_unescalated, later.executions_unalerted) == (1, 0, 0)
    escalation = fake_bs.posts()[-1].body
    assert escalation["name"] == "2 executions of points.ledger unresolved for over 3 days"
    assert escalation["policy_id"] == "P-esc" and escalation["description"].startswith("ESCALATION: ")
    assert metadata_values(escalation["metadata"], "core_jobs_kind") == ["reconciliation_escalation"]
    assert feed.run_once(now + timedelta(hours=3)).escalations_posted == 0
    assert execution_coverage(conn) == {"reconciliation": 2, "reconciliation_stale": 2}


def test_an_execution_already_stale_when_first_seen_pages_once(db, conn, fake_bs):
    """Uncertain for 4 days before the first run: the escalation alone pages it, and covers it as new too."""
    uncertain(conn, "points.ledger", 1, age="4 days")
    result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (result.incidents_posted, result.escalations_posted, result.executions_unalerted) == (0, 1, 0)
    assert execution_coverage(conn) == {"reconciliation": 1, "reconciliation_stale": 1}


def test_the_incident_resolves_once_every_execution_it_covers_is_resolved(db, conn, fake_bs):
    """Open while one of its two executions is still uncertain; resolved when the other is closed too."""
    first, second = uncertain(conn, "points.ledger", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    [incident_id] = list(fake_bs.incidents)
    resolve_execution(conn, first, "PENDING")  # RESUME
    assert feed.run_once(server_now(conn)).incidents_resolved == 0
    assert fake_bs.incidents[incident_id]["status"] == "Started"
    resolve_execution(conn, second, "FAILED")  # CLOSE_WITHOUT_TRANSITION
    result = feed.run_once(server_now(conn))
    assert result.incidents_resolved == 1 and result.ok
    assert fake_bs.incidents[incident_id]["status"] == "Resolved"
    assert alert_rows(conn)[0][2] == "resolved"


def test_once_none_of_a_consumers_executions_is_uncertain_all_its_incidents_are_resolved(db, conn, fake_bs):
    """Two incidents of one consumer (two runs), its escalation too: resolving every execution resolves all three."""
    early = uncertain(conn, "points.ledger", 1, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    feed.run_once(now)
    late = uncertain(conn, "points.ledger", 1)
    feed.run_once(now)
    feed.run_once(now + timedelta(hours=2))  # the early one escalates
    assert [s for _, _, s, *_ in alert_rows(conn)] == ["open", "open", "open"]
    for execution_id in early + late:
        resolve_execution(conn, execution_id)
    assert feed.run_once(now + timedelta(hours=2)).incidents_resolved == 3
    assert fake_bs.open_incidents() == []


def test_an_execution_uncertain_again_after_its_resolution_pages_again_once(db, conn, fake_bs):
    """Resolved (RESUME), taken again and uncertain again: a new episode, one new incident, then none."""
    [execution_id] = uncertain(conn, "points.ledger", 1)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    resolve_execution(conn, execution_id)
    assert feed.run_once(server_now(conn)).incidents_resolved == 1
    make_uncertain_again(conn, execution_id)
    again = feed.run_once(server_now(conn))
    assert (again.incidents_posted, again.executions_alerted) == (1, 1)
    assert feed.run_once(server_now(conn)).incidents_posted == 0
    keys = [metadata_values(p.body["metadata"], METADATA_KEY)[0] for p in fake_bs.posts()]
    assert len(keys) == 2 and keys[0] != keys[1]  # same execution id, another episode: another key
    assert execution_coverage(conn) == {"reconciliation": 2}


def test_an_intent_whose_executions_were_all_resolved_meanwhile_is_cancelled_not_posted(db, conn, fake_bs):
    """Better Stack was down; the executions were resolved before it came back: no page, the intent is cancelled."""
    ids = uncertain(conn, "points.ledger", 2)
    feed = make_feed(db, fake_bs)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    down = feed.run_once(server_now(conn))
    assert (down.ok, down.post_failures, down.executions_unalerted) == (False, 1, 2)
    for execution_id in ids:
        resolve_execution(conn, execution_id)
    back = feed.run_once(server_now(conn))
    assert (back.ok, back.intents_cancelled, back.incidents_posted) == (True, 1, 0)
    assert fake_bs.incidents == {}
    assert conn.execute("SELECT state, cancel_reason FROM core.dead_letter_alerts").fetchall() == [
        ("cancelled", "handled")
    ]


def test_a_pending_intent_whose_execution_turned_stale_is_paged_once_by_the_escalation(db, conn, fake_bs):
    """An intent left pending past stale_after is superseded: the escalation pages the execution, once."""
    uncertain(conn, "points.ledger", 1, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    assert feed.run_once(now).post_failures == 1
    later = feed.run_once(now + timedelta(hours=2))
    assert (later.intents_cancelled, later.incidents_posted, later.escalations_posted) == (1, 0, 1)
    assert (later.executions_unalerted, later.executions_unescalated) == (0, 0)
    assert len(fake_bs.incidents) == 1


def test_a_crash_after_the_post_is_recovered_by_metadata_without_a_duplicate(db, database_url, conn, fake_bs):
    """A feed dies hard right after the first 201; the next run finds that incident by its key, posts only the other."""
    uncertain(conn, "points.ledger", 2)
    uncertain(conn, "payments.charge", 1)
    crashed = run_crashing_feed(database_url, fake_bs)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    [posted_before_crash] = list(fake_bs.incidents)
    assert [row[2] for row in alert_rows(conn)] == ["pending", "pending"]

    result = make_feed(db, fake_bs).run_once(server_now(conn))

    assert (result.incidents_recovered, result.incidents_posted, result.post_failures) == (1, 1, 0)
    assert len(fake_bs.posts()) == 2 and len(fake_bs.incidents) == 2
    assert posted_before_crash in {row[3] for row in alert_rows(conn)}
    assert make_feed(db, fake_bs).run_once(server_now(conn)).incidents_posted == 0
    assert result.executions_alerted == 3


def test_dry_run_lists_the_execution_incidents_and_records_nothing(db, conn, logs):
    """Without a token the run logs the incident it would post and writes no alert nor coverage."""
    uncertain(conn, "points.ledger", 2)
    result = make_feed(db, None).run_once(server_now(conn))
    assert result.dry_run_incidents == 1
    [planned] = logs.named("alerts.feed.dry_run_incident")
    assert planned["name"] == "2 executions of points.ledger need reconciliation"
    assert alert_rows(conn) == [] and execution_coverage(conn) == {}


def test_coverage_of_an_execution_by_a_dead_letter_alert_is_refused(conn):
    """The database refuses a coverage row whose kind does not fit its alert, in both coverage tables."""
    [letter_alert] = conn.execute(
        "INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, name, summary, description, num_dead_letters)"
        " VALUES ('k1', 'new', 'q', 'n', 's', 'd', 1) RETURNING id"
    ).fetchone()
    [execution_alert] = conn.execute(
        "INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, name, summary, description, num_dead_letters)"
        " VALUES ('k2', 'reconciliation', 'c', 'n', 's', 'd', 1) RETURNING id"
    ).fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot be covered as reconciliation"):
        conn.execute(
            "INSERT INTO core.execution_alert_coverage VALUES (1, now(), 'reconciliation', %s)", (letter_alert,)
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot be covered as reconciliation_stale"):
        conn.execute(
            "INSERT INTO core.execution_alert_coverage VALUES (1, now(), 'reconciliation_stale', %s)",
            (execution_alert,),
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="it is an execution alert"):
        conn.execute("INSERT INTO core.dead_letter_alert_coverage VALUES (1, 'new', %s)", (execution_alert,))


def test_execution_coverage_is_append_only(conn):
    """A coverage row of an alert that is not cancelled can be neither changed nor deleted."""
    [alert] = conn.execute(
        "INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, name, summary, description, num_dead_letters)"
        " VALUES ('k', 'reconciliation', 'c', 'n', 's', 'd', 1) RETURNING id"
    ).fetchone()
    conn.execute("INSERT INTO core.execution_alert_coverage VALUES (1, now(), 'reconciliation', %s)", (alert,))
    for statement in (
        "UPDATE core.execution_alert_coverage SET execution_id = 2",
        "DELETE FROM core.execution_alert_coverage",
    ):
        with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
            conn.execute(statement)


def test_a_storm_of_consumers_is_folded_into_one_summary_paged_once(db, conn, fake_bs):
    """With one incident per run and kind, 2 + 1 executions of two consumers fold into one summary, paged once."""
    ids = uncertain(conn, "points.ledger", 2) + uncertain(conn, "payments.charge", 1)
    feed = make_feed(db, fake_bs, feed_settings(alerts_max_incidents_per_run=1))
    result = feed.run_once(server_now(conn))
    assert (result.incidents_posted, result.executions_alerted) == (1, 3)
    [summary] = fake_bs.posts()
    assert summary.body["name"] == "3 executions in 2 consumers need reconciliation"
    assert "  2 of points.ledger\n  1 of payments.charge" in summary.body["description"]
    assert metadata_values(summary.body["metadata"], "consumer") == ["(several)"]
    assert feed.run_once(server_now(conn)).incidents_posted == 0
    for execution_id in ids:
        resolve_execution(conn, execution_id, "FAILED")
    assert feed.run_once(server_now(conn)).incidents_resolved == 1


def test_downgrading_0011_removes_the_execution_alerts_and_keeps_the_dead_letter_ones(db, database_url, conn, fake_bs):
    """Back at 0010 the old kinds hold again: execution alerts and their coverage go, dead-letter alerts stay."""
    add_dead_letters(conn, "points.credit", 1)
    uncertain(conn, "points.ledger", 1)
    make_feed(db, fake_bs).run_once(server_now(conn))
    migrate.downgrade(database_url, "0010_durable_actions")
    assert [k for k, *_ in alert_rows(conn)] == ["new"]
    assert conn.execute("SELECT to_regclass('core.execution_alert_coverage')").fetchone() == (None,)
    migrate.upgrade(database_url)
    assert make_feed(db, fake_bs).run_once(server_now(conn)).executions_alerted == 1  # paged again, once
