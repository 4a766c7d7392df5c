"""URL handling of the settings: masking passwords, redaction, the origin-only display (pure: no database)."""

from __future__ import annotations

import pytest

from maintenance.settings import mask_url_passwords, redact_url, shown_url

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://app:pw@hunter2@db/core", "postgresql://app:***@db/core"),
        (
            "postgresql://app:p@ss@w@rd@db:5432/core?sslmode=require",
            "postgresql://app:***@db:5432/core?sslmode=require",
        ),
        ('connect "postgresql://app:pw@hunter2@db/core" failed', 'connect "postgresql://app:***@db/core" failed'),
        ("http://app@corp:hunter2@push.example/x", "http://app@corp:***@push.example/x"),
    ],
)
def test_masks_a_password_with_a_raw_at_up_to_the_last_at_before_the_host(text, masked):
    """A password (or user name) holding an unencoded @ is masked whole, up to the @ that precedes the host."""
    assert mask_url_passwords(text) == masked


def test_masks_each_url_of_a_text_up_to_its_own_host():
    """Two URLs in one text are masked each on its own: the mask never runs on into the next URL."""
    text = "from postgresql://a:pw-1@h1/db to postgresql://b:pw@2@h2/db (user x@y)"
    assert mask_url_passwords(text) == "from postgresql://a:***@h1/db to postgresql://b:***@h2/db (user x@y)"


def test_redact_url_masks_only_the_password():
    """redact_url keeps user, host and database and hides the password, in the user part or the query."""
    assert redact_url("postgresql://u:p%40ss@h/db?sslmode=require") == "postgresql://u:***@h/db?sslmode=require"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("postgresql://u@h/db?sslmode=require&password=q-pw&x=1") == (
        "postgresql://u@h/db?sslmode=require&password=***&x=1"
    )


def test_shown_url_keeps_only_the_origin():
    """A URL whose path is a token is shown as scheme://host:port/… only."""
    assert shown_url("https://uptime.betterstack.com:443/api/v1/heartbeat/tok-123?x=1") == (
        "https://uptime.betterstack.com:443/…"
    )


def test_refuses_credentials_in_the_jwks_url_naming_the_setting_not_the_password(clean_env):
    """CORE_JOBS_API_JWKS_URL with user:password@ is a configuration error naming the setting, never the password."""
    from maintenance.settings import ConfigError, load_settings

    clean_env.setenv("CORE_JOBS_API_JWKS_URL", "https://u:JwksPW88@idp.example/jwks.json")
    with pytest.raises(ConfigError, match=r"CORE_JOBS_API_JWKS_URL.*credentials") as raised:
        load_settings()
    assert "JwksPW88" not in str(raised.value)


def test_the_queue_url_is_unset_by_default_which_is_the_reference_queue(clean_env):
    """Without CORE_JOBS_QUEUE_URL the worker's queue is the reference one, and check-config shows it empty."""
    from maintenance.settings import load_settings

    settings = load_settings()
    assert settings.queue_url is None and settings.queue_url_value() is None
    assert settings.queue_adapter() == "harness.queue.pgqueue:PgQueue"
    assert settings.effective()["CORE_JOBS_QUEUE_URL"] == ""


def test_the_queue_url_is_shown_redacted_and_its_password_is_a_secret_for_the_log_redactor(clean_env):
    """An amqp:// queue URL keeps its password for the worker, shows it masked, and hands it to the log redactor."""
    from maintenance.settings import load_settings

    clean_env.setenv("CORE_JOBS_QUEUE_URL", " amqp://jobs:Rabbit%2Fpw@rabbit:5672/%2F\n")
    settings = load_settings()
    assert settings.queue_url_value() == "amqp://jobs:Rabbit%2Fpw@rabbit:5672/%2F"
    assert settings.queue_adapter() == "harness.queue.rabbitmq:RabbitQueue"
    assert settings.effective()["CORE_JOBS_QUEUE_URL"] == "amqp://jobs:***@rabbit:5672/%2F"
    assert {"Rabbit%2Fpw", "Rabbit/pw"} <= set(settings.secret_values())
    assert "Rabbit" not in repr(settings)


@pytest.mark.parametrize("url", ["kafka://jobs:QueuePW77@broker/", "jobs:QueuePW77@broker", "broker.internal"])
def test_a_queue_url_of_no_known_scheme_is_refused_at_load_naming_the_setting_not_the_password(clean_env, url):
    """CORE_JOBS_QUEUE_URL whose scheme no adapter serves is a configuration error naming the setting and the known
    schemes, never the password."""
    from maintenance.settings import ConfigError, load_settings

    clean_env.setenv("CORE_JOBS_QUEUE_URL", url)
    with pytest.raises(
        ConfigError, match=r"^CORE_JOBS_QUEUE_URL: .*amqp, amqps, memory, postgres, postgresql"
    ) as raised:
        load_settings()
    assert "QueuePW77" not in str(raised.value)


def test_a_memory_queue_url_is_refused_at_load_as_a_queue_for_a_consumers_own_tests(clean_env):
    """memory:// is a queue in one process (harness/queue/memory.py): a worker or enqueue command on it would lose
    what it published when it exits, so the bundle's settings refuse it, saying what it is for."""
    from maintenance.settings import ConfigError, load_settings

    clean_env.setenv("CORE_JOBS_QUEUE_URL", "memory://orders")
    with pytest.raises(
        ConfigError, match=r"^CORE_JOBS_QUEUE_URL: .*for a consumer's own tests.*postgresql:// or amqp://"
    ):
        load_settings()


def test_a_queue_url_of_an_installed_third_party_scheme_is_accepted(clean_env, echo_queues):
    """A scheme registered in the entry-point group core_jobs_harness.queues is a valid CORE_JOBS_QUEUE_URL."""
    from maintenance.settings import load_settings

    clean_env.setenv("CORE_JOBS_QUEUE_URL", "echo://jobs:pw@nowhere/")
    assert load_settings().queue_adapter() == "support.queue_adapters:EchoQueue"
