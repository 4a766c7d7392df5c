"""Settings: every knob of core-jobs, read from ``CORE_JOBS_*`` environment variables.

Durations accept ISO-8601 (``P7D``, ``PT30S``, ``P1DT12H``) or a number of seconds (``30``,
``0.5``). An unknown ``CORE_JOBS_*`` variable is an error that names it and suggests the
closest valid name, so a typo never silently falls back to a default. URL settings are parsed
the way httpx and urllib will use them (:func:`check_http_url`: host, IPv6 brackets, port
1-65535, no credentials), so a bad one fails at load, not after the jobs ran. Every problem is
reported as :class:`ConfigError` (exit code 2) before any data is touched.

The table of settings (name, unit, default, meaning) is in README.md; each field below
carries the same description. Secrets (the database URL's password, the Better Stack token,
the heartbeat URL) are ``SecretStr`` and are shown redacted everywhere.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from harness.retry import RetryPolicy, RetryPolicyError, max_retry_window
from maintenance.runtime.logs import MASK, mask_url_passwords

ENV_PREFIX = "CORE_JOBS_"

# Variables with our prefix that are not settings of the application itself.
FOREIGN_VARIABLES = frozenset({"CORE_JOBS_TEST_DATABASE_URL", "CORE_JOBS_BENCH_DATABASE_URL"})


class ConfigError(Exception):
    """A configuration problem; the message names the setting. The CLI exits 2 on it."""


_ISO_DURATION = re.compile(
    r"^P(?!$)(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: Any) -> timedelta:
    """Parse an ISO-8601 duration (``P7D``, ``PT30S``) or a number of seconds into a timedelta.

    Months and years are refused: their length is ambiguous. A leading ``-`` is accepted so
    that range checks can name the real problem ("must be positive").
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("expected an ISO-8601 duration like P7D or PT30S, or seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("duration must be finite")
        return _timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError("expected an ISO-8601 duration like P7D or PT30S, or seconds")
    text = value.strip()
    sign = 1
    if text.startswith("-"):
        sign, text = -1, text[1:]
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError("duration must be finite")
        return _timedelta(seconds=sign * seconds)
    match = _ISO_DURATION.match(text.upper())
    if not match:
        raise ValueError(
            f"{value!r} is not a duration: use ISO-8601 like P7D, PT30S, P1DT12H, or seconds like 30"
        )
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return sign * _timedelta(**parts)


def _timedelta(**parts: float) -> timedelta:
    try:
        return timedelta(**parts)
    except OverflowError:  # beyond timedelta's 999 999 999 days: a ValueError names the setting
        raise ValueError("too large: at most 999999999 days") from None


def _must_be_positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


def _must_not_be_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_must_be_positive)]
NonNegativeDuration = Annotated[timedelta, BeforeValidator(parse_duration), AfterValidator(_must_not_be_negative)]


def format_duration(delta: timedelta) -> str:
    """Render a timedelta as a compact ISO-8601 duration (``P7D``, ``PT11M12S``), exact to the microsecond.

    Never rounded: a guard that compares two durations must not print them equal (23.999999 s
    stays ``PT23.999999S``). Integer arithmetic, so huge durations keep their microseconds too.
    """
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    date_part = f"{delta.days}D" if delta.days else ""
    time_part = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    if seconds or delta.microseconds:
        fraction = f".{delta.microseconds:06d}".rstrip("0") if delta.microseconds else ""
        time_part += f"{seconds}{fraction}S"
    if not date_part and not time_part:
        return "PT0S"
    return f"{sign}P{date_part}" + (f"T{time_part}" if time_part else "")


