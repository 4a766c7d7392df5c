"""The dead-letter alert feed: real PostgreSQL, and a real local HTTP server as Better Stack (issue 4)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from support.alerts_support import alert_rows, coverage, feed_settings, handle, make_feed
from support.factories import add_dead_letters
from support.fake_betterstack import TOKEN, Fault, body_errors, metadata_values

from alerts.feed import METADATA_KEY, AlertFeedResult, read_installation
from harness.pg import advisory_lock, server_now


def test_one_incident_per_queue_with_what_on_call_needs(db, conn, fake_bs):
    """12 + 3 new dead letters in two queues give two incidents, each with counts, errors, samples and a link."""
    add_dead_letters(conn, "points.credit", 9)
    add_dead_letters(conn, "points.credit", 3, error="PoisonMessage: payload failed schema validation\nTraceback ...")
    add_dead_letters(conn, "notifications.email", 3)
    result = make_feed(db, fake_bs).run_once(server_now(conn))

    assert (result.incidents_posted, result.dead_letters_alerted, result.dead_letters_unalerted) == (2, 15, 0)
    assert result.ok
    bodies = {p.body["name"]: p.body for p in fake_bs.posts()}
    assert set(bodies) == {"12 new dead letters in points.credit", "3 new dead letters in notifications.email"}
    credit = bodies["12 new dead letters in points.credit"]
    assert credit["policy_id"] == "P-new" and credit["requester_email"] == "oncall@example.com"
    assert "9 × ProviderUnavailable: HTTP 503 from loyalty ledger" in credit["description"]
    assert "3 × PoisonMessage: payload failed schema validation" in credit["description"]
    assert "Traceback" not in credit["description"]  # first line of each error only
    assert "corr-points.credit-1" in credit["description"]
    assert "https://ops.example/dead-letters?queue=points.credit" in credit["description"]
    assert "Most frequent error: ProviderUnavailable: HTTP 503 from loyalty ledger (9×)" in credit["summary"]
    assert metadata_values(credit["metadata"], METADATA_KEY)[0].startswith(f"core-jobs:{read_installation(conn)}:new:")
    assert [(k, q, s) for k, q, s, *_ in alert_rows(conn)] == [
        ("new", "points.credit", "open"),
        ("new", "notifications.email", "open"),
    ]
    assert all(row[3] in fake_bs.incidents for row in alert_rows(conn))
    assert coverage(conn) == {"new": 15}


def test_no_second_incident_on_the_next_run(db, conn, fake_bs):
    """A second run over the same dead letters posts nothing."""
    add_dead_letters(conn, "points.credit", 4)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    again = feed.run_once(server_now(conn))
    assert again.incidents_posted == 0 and again.ok
    assert len(fake_bs.posts()) == 1


def test_a_new_dead_letter_after_that_gets_exactly_one_more_incident(db, conn, fake_bs):
    """One dead letter arriving after the first incident gives exactly one more, covering only it."""
    add_dead_letters(conn, "points.credit", 4)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    [late] = add_dead_letters(conn, "points.credit", 1, age="1 minute")
    result = feed.run_once(server_now(conn))
    assert result.incidents_posted == 1 and result.dead_letters_alerted == 1
    assert [p.body["name"] for p in fake_bs.posts()] == [
        "4 new dead letters in points.credit",
        "1 new dead letter in points.credit",
    ]
    assert str(late) in fake_bs.posts()[1].body["description"]


def test_stale_dead_letters_escalate_once_with_the_escalation_policy(db, conn, fake_bs):
    """Two days old: an incident; past three days (PostgreSQL's now moved on): one escalation, then none."""
    add_dead_letters(conn, "points.expire", 2, age="2 days")
    add_dead_letters(conn, "points.expire", 1, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    assert feed.run_once(now).incidents_posted == 1
    later = feed.run_once(now + timedelta(hours=2))  # only the 2-days-23-hours one crossed 3 days
    assert (later.escalations_posted, later.dead_letters_unescalated) == (1, 0)
    escalation = fake_bs.posts()[-1].body
    assert escalation["policy_id"] == "P-esc"
    assert escalation["name"] == "1 dead letter in points.expire unreviewed for over 3 days"
    assert "ESCALATION" in escalation["description"]
    assert feed.run_once(now + timedelta(hours=3)).escalations_posted == 0
    final = feed.run_once(now + timedelta(days=2))
    assert final.escalations_posted == 1 and fake_bs.posts()[-1].body["name"].startswith("2 dead letters")
    assert len(fake_bs.posts()) == 3
    assert coverage(conn) == {"new": 3, "stale": 3}


def test_a_dead_letter_already_stale_when_first_seen_pages_once(db, conn, fake_bs):
    """Unalerted and already stale: one escalation covers it as new and stale; no separate new incident."""
    add_dead_letters(conn, "points.expire", 4, age="5 days")
    result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (result.incidents_posted, result.escalations_posted) == (0, 1)
    assert (result.dead_letters_unalerted, result.dead_letters_unescalated) == (0, 0)
    assert coverage(conn) == {"new": 4, "stale": 4}


def test_resolves_when_every_dead_letter_is_handled(db, conn, fake_bs):
    """The incident stays open while one dead letter is pending, and is resolved once all are handled."""
    ids = add_dead_letters(conn, "points.credit", 3)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    [incident_id] = list(fake_bs.incidents)
    handle(conn, ids[:2])
    assert feed.run_once(server_now(conn)).incidents_resolved == 0
    assert fake_bs.incidents[incident_id]["status"] == "Started"
    conn.execute("UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'dup' WHERE id = %s", (ids[2],))
    result = feed.run_once(server_now(conn))
    assert result.incidents_resolved == 1 and result.ok
    assert fake_bs.incidents[incident_id]["status"] == "Resolved"
    assert fake_bs.incidents[incident_id]["resolved_by"] == "oncall@example.com"
    assert alert_rows(conn)[0][2] == "resolved"
    assert feed.run_once(server_now(conn)).incidents_resolved == 0


def test_already_resolved_409_counts_as_done(db, conn, fake_bs):
    """An incident someone resolved by hand answers 409, and the feed records it resolved without failing."""
    ids = add_dead_letters(conn, "points.credit", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    [incident_id] = list(fake_bs.incidents)
    fake_bs.incidents[incident_id]["status"] = "Resolved"
    handle(conn, ids)
    result = feed.run_once(server_now(conn))
    assert result.incidents_resolved == 1 and result.ok
    assert alert_rows(conn)[0][2] == "resolved"


def test_a_resolve_that_fails_keeps_the_incident_open_until_the_next_run(db, conn, fake_bs):
    """Resolve answers 503 until the retries run out: not ok, still open; the next run resolves it."""
    ids = add_dead_letters(conn, "points.credit", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    handle(conn, ids)
    fake_bs.fail_next("resolve", *[Fault(status=503)] * 4)
    failed = feed.run_once(server_now(conn))
    assert (failed.ok, failed.resolve_failures, failed.incidents_resolved) == (False, 1, 0)
    assert alert_rows(conn)[0][2] == "open"
    retried = feed.run_once(server_now(conn))
    assert (retried.ok, retried.incidents_resolved) == (True, 1)
    assert alert_rows(conn)[0][2] == "resolved"


def test_an_incident_deleted_in_better_stack_is_recorded_gone_and_the_run_moves_on(db, conn, fake_bs, logs):
    """Resolve answers 404 for an incident deleted by hand: the alert ends resolved as 'gone', logged, and runs are ok."""
    ids = add_dead_letters(conn, "points.credit", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    [incident_id] = list(fake_bs.incidents)
    del fake_bs.incidents[incident_id]
    handle(conn, ids)
    result = feed.run_once(server_now(conn))
    assert (result.ok, result.incidents_gone, result.incidents_resolved, result.resolve_failures) == (True, 1, 0, 0)
    assert conn.execute("SELECT state, resolution FROM core.dead_letter_alerts").fetchone() == ("resolved", "gone")
    [gone] = logs.named("alerts.feed.incident_gone")
    assert (gone["incident_id"], gone["queue"]) == (incident_id, "points.credit")
    again = feed.run_once(server_now(conn))
    assert (again.ok, again.incidents_gone, again.resolve_failures) == (True, 0, 0)


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param({"resolve": Fault(status=404), "list": Fault(status=404)}, id="the-list-answers-404-too"),
        pytest.param({"resolve": Fault(status=404)}, id="the-incident-is-still-listed"),
    ],
)
def test_a_404_not_confirmed_by_the_incident_list_is_a_failure_not_gone(db, conn, fake_bs, faults):
    """A 404 on resolve counts as gone only when the incident list answers without it (not with a wrong API
    URL, where everything is 404, nor while the incident is still listed): else the alert stays open."""
    ids = add_dead_letters(conn, "points.credit", 2)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    handle(conn, ids)
    for route, fault in faults.items():
        fake_bs.fail_next(route, fault)
    failed = feed.run_once(server_now(conn))
    assert (failed.ok, failed.incidents_gone, failed.resolve_failures) == (False, 0, 1)
    assert alert_rows(conn)[0][2] == "open"
    assert feed.run_once(server_now(conn)).incidents_resolved == 1


def test_a_storm_is_capped_and_the_rest_folded_into_one_summary(db, conn, fake_bs):
    """Five failing queues with a cap of 3: the two largest get their own, three fold into one summary."""
    for n, queue in enumerate(["q.a", "q.b", "q.c", "q.d", "q.e"]):
        add_dead_letters(conn, queue, 10 - n)
    feed = make_feed(db, fake_bs, feed_settings(alerts_max_incidents_per_run=3))
    result = feed.run_once(server_now(conn))
    names = [p.body["name"] for p in fake_bs.posts()]
    assert names == ["10 new dead letters in q.a", "9 new dead letters in q.b", "21 new dead letters in 3 queues"]
    summary = fake_bs.posts()[2].body["description"]
    assert "8 in q.c: https://ops.example/dead-letters?queue=q.c" in summary and "6 in q.e" in summary
    assert (result.incidents_posted, result.dead_letters_alerted, result.dead_letters_unalerted) == (3, 40, 0)
    assert feed.run_once(server_now(conn)).incidents_posted == 0


def test_dry_run_logs_what_it_would_post_and_records_nothing(db, conn, fake_bs, logs):
    """Without a token nothing is sent or written; setting one later still alerts everything."""
    add_dead_letters(conn, "points.credit", 5)
    add_dead_letters(conn, "points.expire", 2, age="4 days")
    dry = make_feed(db, None).run_once(server_now(conn))
    assert (dry.dry_run, dry.dry_run_incidents, dry.dead_letters_unalerted, dry.ok) == (1, 2, 7, True)
    assert [p.name for p in dry.planned] == [
        "5 new dead letters in points.credit",
        "2 dead letters in points.expire unreviewed for over 3 days",
    ]
    assert '"event": "alerts.feed.dry_run_incident"' in logs.text
    assert '"name": "5 new dead letters in points.credit"' in logs.text
    assert alert_rows(conn) == [] and coverage(conn) == {}
    assert fake_bs.requests == []
    live = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (live.incidents_posted, live.escalations_posted, live.dry_run) == (1, 1, 0)


def test_a_dry_run_says_so_in_a_metric_an_alert_rule_watches(db, conn, fake_bs):
    """core_jobs_alerts_dry_run is 1 after a run without a token (CoreJobsAlertFeedDryRun fires on it), 0 with one."""
    from alerts.feed import SPEC
    from maintenance.service.runner import run_job
    from maintenance.service.telemetry import Telemetry

    add_dead_letters(conn, "points.credit", 2)
    telemetry = Telemetry()
    value = telemetry.registry.get_sample_value
    run_job(SPEC, make_feed(db, None), db, telemetry)
    assert value("core_jobs_alerts_dry_run", {"job_name": "alerts"}) == 1
    run_job(SPEC, make_feed(db, fake_bs), db, telemetry)
    assert value("core_jobs_alerts_dry_run", {"job_name": "alerts"}) == 0


def test_two_runs_at_once_post_one_set_of_incidents(db, conn, fake_bs):
    """A run started while another is mid-POST is skipped; one incident per queue exists afterwards."""
    add_dead_letters(conn, "points.credit", 3)
    add_dead_letters(conn, "notifications.email", 2)
    fake_bs.fail_next("create", Fault(hold=True))
    now = server_now(conn)
    first: list[AlertFeedResult] = []
    runner = threading.Thread(target=lambda: first.append(make_feed(db, fake_bs, timeout=30).run_once(now)))
    runner.start()
    assert fake_bs.arrived.wait(timeout=30)  # the first run is inside its first POST, holding the lock
    second = make_feed(db, fake_bs).run_once(now)
    fake_bs.release.set()
    runner.join(timeout=30)
    assert second.skipped == 1 and second.incidents_posted == 0 and second.ok
    assert first[0].incidents_posted == 2
    assert len(fake_bs.posts()) == 2 and len(fake_bs.incidents) == 2


def test_a_run_is_skipped_while_another_session_holds_the_lock(db, conn, fake_bs):
    """With core_jobs.alerts held elsewhere the run sends nothing and records nothing."""
    add_dead_letters(conn, "points.credit", 3)
    with db.connect(autocommit=True) as other, advisory_lock(other, "core_jobs.alerts") as held:
        assert held
        result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert result.fields() == AlertFeedResult.zero_fields() | {"skipped": 1}
    assert fake_bs.requests == [] and alert_rows(conn) == []


def test_better_stack_down_fails_the_run_and_the_next_run_posts_it(db, conn, fake_bs):
    """503s until the retries run out: nothing recorded as alerted, ok is False; the next run posts both."""
    add_dead_letters(conn, "points.credit", 3)
    add_dead_letters(conn, "notifications.email", 2)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    feed = make_feed(db, fake_bs)
    down = feed.run_once(server_now(conn))
    assert (down.ok, down.incidents_posted, down.post_failures, down.dead_letters_unalerted) == (False, 0, 2, 5)
    assert {row[2] for row in alert_rows(conn)} == {"pending"}
    assert len(fake_bs.posts()) == 4  # the first intent's attempts; the second waits for the next run
    back = feed.run_once(server_now(conn))
    assert (back.ok, back.incidents_posted, back.post_failures, back.dead_letters_unalerted) == (True, 2, 0, 0)
    assert len(fake_bs.incidents) == 2


def test_an_incident_found_by_the_lookup_after_a_retried_post_counts_as_recovered(db, conn, fake_bs, logs):
    """Better Stack created the incident but answered 500; the client's lookup finds it: recovered, not posted."""
    add_dead_letters(conn, "points.credit", 2)
    fake_bs.fail_next("create", Fault(status=500, after_create=True))
    result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (result.incidents_posted, result.incidents_recovered, result.dead_letters_alerted, result.ok) == (
        0,
        1,
        2,
        True,
    )
    assert len(fake_bs.incidents) == 1 and alert_rows(conn)[0][2] == "open"
    events = logs.names()
    assert "alerts.feed.incident_recovered" in events and "alerts.feed.incident_posted" not in events


def alert_states(conn) -> list[tuple]:
    return conn.execute("SELECT kind, state, cancel_reason FROM core.dead_letter_alerts ORDER BY id").fetchall()


def test_an_intent_whose_dead_letters_were_all_handled_meanwhile_is_cancelled_not_posted(db, conn, fake_bs, logs):
    """Better Stack was down; the dead letters were replayed before it came back: no page, the intent is cancelled."""
    ids = add_dead_letters(conn, "points.credit", 3)
    feed = make_feed(db, fake_bs)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    assert feed.run_once(server_now(conn)).post_failures == 1
    handle(conn, ids)
    back = feed.run_once(server_now(conn))
    assert (back.ok, back.intents_cancelled, back.incidents_posted, back.post_failures) == (True, 1, 0, 0)
    assert len(fake_bs.posts()) == 4 and fake_bs.incidents == {}  # only the first run's failed attempts
    assert alert_states(conn) == [("new", "cancelled", "handled")]
    [cancelled] = logs.named("alerts.feed.intent_cancelled")
    assert (cancelled["reason"], cancelled["queue"], cancelled["num_dead_letters"]) == ("handled", "points.credit", 3)
    assert feed.run_once(server_now(conn)).intents_cancelled == 0


def test_an_earlier_intent_that_reached_better_stack_is_recovered_and_resolved_not_cancelled(db, conn, fake_bs):
    """The POST created the incident but no answer got back; once its dead letters are handled the next run finds
    it by its key and resolves it, instead of cancelling the intent and leaving the incident open."""
    ids = add_dead_letters(conn, "points.credit", 2)
    feed = make_feed(db, fake_bs)
    fake_bs.fail_next("create", Fault(status=503, after_create=True))
    fake_bs.fail_next("list", *[Fault(status=503)] * 4)
    assert feed.run_once(server_now(conn)).post_failures == 1
    handle(conn, ids)
    back = feed.run_once(server_now(conn))
    assert (back.ok, back.incidents_recovered, back.incidents_resolved, back.intents_cancelled) == (True, 1, 1, 0)
    assert [i["status"] for i in fake_bs.incidents.values()] == ["Resolved"]
    assert alert_states(conn) == [("new", "resolved", None)]


def test_a_pending_new_intent_whose_dead_letter_turned_stale_is_paged_once_by_the_escalation(db, conn, fake_bs):
    """The new incident never went out and its dead letter is now stale: only the escalation is posted."""
    add_dead_letters(conn, "points.expire", 1, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    assert feed.run_once(now).post_failures == 1
    later = feed.run_once(now + timedelta(hours=2))
    assert (later.ok, later.escalations_posted, later.incidents_posted, later.intents_cancelled) == (True, 1, 0, 1)
    assert [p.body["name"] for p in fake_bs.posts()[4:]] == [
        "1 dead letter in points.expire unreviewed for over 3 days"
    ]
    assert (later.dead_letters_unalerted, later.dead_letters_unescalated) == (0, 0)
    assert alert_states(conn) == [("new", "cancelled", "superseded"), ("stale", "open", None)]
    assert coverage(conn) == {"new": 1, "stale": 1}


def test_a_partly_stale_pending_intent_pages_each_dead_letter_once(db, conn, fake_bs):
    """Of an unposted new intent, the dead letter now stale is paged by the escalation and the still fresh one by a
    new incident of its own: one page each, none left out."""
    [old] = add_dead_letters(conn, "points.expire", 1, age="2 days 23 hours")
    [fresh] = add_dead_letters(conn, "points.expire", 1, age="1 hour")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    assert feed.run_once(now).post_failures == 1
    later = feed.run_once(now + timedelta(hours=2))
    assert (later.ok, later.escalations_posted, later.incidents_posted, later.intents_cancelled) == (True, 1, 1, 1)
    posted = {p.body["name"]: p.body["description"] for p in fake_bs.posts()[4:]}
    assert set(posted) == {
        "1 dead letter in points.expire unreviewed for over 3 days",
        "1 new dead letter in points.expire",
    }
    assert f"Dead letter ids {old}–{old} (1)" in posted["1 dead letter in points.expire unreviewed for over 3 days"]
    assert f"Dead letter ids {fresh}–{fresh} (1)" in posted["1 new dead letter in points.expire"]
    assert (later.dead_letters_unalerted, later.dead_letters_unescalated) == (0, 0)
    assert coverage(conn) == {"new": 2, "stale": 1}


def test_a_superseded_intent_settled_a_run_late_leaves_its_dead_letter_to_the_posted_escalation(db, conn, fake_bs):
    """The new intent's lookup failed (400) in the run that posted the escalation; the next run cancels it and the
    escalation covers the dead letter as new too: one page, nothing unalerted."""
    add_dead_letters(conn, "points.expire", 1, age="2 days 23 hours")
    feed = make_feed(db, fake_bs)
    now = server_now(conn)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    feed.run_once(now)
    fake_bs.fail_next("list", Fault(status=400))
    escalated = feed.run_once(now + timedelta(hours=2))
    assert (escalated.escalations_posted, escalated.intents_cancelled, escalated.post_failures) == (1, 0, 1)
    settled = feed.run_once(now + timedelta(hours=3))
    assert (settled.ok, settled.intents_cancelled, settled.incidents_posted, settled.dead_letters_unalerted) == (
        True,
        1,
        0,
        0,
    )
    assert [p.body["name"] for p in fake_bs.posts()[4:]] == [
        "1 dead letter in points.expire unreviewed for over 3 days"
    ]
    assert alert_states(conn) == [("new", "cancelled", "superseded"), ("stale", "open", None)]
    assert conn.execute(
        "SELECT c.kind, a.kind FROM core.dead_letter_alert_coverage AS c"
        " JOIN core.dead_letter_alerts AS a ON a.id = c.alert_id ORDER BY c.kind"
    ).fetchall() == [("new", "stale"), ("stale", "stale")]


def test_a_refused_incident_does_not_block_the_others(db, conn, fake_bs):
    """A 422 for one incident leaves it pending and failing the run, while the other queue is posted."""
    add_dead_letters(conn, "points.credit", 3)
    add_dead_letters(conn, "notifications.email", 2)
    fake_bs.fail_next("create", Fault(status=422))
    result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (result.incidents_posted, result.post_failures, result.ok) == (1, 1, False)
    assert sorted(row[2] for row in alert_rows(conn)) == ["open", "pending"]


def test_token_absent_from_the_logs_of_a_troubled_run(db, conn, fake_bs, logs):
    """Retries, a failure and a success later, the captured logs never contain the API token."""
    add_dead_letters(conn, "points.credit", 3)
    fake_bs.fail_next("create", Fault(status=500), *[Fault(status=429, headers={"Retry-After": "3"})] * 3)
    feed = make_feed(db, fake_bs)
    feed.run_once(server_now(conn))
    feed.run_once(server_now(conn))
    logged = logs.text
    assert "alerts.betterstack.retry" in logged and "alerts.feed.post_failed" in logged
    assert "alerts.feed.incident_posted" in logged
    assert TOKEN not in logged


@pytest.mark.parametrize("field", list(AlertFeedResult.zero_fields()))
def test_result_fields_are_numbers_with_fixed_keys(field):
    """Every result field is a number, so the metrics exporter can export each of them."""
    assert isinstance(AlertFeedResult.zero_fields()[field], int)


def test_every_incident_body_is_what_the_v3_documentation_defines_with_todays_channels(db, conn, fake_bs):
    """A new incident and an escalation each carry only documented, well-typed create parameters (no
    `push`, metadata as typed values), and by default email only: no call, SMS or critical alert."""
    add_dead_letters(conn, "points.credit", 2)
    add_dead_letters(conn, "points.expire", 1, age="5 days")
    result = make_feed(db, fake_bs).run_once(server_now(conn))
    assert (result.incidents_posted, result.escalations_posted) == (1, 1)
    for post in fake_bs.posts():
        assert body_errors(post.body) == []
        assert {k: post.body[k] for k in ("call", "sms", "email", "critical_alert")} == {
            "call": False,
            "sms": False,
            "email": True,
            "critical_alert": False,
        }


def test_an_escalation_can_ask_for_a_phone_call_while_new_incidents_do_not(db, conn, fake_bs):
    """Channels are per kind: escalation call + critical alert, new incidents SMS without email."""
    config = feed_settings(
        betterstack_incident_sms=True,
        betterstack_incident_email=False,
        betterstack_escalation_call=True,
        betterstack_escalation_critical_alert=True,
    )
    add_dead_letters(conn, "points.credit", 2)
    add_dead_letters(conn, "points.expire", 1, age="5 days")
    make_feed(db, fake_bs, config).run_once(server_now(conn))
    channels = {
        "ESCALATION" in p.body["description"]: tuple(p.body[k] for k in ("call", "sms", "email", "critical_alert"))
        for p in fake_bs.posts()
    }
    assert channels == {False: (False, True, False, False), True: (True, False, True, True)}


def test_a_long_run_reports_progress_at_info_every_interval(db, conn, fake_bs, logs):
    """A clock ticking 2 s per reading and a 5 s interval: alerts.feed.progress at info with items done,
    total, rate and estimate left while 6 incidents are posted, not after every one."""
    for n in range(6):
        add_dead_letters(conn, f"queue.{n}", 1)
    ticks = iter(range(0, 1000, 2))
    feed = make_feed(db, fake_bs, feed_settings(alerts_progress_interval=timedelta(seconds=5)))
    feed.monotonic = lambda: float(next(ticks))
    assert feed.run_once(server_now(conn)).incidents_posted == 6
    progress = logs.named("alerts.feed.progress")
    assert 1 <= len(progress) < 6
    first = progress[0]
    assert first["level"] == "info" and first["step"] == "post" and first["items_total"] == 6
    assert first["items_done"] == 3 and first["elapsed_s"] == 6.0 and first["rate"] == 0.5
    assert first["estimate_left_s"] == 6.0
