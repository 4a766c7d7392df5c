"""The alert feed's settings: validated before any data is touched, secrets never shown (issue 4)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alerts.betterstack import betterstack_client
from alerts.feed import SPEC
from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE
from maintenance.service.runner import job_env
from maintenance.settings import load_settings


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("CORE_JOBS_OPS_URL_TEMPLATE", "https://ops.example/dead-letters", "must contain the placeholder {queue}"),
        ("CORE_JOBS_OPS_URL_TEMPLATE", "https://ops.example/{tenant}/{queue}", "only the placeholder {queue}"),
        ("CORE_JOBS_DEAD_LETTER_STALE_AFTER", "-P1D", "must be positive"),
        ("CORE_JOBS_BETTERSTACK_API_URL", "uptime.betterstack.com", "http:// or https://"),
        ("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "https://uptime.betterstack.com", "with a path"),
        ("CORE_JOBS_ALERTS_MAX_INCIDENTS_PER_RUN", "0", "greater than or equal to 1"),
        ("CORE_JOBS_BETTERSTACK_MAX_REQUESTS_PER_SECOND", "0", "greater than 0"),
    ],
)
def test_bad_alert_setting_exits_2_naming_it(clean_env, capsys, name, value, problem):
    """A bad alert setting is a configuration error (exit 2) that names the variable and the problem."""
    clean_env.setenv(name, value)
    assert main(["check-config"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert name in err and problem in err


def test_heartbeat_url_httpx_cannot_use_exits_2_before_any_job_runs(clean_env, database_url, capsys):
    """An unclosed IPv6 bracket in the heartbeat URL exits 2 at load, with one line, no job run and no token shown."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "http://[::1/api/v1/heartbeat/hb-554433")
    assert main(["run-once"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # no job started
    assert captured.err.startswith("core-jobs: configuration error: CORE_JOBS_BETTERSTACK_HEARTBEAT_URL: ")
    assert captured.err.count("\n") == 1 and "hb-554433" not in captured.err


@pytest.mark.parametrize(
    "token", ["tok-live-123456\n", "tok-live-123456\u00fc", "tok live-123456"], ids=["newline", "non-ascii", "space"]
)
def test_api_token_an_http_header_cannot_carry_exits_2_at_load_without_showing_it(clean_env, capsys, token):
    """A token with a line break (a secret file's last newline), a non-ASCII character or a space exits 2 at load
    naming the variable, instead of failing every alerts run at its first request; the token is not shown."""
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", token)
    assert main(["check-config"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "CORE_JOBS_BETTERSTACK_API_TOKEN" in err and "visible ASCII" in err
    assert "tok-live" not in err and "123456" not in err


def test_check_config_redacts_the_token_and_the_heartbeat_url(clean_env, capsys):
    """check-config shows *** for the API token and the heartbeat URL (its path is a token)."""
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", "tok-live-123456")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "https://uptime.betterstack.com/api/v1/heartbeat/hb-998877")
    assert main(["check-config"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "CORE_JOBS_BETTERSTACK_API_TOKEN=***" in out and "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL=***" in out
    assert "tok-live-123456" not in out and "hb-998877" not in out


def test_settings_reach_the_feed_and_its_client(clean_env):
    """Durations, routing and client limits reach the feed SPEC builds; no token means no client (dry run)."""
    clean_env.setenv("CORE_JOBS_DEAD_LETTER_STALE_AFTER", "P1DT12H")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_POLICY_ID", "P-1")
    clean_env.setenv("CORE_JOBS_OPS_URL_TEMPLATE", "https://ops.example/dl?queue={queue}")
    settings = load_settings()
    feed = SPEC.build(settings, job_env(settings, db=None))  # building connects nothing
    assert feed.settings.dead_letter_stale_after == timedelta(days=1, hours=12)
    assert feed.settings.betterstack_policy_id == "P-1"
    assert feed.settings.ops_url("points credit/x") == "https://ops.example/dl?queue=points%20credit%2Fx"
    assert feed.settings.alerts_max_incidents_per_run == 20
    assert feed.client is None
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", "tok-live-123456")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_MAX_RETRIES", "5")
    clean_env.setenv("CORE_JOBS_RETRY_AFTER_MAX", "PT30S")
    settings = load_settings()
    client = SPEC.build(settings, job_env(settings, db=None)).client
    assert client is not None and client.retry_policy.max_attempts == 6 and client.timeout == 10.0
    assert client.retry_policy.retry_after_cap == timedelta(seconds=30)
    assert "tok-live-123456" not in repr(client)
    assert betterstack_client(settings).retry_policy.retry_after_cap == timedelta(seconds=120)  # the client's own


def test_alert_channels_default_to_todays_values_and_are_set_per_kind(clean_env):
    """Unset: email only for both kinds; CORE_JOBS_BETTERSTACK_ESCALATION_CALL=true asks a call of escalations only."""
    today = {"call": False, "sms": False, "email": True, "critical_alert": False}
    settings = load_settings()
    assert (settings.channels("incident"), settings.channels("escalation")) == (today, today)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_ESCALATION_CALL", "true")
    clean_env.setenv("CORE_JOBS_BETTERSTACK_INCIDENT_EMAIL", "false")
    settings = load_settings()
    assert settings.channels("escalation") == {"call": True, "sms": False, "email": True, "critical_alert": False}
    assert settings.channels("incident") == {"call": False, "sms": False, "email": False, "critical_alert": False}