def format_factor(value: float) -> str:
    """A factor as written (``2``, ``1.5``, ``2.0000001``): the shortest text that reads back as exactly ``value``."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True)
class TtlGuard:
    """TTL versus the retry window (J-B7): a fence must outlive every retry and redelivery."""

    ttl: timedelta
    window: timedelta
    margin: float

    @property
    def required(self) -> timedelta:
        try:
            return self.window * self.margin
        except OverflowError:  # an absurd margin or horizon: no TTL can satisfy it
            return timedelta.max

    @property
    def ok(self) -> bool:
        return self.ttl >= self.required

    def explain(self) -> str:
        verdict = "ok" if self.ok else "TOO SHORT"
        text = (
            f"{ENV_PREFIX}PROCESSED_JOBS_TTL={format_duration(self.ttl)} vs {ENV_PREFIX}TTL_MARGIN={format_factor(self.margin)}"
            f" x max retry window {format_duration(self.window)} = {format_duration(self.required)}: {verdict}"
        )
        if not self.ok:
            text += (
                f"; raise {ENV_PREFIX}PROCESSED_JOBS_TTL to at least {format_duration(self.required)},"
                f" or shorten the retry policies ({ENV_PREFIX}RETRY_*, {ENV_PREFIX}RETRY_OVERRIDES)"
                f" or {ENV_PREFIX}BROKER_REDELIVERY_HORIZON"
            )
        return text


class RetryOverride(BaseModel):
    """A per-queue retry policy. J-B3: overriding the default needs a written justification."""

    model_config = {"extra": "forbid"}

    justification: str = Field(description="Why this queue needs a policy other than the default.")
    max_attempts: int | None = None
    base_delay: Duration | None = None
    max_delay: Duration | None = None
    jitter: float | None = None
    retry_after_cap: Duration | None = None

    @field_validator("justification")
    @classmethod
    def _justification_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must explain why this queue overrides the default retry policy (J-B3)")
        return value.strip()


# Spellings of the scheme accepted besides libpq's own postgresql:// (SQLAlchemy's, Heroku's).
DATABASE_URL_SCHEME_ALIASES = ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://")


def normalize_database_url(url: str) -> str:
    """Accept ``postgresql://`` and its aliases (SQLAlchemy's ``+psycopg``, ``+psycopg2``, ``postgres://``); return libpq's.

    The scheme is rewritten first and then every spelling takes the same check, so an alias
    never lets through a URL that libpq would misread.
    """
    for prefix in DATABASE_URL_SCHEME_ALIASES:
        if url.startswith(prefix):
            url = "postgresql://" + url[len(prefix):]
            break
    if not url.startswith("postgresql://"):
        raise ValueError("must start with postgresql:// or postgresql+psycopg://")
    _check_libpq_parses(url)
    return url


def _check_libpq_parses(url: str) -> None:
    """Refuse a URL libpq cannot use now, not at the first connection; libpq's own message may echo the password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        raise ValueError(
            "libpq cannot parse it: percent-encode special characters of the password"
            " (@ as %40, % as %25) and use only libpq's query parameters"
        ) from None
    # libpq ends the user part at the first @ (or /): the rest of a raw @ or / lands in host or port.
    if "@" in params.get("host", "") + params.get("port", ""):
        raise ValueError("its user name or password contains an unencoded @: write it as %40")
    if not all(port.isdigit() for port in params.get("port", "").split(",") if port):
        raise ValueError(
            "its port is not a number: percent-encode special characters of the user name and password"
            " (/ as %2F, : as %3A, @ as %40)"
        )


def url_passwords(url: str) -> list[str]:
    """The password(s) in a libpq URL: as written and percent-decoded, in the user part or the query."""
    parts = urlsplit(url)
    written = [parts.password or "", *re.findall(r"(?:^|&)password=([^&]*)", parts.query)]
    return [p for p in dict.fromkeys(written + [unquote(p) for p in written]) if p]


_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#\s]*", re.I)


def redact_url(url: str) -> str:
    """The URL with any password (user part or ``?password=``) replaced by ``***``."""
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + MASK, mask_url_passwords(url))


