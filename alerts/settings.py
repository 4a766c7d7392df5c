"""The alerts job's settings, declared once: each field's default, bounds, unit (its type) and description.

The Better Stack API, the heartbeat, incident routing and the stale-dead-letter escalation.
:class:`maintenance.settings.Settings` composes this mixin from the job catalog; the option
list of ``docs/alerts.md`` and ``docs/reference/settings.md`` are generated from it
(``uv run python -m tools.reference``). It is the feed's configuration too: :class:`~alerts.feed.AlertFeed`
takes it as it is (from the environment as part of ``Settings``, or built in code,
``AlertsFields(betterstack_policy_id="P1")``), validated by pydantic either way. Secrets: the API token and the heartbeat URL (its
path is a token) are ``SecretStr``; URLs are checked by
:func:`~maintenance.fields.urls.check_http_url`. The heartbeat (``alerts/heartbeat.py``) and the
client (``alerts/betterstack.py``) are this family's too.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from maintenance.fields.crontab import Crontab
from maintenance.fields.durations import PositiveDuration
from maintenance.fields.urls import check_http_url

# An incident's alert channels, Better Stack's create parameters (https://betterstack.com/docs/uptime/api/create-a-new-incident/).
CHANNELS = ("call", "sms", "email", "critical_alert")


class AlertsFields(BaseModel):
    """Better Stack: API, routing, heartbeat, limits; the ops link; the stale-dead-letter escalation."""

    model_config = ConfigDict(extra="forbid")  # built in code, a misspelt field is an error too

    schedule_alerts: Crontab = Field(default="*/5 * * * *", description="`serve`: crontab (UTC) of the alerts job.")
    alerts_environment: str | None = Field(
        default=None,
        description="Which deployment this is (production, staging-eu…): the alert identity is bound to it, so a "
        "physical copy of the database (a snapshot, a base backup) started as another environment refuses to alert "
        "until `core-jobs alerts identity renew` (docs/alerts.md). The Helm chart sets it from `environment`. "
        "Unset: none declared; the first one given is recorded by itself. Up to 63 visible characters.",
    )
    betterstack_api_url: str = Field(
        default="https://uptime.betterstack.com",
        description="Base URL of the Better Stack Uptime API (http:// or https://).",
    )
    betterstack_api_token: SecretStr | None = Field(
        default=None,
        description="Better Stack Uptime API token. Unset: the alert feed runs dry (logs what it would "
        "post, records nothing), so setting it later still alerts everything. Visible ASCII only (no "
        "space or trailing newline): refused at load otherwise.",
    )
    betterstack_team_name: str | None = Field(
        default=None, description="Team that owns the incidents; required by Better Stack with a global API token."
    )
    betterstack_policy_id: str | None = Field(
        default=None,
        description="Escalation policy of new-dead-letter incidents (unset: Better Stack's default routing).",
    )
    betterstack_escalation_policy_id: str | None = Field(
        default=None,
        description="Escalation policy of stale-dead-letter escalations (unset: BETTERSTACK_POLICY_ID).",
    )
    # How Better Stack alerts the on-call person, per kind: the create parameters call, sms, email
    # and critical_alert (https://betterstack.com/docs/uptime/api/create-a-new-incident/).
    betterstack_incident_call: bool = Field(
        default=False, description="New-incident alerts (new dead letters, new uncertain executions): phone call."
    )
    betterstack_incident_sms: bool = Field(default=False, description="New-incident alerts: SMS.")
    betterstack_incident_email: bool = Field(default=True, description="New-incident alerts: e-mail.")
    betterstack_incident_critical_alert: bool = Field(
        default=False,
        description="New-incident alerts: critical push notification (ignores the mute switch and Do Not Disturb).",
    )
    betterstack_escalation_call: bool = Field(
        default=False, description="Escalation alerts (stale dead letters, executions still uncertain): phone call."
    )
    betterstack_escalation_sms: bool = Field(default=False, description="Escalation alerts: SMS.")
    betterstack_escalation_email: bool = Field(default=True, description="Escalation alerts: e-mail.")
    betterstack_escalation_critical_alert: bool = Field(
        default=False,
        description="Escalation alerts: critical push notification (ignores the mute switch and Do Not Disturb).",
    )
    betterstack_requester_email: str | None = Field(
        default=None, description="requester_email of every incident, and resolved_by when the feed resolves one."
    )
    betterstack_heartbeat_url: SecretStr | None = Field(
        default=None,
        description="Heartbeat URL pinged after `core-jobs run-once` and after each run of `serve` (its /fail form when a job failed). "
        "Secret: its path is a token.",
    )
    betterstack_timeout: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="Timeout of one HTTP request to Better Stack (connect, read, write).",
    )
    betterstack_max_retries: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Retries of one request after a connection error, timeout, 429 or 5xx (backoff 1 s doubling, cap 30 s, "
        "Retry-After honoured up to RETRY_AFTER_MAX).",
    )
    betterstack_max_requests_per_second: float = Field(
        default=8.0,
        gt=0,
        le=100,
        description="Client-side rate limit towards Better Stack (the official Terraform provider keeps to 8).",
    )
    ops_url_template: str | None = Field(
        default=None,
        description="Link to the dead letters of a queue in the incident text, with {queue} as the placeholder, "
        "e.g. https://ops.example/dead-letters?queue={queue}.",
    )
    alerts_max_incidents_per_run: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Incidents per run and kind (new, stale); beyond it, the remaining queues are folded into one "
        "summary incident, never dropped.",
    )
    alerts_progress_interval: PositiveDuration = Field(
        default=timedelta(seconds=5),
        description="How often a long run logs alerts.feed.progress at info while it posts or resolves incidents "
        "(items done of the total, rate, estimated seconds left).",
    )
    dead_letter_stale_after: PositiveDuration = Field(
        default=timedelta(days=3),
        description="A dead letter still pending review this long after it was written escalates (PostgreSQL's clock).",
    )

    @field_validator("alerts_environment", mode="before")
    @classmethod
    def _environment(cls, value: Any) -> Any:
        """Blank is unset; a name is compared exactly, so no space or control character that a
        copy-paste could add or drop."""
        if value is None or str(value).strip() == "":
            return None
        if len(str(value)) > 63 or not all("!" <= c <= "~" for c in str(value)):
            raise ValueError("must be at most 63 visible ASCII characters (no space), e.g. production or staging-eu")
        return value

    @field_validator("betterstack_api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_http_url(value)

    @field_validator("betterstack_heartbeat_url", mode="before")
    @classmethod
    def _heartbeat_url(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        raw = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        url = check_http_url(raw)
        if not urlsplit(url).path.strip("/"):
            raise ValueError("must be an http:// or https:// URL with a path (the heartbeat token)")
        return SecretStr(url)

    @field_validator("betterstack_api_token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        """Blank is unset; otherwise only what an ``Authorization: Bearer`` header carries as it is
        (a secret file's trailing newline would fail every request of every run)."""
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if raw is None or str(raw).strip() == "":
            return None
        if not all("!" <= c <= "~" for c in str(raw)):
            raise ValueError(
                "must be visible ASCII characters only: no space, line break or other character"
                " (a secret file's trailing newline?); the value is not shown"
            )
        return value

    @field_validator("ops_url_template")
    @classmethod
    def _ops_template(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        try:
            value.format(queue="q")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"may use only the placeholder {{queue}} ({type(exc).__name__}: {exc})") from None
        if "{queue}" not in value:
            raise ValueError("must contain the placeholder {queue}")
        return value

    def channels(self, kind: Literal["incident", "escalation"]) -> dict[str, bool]:
        """How Better Stack alerts the on-call person about one kind of incident (new ones, stale ones): the create
        parameters ``call``, ``sms``, ``email`` and ``critical_alert`` (a push that ignores the mute switch and Do
        Not Disturb), from ``BETTERSTACK_<KIND>_*``."""
        return {name: getattr(self, f"betterstack_{kind}_{name}") for name in CHANNELS}

    def ops_url(self, queue: str) -> str | None:
        """The link to ``queue``'s dead letters in the incident text (OPS_URL_TEMPLATE), None when unset."""
        return self.ops_url_template.format(queue=quote(queue, safe="")) if self.ops_url_template else None
