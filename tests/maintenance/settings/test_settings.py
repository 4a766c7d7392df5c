"""Settings: names, defaults, durations, and errors that name the setting (issue 2, point 3)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from maintenance.settings import ConfigError, load_settings

pytestmark = pytest.mark.pure


def test_defaults_follow_the_seed(clean_env):
    """With nothing set, the TTL is 7 days and the retry policy is J-B3's 5 x 30 s .. 1 h, jitter 20 %."""
    s = load_settings()
    assert s.processed_jobs_ttl == timedelta(days=7)
    assert (s.retry_max_attempts, s.retry_base_delay, s.retry_max_delay, s.retry_jitter) == (
        5,
        timedelta(seconds=30),
        timedelta(hours=1),
        0.2,
    )
    assert s.ttl_margin == 2
    assert s.database_url is None


def test_ttl_guard_shows_the_exact_values_it_compared(clean_env):
    """A TTL a microsecond short of margin x window reads as short: TTL, margin and requirement are shown unrounded."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT22M23.999999S")  # default window 11m12s x 2 = 22m24s
    explained = load_settings().ttl_guard().explain()
    assert explained.startswith(
        "CORE_JOBS_PROCESSED_JOBS_TTL=PT22M23.999999S vs CORE_JOBS_TTL_MARGIN=2 x max retry"
        " window PT11M12S = PT22M24S: TOO SHORT"
    )
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT22M24S")
    clean_env.setenv("CORE_JOBS_TTL_MARGIN", "2.0000001")  # 11m12s x 2.0000001 = 22m24.0000672s
    explained = load_settings().ttl_guard().explain()
    assert "CORE_JOBS_TTL_MARGIN=2.0000001 x max retry window PT11M12S = PT22M24.000067S: TOO SHORT" in explained


def test_unknown_variable_is_named_with_a_suggestion(clean_env):
    """A misspelt CORE_JOBS_ variable is an error naming it and the closest valid name."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOB_TTL", "P7D")
    with pytest.raises(
        ConfigError, match="unknown setting CORE_JOBS_PROCESSED_JOB_TTL; did you mean CORE_JOBS_PROCESSED_JOBS_TTL"
    ):
        load_settings()


def test_the_example_consumers_ledger_url_is_not_taken_for_a_misspelt_setting(clean_env):
    """CORE_JOBS_LOYALTY_LEDGER_URL, which the example durable consumer reads, does not stop the settings loading."""
    from harness.examples.ledger_points import LEDGER_URL_VARIABLE

    clean_env.setenv(LEDGER_URL_VARIABLE, "http://127.0.0.1:8765")
    assert load_settings().processed_jobs_ttl == timedelta(days=7)


def test_unknown_lowercase_variable_is_named_too(clean_env):
    """Settings are read case-insensitively, so a misspelt lower-case core_jobs_ variable is an error as well."""
    clean_env.setenv("core_jobs_procesed_jobs_ttl", "P7D")
    with pytest.raises(
        ConfigError, match="unknown setting core_jobs_procesed_jobs_ttl; did you mean CORE_JOBS_PROCESSED_JOBS_TTL"
    ):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CORE_JOBS_PROCESSED_JOBS_TTL", "-P1D", "CORE_JOBS_PROCESSED_JOBS_TTL: must be positive"),
        ("CORE_JOBS_PROCESSED_JOBS_TTL", "seven days", "CORE_JOBS_PROCESSED_JOBS_TTL: 'seven days' is not a duration"),
        ("CORE_JOBS_RETRY_MAX_ATTEMPTS", "0", "CORE_JOBS_RETRY_MAX_ATTEMPTS"),
        ("CORE_JOBS_RETRY_JITTER", "1.5", "CORE_JOBS_RETRY_JITTER"),
        ("CORE_JOBS_TTL_MARGIN", "0.5", "CORE_JOBS_TTL_MARGIN"),
        ("CORE_JOBS_DATABASE_URL", "mysql://x", "CORE_JOBS_DATABASE_URL: must start with postgresql://"),
        ("CORE_JOBS_RETRY_OVERRIDES", "{not json", "CORE_JOBS_RETRY_OVERRIDES"),
        ("CORE_JOBS_PROCESSED_JOBS_TTL", "P9999999999D", "CORE_JOBS_PROCESSED_JOBS_TTL: too large"),
        ("CORE_JOBS_RETRY_MAX_DELAY", "1e20", "CORE_JOBS_RETRY_MAX_DELAY: too large"),
    ],
)
def test_bad_values_name_the_setting(clean_env, name, value, message):
    """A bad value is a ConfigError whose message starts with the setting's name."""
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        load_settings()


def test_retry_override_without_justification_is_an_error(clean_env):
    """J-B3: a per-queue retry override with no justification is refused, naming the queue."""
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"points.credit": {"max_attempts": 8}}')
    with pytest.raises(ConfigError, match=r"CORE_JOBS_RETRY_OVERRIDES\[points.credit\].\[justification\]: is required"):
        load_settings()


