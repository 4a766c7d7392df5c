"""The alerts job's configuration: the feed's config and the Better Stack client, built from the settings.

The feed itself lives in the ``alerts`` package: ``alerts/feed.py`` (the run), ``alerts/sql.py`` (its
named SQL), ``alerts/betterstack.py`` (the client); this module maps ``CORE_JOBS_*`` settings onto them in one place.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from maintenance.errors import ConfigError
from maintenance.settings.environment import ENV_PREFIX

if TYPE_CHECKING:
    from alerts.betterstack import BetterStackClient
    from alerts.feed import AlertFeedConfig
    from maintenance.settings import Settings

DEFAULT_SCHEDULE = "*/5 * * * *"  # crontab (UTC) under `core-jobs serve`


def feed_config(settings: Settings) -> AlertFeedConfig:
    from alerts.feed import AlertFeedConfig

    try:
        return AlertFeedConfig(
            stale_after=settings.dead_letter_stale_after,
            max_incidents_per_run=settings.alerts_max_incidents_per_run,
            policy_id=settings.betterstack_policy_id,
            escalation_policy_id=settings.betterstack_escalation_policy_id,
            requester_email=settings.betterstack_requester_email,
            ops_url_template=settings.ops_url_template,
        )
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}ALERTS_* / BETTERSTACK_*: {exc}") from None


def betterstack_client(settings: Settings) -> BetterStackClient | None:
    """The Better Stack client, or None (dry run) when no token is configured."""
    from alerts.betterstack import DEFAULT_RETRY_POLICY, BetterStackClient
    from maintenance.runtime.logs import get_logger

    if settings.betterstack_api_token is None:
        return None
    policy = replace(
        DEFAULT_RETRY_POLICY,
        max_attempts=settings.betterstack_max_retries + 1,
        retry_after_cap=max(settings.retry_after_max, timedelta(0)),
    )
    return BetterStackClient(
        settings.betterstack_api_url,
        settings.betterstack_api_token.get_secret_value(),
        team_name=settings.betterstack_team_name,
        timeout=settings.betterstack_timeout.total_seconds(),
        retry_policy=policy,
        max_requests_per_second=settings.betterstack_max_requests_per_second,
        log=get_logger(job="alerts"),
    )
