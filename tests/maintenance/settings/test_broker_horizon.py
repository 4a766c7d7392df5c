"""The TTL guard (J-B7) on RabbitMQ: the adapter's redelivery horizon raises the configured one, never lowers it,
and a delivery limit the retry policies would outlast is refused at load."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.queue.rabbitmq_topology import redelivery_horizon
from maintenance.settings import ConfigError, load_settings

pytestmark = pytest.mark.pure

URL = "amqp://jobs:Horizon-pw-1@rabbit:5672/%2F"
DEFAULT_WINDOW = timedelta(minutes=11, seconds=12)  # J-B3's default policy
DEFAULT_RABBIT_HORIZON = timedelta(hours=13, minutes=3, seconds=9)  # 5 attempts, 30 min, limit 20 (docs/rabbitmq.md)


def test_an_amqp_queue_url_adds_the_adapters_redelivery_horizon_to_the_window(clean_env):
    """With CORE_JOBS_QUEUE_URL amqp:// and no horizon set, the guard's window is the policy's plus RabbitMQ's 13 h 3 min 9 s."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL)
    settings = load_settings()
    horizon = settings.redelivery_horizon()
    assert horizon.adapter is not None and horizon.adapter.horizon == DEFAULT_RABBIT_HORIZON
    assert horizon.value == DEFAULT_RABBIT_HORIZON
    assert settings.max_retry_window() == DEFAULT_WINDOW + DEFAULT_RABBIT_HORIZON
    assert settings.ttl_guard().window == DEFAULT_WINDOW + DEFAULT_RABBIT_HORIZON


def test_the_reference_queue_keeps_the_configured_horizon_alone(clean_env):
    """Unset or postgresql:// CORE_JOBS_QUEUE_URL: no adapter horizon, the window is the policy's plus the setting."""
    clean_env.setenv("CORE_JOBS_BROKER_REDELIVERY_HORIZON", "PT1H")
    for url in (None, "postgresql://db/core"):
        if url is not None:
            clean_env.setenv("CORE_JOBS_QUEUE_URL", url)
        settings = load_settings()
        assert settings.redelivery_horizon().adapter is None
        assert settings.max_retry_window() == DEFAULT_WINDOW + timedelta(hours=1)


def test_a_smaller_configured_horizon_is_raised_to_the_adapters(clean_env):
    """CORE_JOBS_BROKER_REDELIVERY_HORIZON below RabbitMQ's computed horizon does not shorten the guard's window."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL)
    clean_env.setenv("CORE_JOBS_BROKER_REDELIVERY_HORIZON", "PT1H")
    settings = load_settings()
    assert settings.redelivery_horizon().value == DEFAULT_RABBIT_HORIZON
    assert settings.max_retry_window() == DEFAULT_WINDOW + DEFAULT_RABBIT_HORIZON


def test_a_larger_configured_horizon_is_kept(clean_env):
    """An operator's CORE_JOBS_BROKER_REDELIVERY_HORIZON above the computed one is what the guard uses."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL)
    clean_env.setenv("CORE_JOBS_BROKER_REDELIVERY_HORIZON", "P2D")
    settings = load_settings()
    assert settings.redelivery_horizon().value == timedelta(days=2)
    assert settings.max_retry_window() == DEFAULT_WINDOW + timedelta(days=2)