def check_http_url(value: str, *, credentials_hint: str = "") -> str:
    """``value`` (stripped, no trailing ``/``) if httpx and urllib can both use it as an http(s) URL; else ValueError.

    Parsed the way the clients will: urllib (the Pushgateway push, the masked form in log events)
    and httpx (Better Stack). A URL either cannot use would fail only later, after the jobs ran.
    The messages never quote the URL: a heartbeat URL's path is a token.
    """
    text = value.strip()
    if not re.match(r"^https?://", text, re.I):
        raise ValueError("must be an http:// or https:// URL")
    if any(ch.isspace() for ch in text):
        raise ValueError("must not contain spaces")
    try:
        parts = urlsplit(text)
        port = parts.port  # reading it checks it: a number in 0-65535
        url = httpx.URL(text)
    except (ValueError, httpx.InvalidURL):  # an unclosed [ of an IPv6 host, a bad port, an invalid IDNA host name
        raise ValueError(
            "is not a URL httpx can use: check the host (an IPv6 address in [ ]) and the port (1-65535)"
        ) from None
    if not url.host or not parts.hostname:
        raise ValueError("has no host")
    if port == 0:
        raise ValueError("its port must be 1-65535")
    if parts.username is not None or parts.password is not None or url.userinfo:
        raise ValueError("must not carry credentials (user:password@)" + credentials_hint)
    return text.rstrip("/")


def check_crontab(expr: str) -> str:
    """A 5-field crontab expression (UTC) that APScheduler 3 accepts; ValueError naming the problem.

    Days of the week must be names (mon-fri, sun): APScheduler 3 numbers them from Monday=0
    while crontab counts from Sunday=0, so a digit there would silently shift the day.
    """
    from apscheduler.triggers.cron import CronTrigger  # heavy import: only when a schedule is checked

    text = " ".join(str(expr).split())
    fields = text.split(" ") if text else []
    if len(fields) != 5:
        raise ValueError(f"not a crontab expression: expected 5 fields (minute hour day month weekday), got {len(fields)}")
    if any(ch.isdigit() for ch in fields[4]):
        raise ValueError("write days of the week as names (mon-fri, sun): APScheduler 3 counts Monday=0, crontab Sunday=0")
    try:
        CronTrigger.from_crontab(text, timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"not a valid crontab expression: {exc}") from None
    return text


