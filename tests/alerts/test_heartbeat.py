"""The Better Stack heartbeat after `core-jobs run-once` (issue 4, point 6)."""

from __future__ import annotations

import socket

from support.factories import add_dead_letters
from support.fake_betterstack import TOKEN, Fault

from alerts.heartbeat import send_heartbeat
from maintenance.cli import main
from maintenance.errors import EXIT_FAILED, EXIT_OK

HEARTBEAT_TOKEN = "hb-secret-0123456789"


def test_success_pings_the_heartbeat_with_a_short_body(fake_bs):
    """All jobs ok: one POST to the heartbeat URL itself, saying which jobs ran."""
    assert send_heartbeat(fake_bs.heartbeat_url(), ran_jobs=["purge", "alerts"], failed_jobs=[]) is True
    [ping] = fake_bs.heartbeats
    assert ping.path == f"/api/v1/heartbeat/{HEARTBEAT_TOKEN}"
    assert ping.body == "core-jobs run-once: ok (purge, alerts)"


def test_failure_pings_the_fail_form_naming_the_failed_jobs(fake_bs):
    """A failed job: the ping goes to <url>/fail with a body naming it."""
    assert send_heartbeat(fake_bs.heartbeat_url(), ran_jobs=["purge", "alerts"], failed_jobs=["alerts"]) is True
    [ping] = fake_bs.heartbeats
    assert ping.path == f"/api/v1/heartbeat/{HEARTBEAT_TOKEN}/fail"
    assert ping.body == "core-jobs run-once: 1 of 2 jobs failed: alerts"


def test_a_failed_ping_is_logged_without_the_heartbeat_token(fake_bs, logs):
    """A 500 from the heartbeat endpoint returns False and logs alerts.heartbeat.failed, token masked."""
    fake_bs.fail_next("heartbeat", Fault(status=500))
    assert send_heartbeat(fake_bs.heartbeat_url(), ran_jobs=["alerts"], failed_jobs=[]) is False
    assert "alerts.heartbeat.failed" in logs.text and "HTTP 500" in logs.text
    assert HEARTBEAT_TOKEN not in logs.text


def test_an_unreachable_heartbeat_does_not_raise(logs):
    """Nothing listening on the port: the ping returns False instead of raising, token not logged."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api/v1/heartbeat/{HEARTBEAT_TOKEN}"
    assert send_heartbeat(url, ran_jobs=["alerts"], failed_jobs=["alerts"], timeout=2) is False
    assert "ConnectError" in logs.text and HEARTBEAT_TOKEN not in logs.text


def test_run_once_pings_after_a_successful_run(clean_env, database_url, fake_bs):
    """`core-jobs run-once alerts` (dry, no token) exits 0 and pings the heartbeat once."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", fake_bs.heartbeat_url())
    assert main(["run-once", "alerts"]) == EXIT_OK
    assert [p.path for p in fake_bs.heartbeats] == [f"/api/v1/heartbeat/{HEARTBEAT_TOKEN}"]


def test_run_once_pings_fail_when_the_feed_cannot_post(clean_env, database_url, conn, fake_bs, capsys):
    """Better Stack refuses the token: exit 1, and the /fail ping names the alerts job; no token in the output."""
    add_dead_letters(conn, "points.credit", 2)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_URL", fake_bs.url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", "wrong-token-abcdef")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", fake_bs.heartbeat_url())
    assert main(["run-once", "alerts"]) == EXIT_FAILED
    [ping] = fake_bs.heartbeats
    assert ping.path.endswith("/fail") and ping.body == "core-jobs run-once: 1 of 1 jobs failed: alerts"
    out = capsys.readouterr().out
    assert "alerts.feed.post_failed" in out and "HTTP 401" in out
    assert "wrong-token-abcdef" not in out and HEARTBEAT_TOKEN not in out


def test_a_failed_ping_does_not_change_the_exit_code(clean_env, database_url, fake_bs):
    """The heartbeat answers 500 after a good run: the exit code is still 0."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", fake_bs.heartbeat_url())
    fake_bs.fail_next("heartbeat", Fault(status=500))
    assert main(["run-once", "alerts"]) == EXIT_OK
    assert len(fake_bs.heartbeats) == 1


def test_run_once_posts_incidents_with_a_token(clean_env, database_url, conn, fake_bs):
    """With a token and routing settings, run-once posts the incident with the configured policy and team."""
    add_dead_letters(conn, "points.credit", 2)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_URL", fake_bs.url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", TOKEN)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_POLICY_ID", "P-7")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_TEAM_NAME", "Platform")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_REQUESTER_EMAIL", "oncall@example.com")
    assert main(["run-once", "alerts"]) == EXIT_OK
    [post] = fake_bs.posts()
    assert (post.body["policy_id"], post.body["team_name"], post.body["requester_email"]) == (
        "P-7",
        "Platform",
        "oncall@example.com",
    )