def test_the_urls_consumer_timeout_and_delivery_limit_and_the_worst_policy_make_the_horizon(clean_env):
    """consumer_timeout (ms) and delivery_limit from the URL's query, and the policy of most attempts, give the horizon."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL + "?consumer_timeout=600000&delivery_limit=12&heartbeat=30")
    clean_env.setenv("CORE_JOBS_RETRY_OVERRIDES", '{"slow": {"max_attempts": 9, "justification": "provider SLA"}}')
    settings = load_settings()
    slow = settings.retry_policy("slow")
    expected = redelivery_horizon(slow, consumer_timeout=timedelta(minutes=10), delivery_limit=12)
    assert expected > redelivery_horizon(
        settings.default_retry_policy(), consumer_timeout=timedelta(minutes=10), delivery_limit=12
    )
    assert settings.redelivery_horizon().value == expected
    assert settings.max_retry_window() == max_retry_window(slow) + expected


def test_a_too_short_ttl_on_rabbitmq_fails_the_guard_that_passes_on_the_reference_queue(clean_env):
    """A day of fence TTL is enough for the default policy on PostgreSQL, not for RabbitMQ's 13 h horizon x margin 2."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "P1D")
    assert load_settings().ttl_guard().ok
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL)
    guard = load_settings().ttl_guard()
    assert not guard.ok
    assert guard.required == (DEFAULT_WINDOW + DEFAULT_RABBIT_HORIZON) * 2


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"CORE_JOBS_QUEUE_URL": URL + "?delivery_limit=5"}, ["CORE_JOBS_RETRY_MAX_ATTEMPTS", "max_attempts=5"]),
        (
            {
                "CORE_JOBS_QUEUE_URL": URL + "?delivery_limit=8",
                "CORE_JOBS_RETRY_OVERRIDES": '{"slow": {"max_attempts": 9, "justification": "provider SLA"}}',
            },
            ["CORE_JOBS_RETRY_OVERRIDES", "slow", "max_attempts=9"],
        ),
    ],
)
def test_a_delivery_limit_not_above_every_policys_max_attempts_is_refused_naming_the_settings(clean_env, env, names):
    """delivery_limit <= a policy's max_attempts is a ConfigError naming CORE_JOBS_QUEUE_URL, delivery_limit and the
    policy's setting, without the password."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    for name in ["CORE_JOBS_QUEUE_URL", "delivery_limit=", *names]:
        assert name in message
    assert "Horizon-pw-1" not in message


def test_a_delivery_limit_above_every_policy_loads(clean_env):
    """delivery_limit one above the largest max_attempts is accepted."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL + "?delivery_limit=6")
    assert load_settings().redelivery_horizon().adapter is not None


@pytest.mark.parametrize(
    "option", ["delivery_limit=many", "delivery_limit=0", "consumer_timeout=0", "consumer_timeout=soon"]
)
def test_an_unreadable_rabbitmq_option_is_refused_at_load_naming_it(clean_env, option):
    """An adapter option that does not read (or is out of range) is a ConfigError at load naming the setting and the
    option, not the password: the worker would refuse it anyway, after the operator's check-config said ok."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", f"{URL}?{option}")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert "CORE_JOBS_QUEUE_URL" in message and option.partition("=")[0] in message
    assert "Horizon-pw-1" not in message


def test_the_horizon_is_computed_without_importing_pika():
    """Loading the settings with an amqp:// queue URL and computing the guard imports no pika (check-config stays light
    and works without the rabbitmq extra)."""
    code = (
        "import os, sys\n"
        f"os.environ['CORE_JOBS_QUEUE_URL'] = {URL!r}\n"
        "from maintenance.settings import load_settings\n"
        "s = load_settings()\n"
        "assert s.redelivery_horizon().adapter is not None and s.ttl_guard().ok\n"
        "print(sorted(m for m in sys.modules if m == 'pika' or m.startswith('pika.')))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("CORE_JOBS_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_topology_module_matches_the_adapters_reexports():
    """harness.queue.rabbitmq re-exports the pika-free functions unchanged: one definition of the horizon."""
    from harness.queue import rabbitmq, rabbitmq_topology

    assert rabbitmq.redelivery_horizon is rabbitmq_topology.redelivery_horizon
    assert rabbitmq.exhausted_queue_name is rabbitmq_topology.exhausted_queue_name
    assert redelivery_horizon(RetryPolicy()) == DEFAULT_RABBIT_HORIZON