def test_an_unknown_retry_override_key_is_refused_listing_the_valid_keys(clean_env):
    """A misspelt key names itself, the closest valid key and every valid one."""
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"points.credit": {"justification": "slow", "max_attempt": 8}}')
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("CORE_JOBS_RETRY_OVERRIDES[points.credit]: unknown key 'max_attempt'")
    assert "did you mean max_attempts?" in message
    assert "justification, max_attempts, base_delay, max_delay, jitter, retry_after_cap" in message


def test_duration_settings_accept_numbers_with_units(clean_env):
    """`2s`, `500ms`, `1h30m` wherever a duration is read: a setting, and a retry override's delays."""
    clean_env.setenv("CORE_JOBS_WORKER_LEASE", "2s")
    clean_env.setenv("CORE_JOBS_WORKER_POLL_INTERVAL", "500ms")
    clean_env.setenv("CORE_JOBS_RETRY_MAX_DELAY", "1h30m")
    clean_env.setenv(
        "CORE_JOBS_RETRY_OVERRIDES",
        '{"points.credit": {"justification": "slow", "base_delay": "5m", "max_delay": "2h"}}',
    )
    s = load_settings()
    assert (s.worker_lease, s.worker_poll_interval, s.retry_max_delay) == (
        timedelta(seconds=2),
        timedelta(milliseconds=500),
        timedelta(hours=1, minutes=30),
    )
    assert s.retry_policy("points.credit").base_delay == timedelta(minutes=5)


def test_a_refused_duration_setting_says_which_forms_are_accepted(clean_env):
    """A value in no accepted form names the setting and the forms: seconds, numbers with units, ISO-8601."""
    clean_env.setenv("CORE_JOBS_WORKER_LEASE", "2 secs")
    with pytest.raises(
        ConfigError, match=r"CORE_JOBS_WORKER_LEASE: '2 secs' is not a duration: use seconds like 30.*1h30m.*PT30S"
    ):
        load_settings()


def test_retry_override_with_blank_justification_is_an_error(clean_env):
    """A justification of only spaces is no justification."""
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"points.credit": {"max_attempts": 8, "justification": "  "}}')
    with pytest.raises(ConfigError, match="justification"):
        load_settings()


def test_justified_override_changes_only_its_queue(clean_env):
    """An override applies to its queue on top of the defaults; other queues keep the defaults."""
    clean_env.setenv(
        "CORE_JOBS_RETRY_OVERRIDES",
        '{"points.credit": {"max_attempts": 8, "base_delay": "PT10S", "justification": "ledger restarts take 20 min"}}',
    )
    s = load_settings()
    assert s.retry_policy("points.credit").max_attempts == 8
    assert s.retry_policy("points.credit").base_delay == timedelta(seconds=10)
    assert s.retry_policy("points.credit").max_delay == timedelta(hours=1)
    assert s.retry_policy("other").max_attempts == 5


def test_override_that_makes_an_invalid_policy_is_an_error(clean_env):
    """An override whose max_delay is below the base delay is refused before anything runs."""
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"q": {"max_delay": "PT1S", "justification": "test"}}')
    with pytest.raises(ConfigError, match="max_delay"):
        load_settings()


@pytest.mark.parametrize(
    "env",
    [
        {"CORE_JOBS_RETRY_MAX_ATTEMPTS": "1000000000000000000"},
        {
            "CORE_JOBS_RETRY_MAX_ATTEMPTS": "50",
            "CORE_JOBS_RETRY_MAX_DELAY": "P999999999D",
            "CORE_JOBS_RETRY_BASE_DELAY": "P999999D",
        },
    ],
)
def test_retry_window_beyond_any_duration_is_a_config_error(clean_env, env):
    """A policy whose worst-case window overflows a duration is a ConfigError at load, naming the retry settings."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match="CORE_JOBS_RETRY_"):
        load_settings()


def test_max_retry_window_takes_the_worst_policy_and_the_broker_horizon(clean_env):
    """The guard's window is the longest policy window plus the broker's redelivery horizon."""
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"slow": {"max_attempts": 7, "justification": "provider SLA"}}')
    clean_env.setenv("CORE_JOBS_BROKER_REDELIVERY_HORIZON", "PT1H")
    s = load_settings()
    slow_only = s.retry_policy("slow")
    from harness.consumer.retry import max_retry_window

    assert s.max_retry_window() == max_retry_window(slow_only) + timedelta(hours=1)


def test_ttl_guard_refuses_a_ttl_below_margin_times_window(clean_env):
    """A TTL shorter than margin x window fails the guard; the explanation says what to change."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT20M")  # default window 11m12s x 2 = 22m24s
    guard = load_settings().ttl_guard()
    assert not guard.ok
    assert guard.required == timedelta(minutes=22, seconds=24)
    assert "raise CORE_JOBS_PROCESSED_JOBS_TTL to at least PT22M24S" in guard.explain()


