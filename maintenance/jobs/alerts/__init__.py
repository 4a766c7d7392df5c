"""The ``alerts`` job: the dead-letter alert feed (``alerts/feed.py``) wired to the settings.

``core-jobs run-once alerts`` posts Better Stack incidents for new dead letters, escalates stale
ones and resolves handled ones; without ``CORE_JOBS_BETTERSTACK_API_TOKEN`` it runs dry. The
feed's module docstring is the operator's manual; this module only maps ``CORE_JOBS_*``
settings onto :class:`AlertFeedConfig` and the Better Stack client, and registers the job.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from alerts.betterstack import DEFAULT_RETRY_POLICY, BetterStackClient
from alerts.feed import AlertFeed, AlertFeedConfig, AlertFeedResult
from maintenance.jobs.base import JobSpec
from maintenance.runtime.db import Database
from maintenance.runtime.logs import get_logger
from maintenance.settings import ENV_PREFIX, ConfigError, Settings


def feed_config(settings: Settings) -> AlertFeedConfig:
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


def build(settings: Settings, db: Database) -> AlertFeed:
    return AlertFeed(
        feed_config(settings),
        connect=lambda: db.connect(autocommit=True),
        client=betterstack_client(settings),
        log=get_logger(job="alerts"),
    )


def demo_lines(db: Database, result: AlertFeedResult) -> list[str]:
    """The incidents a dry run would post (the demo has no token)."""
    if not result.dry_run:
        return [f"posted {result.incidents_posted} incidents and {result.escalations_posted} escalations"]
    lines = [
        f"dry run (no {ENV_PREFIX}BETTERSTACK_API_TOKEN): would post {result.dry_run_incidents} incidents, recorded nothing"
    ]
    for incident in result.planned:
        label = "escalation" if incident.kind == "stale" else "incident"
        lines.append(f"{label}: {incident.name}")
        lines.append(f"    {incident.summary}")
    return lines


SPEC = JobSpec(
    name="alerts",
    summary="Better Stack incidents for new dead letters, escalations for stale ones, auto-resolve",
    build=build,
    zero_fields=AlertFeedResult.zero_fields,
    event_prefix="alerts.feed",
    demo_lines=demo_lines,
)