class Settings(BaseSettings):
    """All settings. Field descriptions double as the README's settings table."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # --- foundation -------------------------------------------------------------------------
    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL URL (postgresql://; postgresql+psycopg://, postgresql+psycopg2:// and postgres:// are "
        "rewritten to it, then checked alike), as libpq reads it. Required by "
        "every command that uses the database; `demo` starts an embedded PostgreSQL when it is unset.",
    )
    processed_jobs_ttl: PositiveDuration = Field(
        default=timedelta(days=7),
        description="How long a processed_jobs fence is kept (J-B7). Must exceed "
        "TTL_MARGIN x the maximum retry window.",
    )
    ttl_margin: float = Field(
        default=2.0, ge=1.0,
        description="Safety factor: the TTL must be at least this many times the maximum retry window.",
    )
    retry_max_attempts: int = Field(default=5, ge=1, description="Total attempts per job, the first included (J-B3).")
    retry_base_delay: PositiveDuration = Field(default=timedelta(seconds=30), description="Delay before the first retry; doubles each retry.")
    retry_max_delay: PositiveDuration = Field(default=timedelta(hours=1), description="Cap on any single retry delay.")
    retry_jitter: float = Field(default=0.2, ge=0.0, lt=1.0, description="Jitter fraction: each delay is multiplied by U(1-j, 1+j).")
    retry_after_max: NonNegativeDuration = Field(
        default=timedelta(seconds=120),
        description="Bound on an honoured Retry-After from a provider (R-2).",
    )
    retry_overrides: dict[str, RetryOverride] = Field(
        default_factory=dict,
        description='Per-queue retry policies as JSON: {"queue": {"max_attempts": 8, '
        '"justification": "why"}}. A missing justification is an error (J-B3).',
    )
    broker_redelivery_horizon: NonNegativeDuration = Field(
        default=timedelta(0),
        description="How long the broker itself may still redeliver a message (e.g. SQS retention); "
        "added to the retry window by the TTL guard.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto", description="auto: JSON lines when stdout is not a TTY, readable console on a TTY."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Minimum log level.")

    # --- purge (issue 3) ----------------------------------------------------------------------
    purge_batch_size: int = Field(
        default=10_000, ge=1,
        description="Largest number of fences per batch; each batch is its own short transaction, sized "
        "to CORE_JOBS_PURGE_TARGET_BATCH_DURATION.",
    )
    purge_min_batch_size: int = Field(
        default=100, ge=1,
        description="Floor the batch size may shrink to (slow batches, statement timeouts); "
        "at this size, repeated timeouts stop the run (exit 1).",
    )
    purge_target_batch_duration: PositiveDuration = Field(
        default=timedelta(milliseconds=10),
        description="Wall time each batch transaction aims at: after a slower batch the batch size shrinks in "
        "proportion, after one under half of it the size doubles (up to CORE_JOBS_PURGE_BATCH_SIZE).",
    )
    purge_timeouts_before_shrink: int = Field(
        default=2, ge=1,
        description="Consecutive statement timeouts after which the batch size is halved.",
    )
    purge_statement_timeout: PositiveDuration = Field(
        default=timedelta(seconds=5),
        description="statement_timeout of each batch's DELETE (SET LOCAL).",
    )
    purge_batch_pause: NonNegativeDuration = Field(
        default=timedelta(0),
        description="Pause between batches, to leave I/O to the application.",
    )
    purge_max_runtime: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="Time budget of one run; no new batch starts after it and the run reports rows_left.",
    )
    purge_strategy: Literal["auto", "index", "sweep"] = Field(
        default="auto",
        description="Access path of each run: index walks the expires_at index in expiry order; sweep walks "
        "the heap in block ranges; auto picks one per run from the expired fraction and the physical order.",
    )

    # --- alerts (issue 4) ---------------------------------------------------------------------
    betterstack_api_url: str = Field(
        default="https://uptime.betterstack.com",
        description="Base URL of the Better Stack Uptime API (http:// or https://).",
    )
    betterstack_api_token: SecretStr | None = Field(
        default=None,
        description="Better Stack Uptime API token. Unset: the alert feed runs dry (logs what it would "
        "post, records nothing), so setting it later still alerts everything.",
    )
    betterstack_team_name: str | None = Field(
        default=None, description="Team that owns the incidents; required by Better Stack with a global API token."
    )
    betterstack_policy_id: str | None = Field(
        default=None, description="Escalation policy of new-dead-letter incidents (unset: Better Stack's default routing)."
    )
    betterstack_escalation_policy_id: str | None = Field(
        default=None,
        description="Escalation policy of stale-dead-letter escalations (unset: BETTERSTACK_POLICY_ID).",
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
        default=timedelta(seconds=10), description="Timeout of one HTTP request to Better Stack (connect, read, write)."
    )
    betterstack_max_retries: int = Field(
        default=3, ge=0, le=10,
        description="Retries of one request after a connection error, timeout, 429 or 5xx (backoff 1 s doubling, cap 30 s, "
        "Retry-After honoured up to RETRY_AFTER_MAX).",
    )
    betterstack_max_requests_per_second: float = Field(
        default=8.0, gt=0, le=100,
        description="Client-side rate limit towards Better Stack (the official Terraform provider keeps to 8).",
    )
    ops_url_template: str | None = Field(
        default=None,
        description="Link to the dead letters of a queue in the incident text, with {queue} as the placeholder, "
        "e.g. https://ops.example/dead-letters?queue={queue}.",
    )
    alerts_max_incidents_per_run: int = Field(
        default=20, ge=1, le=1000,
        description="Incidents per run and kind (new, stale); beyond it, the remaining queues are folded into one "
        "summary incident, never dropped.",
    )
    dead_letter_stale_after: PositiveDuration = Field(
        default=timedelta(days=3),
        description="A dead letter still pending review this long after it was written escalates (PostgreSQL's clock).",
    )

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
    def _blank_token_is_none(cls, value: Any) -> Any:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if raw is None or str(raw).strip() == "" else value

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

    # --- metrics and scheduler (issue 5) ------------------------------------------------------
    metrics_pushgateway_url: str | None = Field(
        default=None,
        description="Prometheus Pushgateway base URL (http:// or https://, no credentials). When set, "
        "every job run pushes its metrics there (job label core-jobs, grouped by job_name); a failed "
        "push is logged, never fatal. Unset: metrics are only logged and served by `serve`.",
    )
    metrics_push_timeout: PositiveDuration = Field(
        default=timedelta(seconds=10), description="Timeout of one Pushgateway push."
    )
    metrics_max_transaction: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="The longest a consumer's work transaction stays open. Success counting waits for "
        "older open transactions only up to this long, and falls back to now minus this when it "
        "cannot see every session (no pg_read_all_stats) or a prepared transaction exists.",
    )
    metrics_tenant_label: bool = Field(
        default=False,
        description="Add a tenant label to core_jobs_successes_total (at most METRICS_TENANT_TOP_N "
        "tenants per consumer, the rest as tenant=\"other\").",
    )
    metrics_tenant_top_n: int = Field(
        default=10, ge=1, le=100,
        description="Named tenants per consumer when METRICS_TENANT_LABEL is on (cardinality cap).",
    )
    schedule_purge: str = Field(default="*/15 * * * *", description="`serve`: crontab (UTC) of the purge job.")
    schedule_alerts: str = Field(default="*/5 * * * *", description="`serve`: crontab (UTC) of the alerts job.")
    schedule_metrics: str = Field(default="* * * * *", description="`serve`: crontab (UTC) of the metrics job.")
    scheduler_misfire_grace: PositiveDuration = Field(
        default=timedelta(seconds=60),
        description="`serve`: a run that starts later than this after its scheduled time is skipped "
        "(missed runs of one job are coalesced into one).",
    )
    http_host: str = Field(default="0.0.0.0", description="`serve`: address of the /healthz and /metrics server.")
    http_port: int = Field(
        default=9108, ge=0, le=65535, description="`serve`: port of the /healthz and /metrics server (0: any free port)."
    )

    @field_validator("metrics_pushgateway_url", mode="before")
    @classmethod
    def _pushgateway_url(cls, value: Any) -> Any:
        if value is None or str(value).strip() == "":
            return None
        return check_http_url(str(value), credentials_hint="; protect the Pushgateway by network policy")

    @field_validator("schedule_purge", "schedule_alerts", "schedule_metrics")
    @classmethod
    def _crontab(cls, value: str) -> str:
        return check_crontab(value)

    def schedule_of(self, job: str) -> str:
        """The crontab of ``job`` for `serve` (setting SCHEDULE_<JOB>); ConfigError when it has none."""
        name = "schedule_" + job.replace("-", "_").replace(".", "_")
        if name not in type(self).model_fields:
            raise ConfigError(
                f"job {job} has no schedule: add a setting {ENV_PREFIX}{name.upper()} (maintenance/settings.py)"
            )
        return getattr(self, name)

    # --- harness, worker and operator actions (issue 6) ---------------------------------------
    worker_lease: PositiveDuration = Field(
        default=timedelta(seconds=30),
        description="How long `core-jobs worker` holds a claimed message before another worker may take it "
        "(the fencing lease). Must cover a whole batch of handler runs.",
    )
    worker_batch_size: int = Field(
        default=10, ge=1, le=1000,
        description="Messages a worker claims at once (FOR UPDATE SKIP LOCKED); successes are acked per batch.",
    )
    worker_poll_interval: PositiveDuration = Field(
        default=timedelta(seconds=1),
        description="How long an idle worker waits before looking for ready messages again.",
    )
    worker_concurrency: int = Field(
        default=1, ge=1, le=64,
        description="Worker threads per `core-jobs worker` process, each with its own connection.",
    )


    # --- validators -------------------------------------------------------------------------
    @field_validator("database_url", mode="before")
    @classmethod
    def _normalize_url(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        raw = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        return SecretStr(normalize_database_url(raw))

    # --- derived ------------------------------------------------------------------------------
    def conninfo(self) -> str:
        """The libpq URL of the database; ConfigError when none is configured."""
        if self.database_url is None:
            raise ConfigError(f"{ENV_PREFIX}DATABASE_URL is not set: point it at the PostgreSQL that holds schema core")
        return self.database_url.get_secret_value()

    def default_retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.retry_max_attempts,
            base_delay=self.retry_base_delay,
            max_delay=self.retry_max_delay,
            jitter=self.retry_jitter,
            retry_after_cap=self.retry_after_max,
        )

    def retry_policy(self, queue: str | None = None) -> RetryPolicy:
        """The policy of ``queue``: its justified override on top of the defaults, or the defaults."""
        default = self.default_retry_policy()
        override = self.retry_overrides.get(queue) if queue is not None else None
        if override is None:
            return default
        fields = override.model_dump(exclude={"justification"}, exclude_none=True)
        values = {
            "max_attempts": default.max_attempts,
            "base_delay": default.base_delay,
            "max_delay": default.max_delay,
            "jitter": default.jitter,
            "retry_after_cap": default.retry_after_cap,
        } | fields
        return RetryPolicy(**values)

    def retry_policies(self) -> dict[str | None, RetryPolicy]:
        """Every configured policy: ``None`` for the default, then each overridden queue."""
        return {None: self.default_retry_policy()} | {q: self.retry_policy(q) for q in self.retry_overrides}

    def max_retry_window(self) -> timedelta:
        """The longest time a job may still be retried: worst policy + broker redelivery horizon."""
        worst = max(max_retry_window(p) for p in self.retry_policies().values())
        return worst + self.broker_redelivery_horizon

    def ttl_guard(self) -> TtlGuard:
        """The J-B7 check: the fence TTL must be at least TTL_MARGIN x the maximum retry window."""
        return TtlGuard(ttl=self.processed_jobs_ttl, window=self.max_retry_window(), margin=self.ttl_margin)

    def secret_values(self) -> list[str]:
        """Every secret string configured, for the log redactor."""
        secrets: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                raw = value.get_secret_value()
                if raw:
                    secrets.append(raw)
        if self.database_url is not None:
            # An error message may quote the password alone, not the whole URL.
            secrets += url_passwords(self.database_url.get_secret_value())
        return secrets

    def effective(self) -> dict[str, str]:
        """Every setting as ``CORE_JOBS_NAME -> value``, secrets redacted, for check-config."""
        shown: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name == "database_url" and value is not None:
                text = redact_url(value.get_secret_value())
            elif isinstance(value, SecretStr):
                text = MASK if value.get_secret_value() else ""
            elif isinstance(value, timedelta):
                text = format_duration(value)
            elif isinstance(value, dict):
                text = json.dumps({k: v.model_dump(mode="json", exclude_none=True) if isinstance(v, BaseModel) else v
                                   for k, v in value.items()})
            elif value is None:
                text = ""
            else:
                text = str(value)
            shown[ENV_PREFIX + name.upper()] = text
        return shown


def known_variables() -> list[str]:
    return [ENV_PREFIX + name.upper() for name in Settings.model_fields]


def _check_unknown_variables(environ: Mapping[str, str]) -> None:
    known = set(known_variables())
    for key in sorted(environ):
        name = key.upper()  # pydantic-settings reads the variables case-insensitively
        if not name.startswith(ENV_PREFIX) or name in known or name in FOREIGN_VARIABLES:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; see `core-jobs check-config` for the valid names"
        raise ConfigError(f"unknown setting {key}{hint}")


def _describe(error: Mapping[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    name = ENV_PREFIX + loc[0].upper() if loc else ENV_PREFIX
    if len(loc) > 1:
        name += "[" + "].[".join(loc[1:]) + "]"
    message = error.get("msg", "invalid")
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if error.get("type") == "missing":
        message = "is required"
    return f"{name}: {message}"


def load_settings() -> Settings:
    """Read the settings from the environment; raise ConfigError naming the problem.

    Error messages never echo the value given: it could be a secret.
    """
    _check_unknown_variables(os.environ)
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(e) for e in exc.errors())) from None
    except SettingsError as exc:
        # pydantic-settings fails this way when a JSON-valued variable does not parse.
        field = re.search(r'field "?(\w+)"?', str(exc))
        name = ENV_PREFIX + (field.group(1).upper() if field else "*")
        raise ConfigError(f"{name}: not valid JSON") from None
    try:
        settings.max_retry_window()  # builds every policy and sums its worst case, which may overflow
    except RetryPolicyError as exc:
        raise ConfigError(f"{ENV_PREFIX}RETRY_*: {exc}") from None
    return settings