def test_database_url_accepts_sqlalchemy_style_and_is_redacted(clean_env):
    """postgresql+psycopg:// is accepted; the password never shows in the effective settings."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql+psycopg://app:s3cr3t-pw@db:5432/core")
    s = load_settings()
    assert s.conninfo() == "postgresql://app:s3cr3t-pw@db:5432/core"
    assert s.effective()["CORE_JOBS_DATABASE_URL"] == "postgresql://app:***@db:5432/core"
    assert "s3cr3t-pw" not in repr(s)


@pytest.mark.parametrize("url", ["postgresql://app:pw@db/core\n", "  postgresql+psycopg://app:pw@db/core \r\n"])
def test_database_url_is_read_without_surrounding_whitespace(clean_env, url):
    """A secret file's trailing newline (or spaces around the URL) is not part of the URL, as for the http URL
    settings: libpq would otherwise take it into the database name and every job would fail to connect."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", url)
    assert load_settings().conninfo() == "postgresql://app:pw@db/core"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pw%zz-hunter2@db/core",  # bad percent-encoding: libpq would echo the password
        "postgresql://app:pw@hunter2@db/core",  # an unencoded @: libpq would take "hunter2@db" as the host
        "postgresql://app:hunter2@db/core?no_such_option=1",
        "postgresql://app:hunter2@[::1/core",  # an unclosed IPv6 bracket
        "postgresql://app@corp:hunter2@db/core",  # an unencoded @ in the user name: libpq reads "hunter2@db" as the port
        "postgresql://app:hunter2/x@db/core",  # an unencoded / in the password: libpq reads "app:hunter2" as host:port
    ],
)
def test_database_url_libpq_cannot_parse_is_refused_without_echoing_it(clean_env, url):
    """A URL libpq cannot use is a ConfigError naming the setting, found before any connection, password not shown."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", url)
    with pytest.raises(ConfigError, match="CORE_JOBS_DATABASE_URL: ") as info:
        load_settings()
    assert "hunter2" not in str(info.value)


URL_SECRET = "Tk9-url-secret"


@pytest.mark.parametrize(
    "name",
    ["CORE_JOBS_BETTERSTACK_API_URL", "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "CORE_JOBS_METRICS_PUSHGATEWAY_URL"],
)
@pytest.mark.parametrize(
    "url",
    [
        f"http://[::1/api/v1/heartbeat/{URL_SECRET}",  # an unclosed IPv6 bracket: urllib raises, httpx misreads the port
        f"http://127.0.0.1:99999/api/v1/heartbeat/{URL_SECRET}",  # httpx accepts the port, the socket does not
        f"http://127.0.0.1:0/api/v1/heartbeat/{URL_SECRET}",
        f"http://127.0.0.1:http/api/v1/heartbeat/{URL_SECRET}",
        f"http://xn--zz/api/v1/heartbeat/{URL_SECRET}",  # not a valid IDNA host name
        f"http://ops:{URL_SECRET}@push.example/api/v1/heartbeat/x",  # credentials would be shown with the host
        f"http://push.example/api/v1/heartbeat/ {URL_SECRET}",
    ],
)
def test_url_settings_httpx_cannot_use_are_refused_at_load_without_echoing_them(clean_env, name, url):
    """Each URL setting is parsed as httpx and urllib will use it: a URL they cannot use is a ConfigError naming the setting, the URL not shown."""
    clean_env.setenv(name, url)
    with pytest.raises(ConfigError, match=f"^{name}: ") as info:
        load_settings()
    assert URL_SECRET not in str(info.value) and "xn--zz" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("CORE_JOBS_BETTERSTACK_API_URL", "http://[::1]:8080/"),
        ("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "https://uptime.betterstack.com:443/api/v1/heartbeat/T"),
        ("CORE_JOBS_METRICS_PUSHGATEWAY_URL", "http://pushgateway.monitoring:9091"),
    ],
)
def test_url_settings_accept_ports_and_ipv6_hosts(clean_env, name, url):
    """A well-formed URL with an explicit port or a bracketed IPv6 host is accepted, trailing slash removed."""
    clean_env.setenv(name, url)
    value = getattr(load_settings(), name.removeprefix("CORE_JOBS_").lower())
    assert (value.get_secret_value() if hasattr(value, "get_secret_value") else value) == url.rstrip("/")


def test_database_password_alone_is_a_secret_for_the_log_redactor(clean_env):
    """The password itself (as written and percent-decoded, in the user part or the query) is a secret value."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:pw%2Fone@db/core?sslmode=require")
    assert {"pw%2Fone", "pw/one"} <= set(load_settings().secret_values())
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app@db/core?sslmode=require&password=query%2Fpw")
    assert {"query%2Fpw", "query/pw"} <= set(load_settings().secret_values())


def test_secret_value_is_not_echoed_in_errors(clean_env):
    """A bad database URL's text (which may hold a password) is not repeated in the error."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "mysql://root:hunter2@db/x")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "hunter2" not in str(info.value)
