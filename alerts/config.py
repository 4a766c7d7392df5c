"""The alerts job's configuration: :class:`AlertFeedConfig`, and the feed's config and Better Stack client built from the settings.

This module maps ``CORE_JOBS_*`` settings onto them in one place; the client itself is the
Better Stack integration (``alerts/betterstack.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import quote

from alerts.settings import AlertsFields
from maintenance.errors import ConfigError
from maintenance.fields import default_of
from maintenance.fields.environment import ENV_PREFIX

if TYPE_CHECKING:
    from alerts.betterstack import BetterStackClient
    from maintenance.settings import Settings


@dataclass(frozen=True)
class Channels:
    """How Better Stack alerts the on-call person about one kind of incident: the create
    parameters ``call``, ``sms``, ``email`` and ``critical_alert`` (a push that ignores the mute
    switch and Do Not Disturb). The defaults are the settings' (email only)."""

    call: bool
    sms: bool
    email: bool
    critical_alert: bool

    @classmethod
    def of(cls, settings: Settings | None, kind: str) -> Channels:
        """The channels of ``kind`` (``incident`` or ``escalation``) from ``BETTERSTACK_<KIND>_*``;
        their declared defaults when ``settings`` is None."""
        fields = (f"betterstack_{kind}_{name}" for name in ("call", "sms", "email", "critical_alert"))
        values = [default_of(AlertsFields, f) if settings is None else getattr(settings, f) for f in fields]
        return cls(*values)

    def body(self) -> dict[str, bool]:
        return {"call": self.call, "sms": self.sms, "email": self.email, "critical_alert": self.critical_alert}


@dataclass(frozen=True)
class AlertFeedConfig:
    """The feed's options; the settings (``settings.py``) declare the defaults of those that are settings."""

    stale_after: timedelta = default_of(AlertsFields, "dead_letter_stale_after")
    max_incidents_per_run: int = default_of(AlertsFields, "alerts_max_incidents_per_run")
    policy_id: str | None = None
    escalation_policy_id: str | None = None
    requester_email: str | None = None
    ops_url_template: str | None = None
    environment: str | None = None  # the deployment the identity is bound to (identity.py)
    incident_channels: Channels = field(default_factory=lambda: Channels.of(None, "incident"))  # new ones
    escalation_channels: Channels = field(default_factory=lambda: Channels.of(None, "escalation"))  # stale ones
    progress_interval: timedelta = default_of(AlertsFields, "alerts_progress_interval")
    top_errors: int = 3
    samples: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.stale_after, timedelta) or self.stale_after <= timedelta(0):
            raise ValueError(f"stale_after must be a positive duration, got {self.stale_after!r}")
        if not isinstance(self.progress_interval, timedelta) or self.progress_interval <= timedelta(0):
            raise ValueError(f"progress_interval must be a positive duration, got {self.progress_interval!r}")
        for name in ("max_incidents_per_run", "top_errors", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
        if self.ops_url_template is not None and "{queue}" not in self.ops_url_template:
            raise ValueError("ops_url_template must contain the placeholder {queue}")

    def ops_url(self, queue: str) -> str | None:
        return self.ops_url_template.format(queue=quote(queue, safe="")) if self.ops_url_template else None


def feed_config(settings: Settings) -> AlertFeedConfig:
    try:
        return AlertFeedConfig(
            stale_after=settings.dead_letter_stale_after,
            max_incidents_per_run=settings.alerts_max_incidents_per_run,
            policy_id=settings.betterstack_policy_id,
            escalation_policy_id=settings.betterstack_escalation_policy_id,
            requester_email=settings.betterstack_requester_email,
            ops_url_template=settings.ops_url_template,
            environment=settings.alerts_environment,
            progress_interval=settings.alerts_progress_interval,
            incident_channels=Channels.of(settings, "incident"),
            escalation_channels=Channels.of(settings, "escalation"),
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
