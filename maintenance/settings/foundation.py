"""Foundation settings: the database URL, the fence TTL and its guard, the default retry policy, logging.

``CORE_JOBS_DATABASE_URL`` is checked by :func:`~maintenance.fields.urls.normalize_database_url`;
the retry policies and the TTL guard they feed are derived in :mod:`maintenance.fields.retry`.
The guard's broker horizon is :meth:`FoundationFields.redelivery_horizon`: here the setting
``CORE_JOBS_BROKER_REDELIVERY_HORIZON`` alone; :class:`maintenance.settings.Settings`, which also
knows the queue URL, raises it to the queue adapter's own (:mod:`maintenance.fields.horizon`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from harness.consumer.retry import RetryPolicy
from harness.ttl_guard import DEFAULT_TTL_MARGIN  # factor over the max retry window: the library's, written once
from maintenance.errors import ConfigError
from maintenance.fields.durations import NonNegativeDuration, PositiveDuration, PostgresTimeout
from maintenance.fields.environment import ENV_PREFIX
from maintenance.fields.horizon import RedeliveryHorizon
from maintenance.fields.retry import (
    RetryOverride,
    TtlGuard,
    policy_with_override,
    worst_retry_window,
)
from maintenance.fields.urls import normalize_database_url

DEFAULT_PROCESSED_JOBS_TTL = timedelta(days=7)  # fence lifetime (J-B7)
DEFAULT_RETRY_MAX_ATTEMPTS = 5  # attempts, the first included (J-B3)
DEFAULT_RETRY_BASE_DELAY = timedelta(seconds=30)  # before the first retry
DEFAULT_RETRY_MAX_DELAY = timedelta(hours=1)  # cap of one retry delay
DEFAULT_RETRY_JITTER = 0.2  # fraction
DEFAULT_RETRY_AFTER_MAX = timedelta(seconds=120)  # bound on an honoured Retry-After
DEFAULT_BROKER_REDELIVERY_HORIZON = timedelta(0)  # no broker-side redelivery
DEFAULT_MIGRATE_LOCK_TIMEOUT = timedelta(seconds=5)  # one lock wait of `core-jobs migrate`
DEFAULT_MIGRATE_LOCK_ATTEMPTS = 5  # attempts of `core-jobs migrate`, the first included
DEFAULT_LOG_FORMAT: Final = "auto"  # JSON lines unless stdout is a TTY
DEFAULT_LOG_LEVEL: Final = "INFO"  # minimum level


class FoundationFields(BaseModel):
    """Database URL, fence TTL, default retry policy and its overrides, logging."""

    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL URL (postgresql://; postgresql+psycopg://, postgresql+psycopg2:// and postgres:// are "
        "rewritten to it, then checked alike), as libpq reads it. Required by "
        "every command that uses the database; `demo` starts an embedded PostgreSQL when it is unset.",
    )
    processed_jobs_ttl: PositiveDuration = Field(
        default=DEFAULT_PROCESSED_JOBS_TTL,
        description="How long a processed_jobs fence is kept (J-B7). Must exceed "
        "TTL_MARGIN x the maximum retry window.",
    )
    ttl_margin: float = Field(
        default=DEFAULT_TTL_MARGIN,
        ge=1.0,
        description="Safety factor: the TTL must be at least this many times the maximum retry window.",
    )
    retry_max_attempts: int = Field(
        default=DEFAULT_RETRY_MAX_ATTEMPTS, ge=1, description="Total attempts per job, the first included (J-B3)."
    )
    retry_base_delay: PositiveDuration = Field(
        default=DEFAULT_RETRY_BASE_DELAY, description="Delay before the first retry; doubles each retry."
    )
    retry_max_delay: PositiveDuration = Field(
        default=DEFAULT_RETRY_MAX_DELAY, description="Cap on any single retry delay."
    )
    retry_jitter: float = Field(
        default=DEFAULT_RETRY_JITTER,
        ge=0.0,
        lt=1.0,
        description="Jitter fraction: each delay is multiplied by U(1-j, 1+j).",
    )
    retry_after_max: NonNegativeDuration = Field(
        default=DEFAULT_RETRY_AFTER_MAX,
        description="Bound on an honoured Retry-After from a provider (R-2).",
    )
    retry_overrides: dict[str, RetryOverride] = Field(
        default_factory=dict,
        description='Per-queue retry policies as JSON: {"queue": {"max_attempts": 8, '
        '"justification": "why"}}. Keys: justification (required: why this queue differs; J-B3), and any of '
        "max_attempts, base_delay, max_delay, jitter, retry_after_cap (durations like 30s or PT5M), each replacing "
        "that CORE_JOBS_RETRY_* value for the queue; another key is an error listing these.",
    )
    broker_redelivery_horizon: NonNegativeDuration = Field(
        default=DEFAULT_BROKER_REDELIVERY_HORIZON,
        description="How long the broker itself may still redeliver a message (e.g. SQS retention); "
        "added to the retry window by the TTL guard. On RabbitMQ (CORE_JOBS_QUEUE_URL amqp://) the guard uses the "
        "adapter's computed horizon instead when that is larger: this setting can raise it, never lower it.",
    )
    migrate_lock_timeout: PostgresTimeout = Field(
        default=DEFAULT_MIGRATE_LOCK_TIMEOUT,
        description="`core-jobs migrate`: the longest one lock wait may last (lock_timeout). A wait that runs out "
        "rolls the attempt back, so the queries queued behind the migration get through, and tries again.",
    )
    migrate_lock_attempts: int = Field(
        default=DEFAULT_MIGRATE_LOCK_ATTEMPTS,
        ge=1,
        description="`core-jobs migrate`: attempts before it gives up (exit 1, naming the sessions holding locks).",
    )
    migrate_api_role: bool = Field(
        default=True,
        description="`core-jobs migrate`: create the cluster-wide role core_jobs_api (the operations API's) and grant "
        "it its privileges. false for a deployment that does not run `core-jobs api`: the migrations then neither "
        "create the role nor grant it anything in this database, nor drop it on a downgrade (docs/deployment.md).",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default=DEFAULT_LOG_FORMAT, description="auto: JSON lines when stdout is not a TTY, readable console on a TTY."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default=DEFAULT_LOG_LEVEL, description="Minimum log level."
    )

    @field_validator("database_url", mode="before")
    @classmethod
    def _normalize_url(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        raw = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        return SecretStr(normalize_database_url(raw))

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
        override = self.retry_overrides.get(queue) if queue is not None else None
        return policy_with_override(self.default_retry_policy(), override)

    def retry_policies(self) -> dict[str | None, RetryPolicy]:
        """Every configured policy: ``None`` for the default, then each overridden queue."""
        return {None: self.default_retry_policy()} | {q: self.retry_policy(q) for q in self.retry_overrides}

    def labelled_policies(self) -> dict[str, RetryPolicy]:
        """Every configured policy, by what names it for people (and which setting sets it)."""
        policies = {f"the default policy ({ENV_PREFIX}RETRY_MAX_ATTEMPTS)": self.default_retry_policy()}
        for queue in self.retry_overrides:
            policies[f"queue {queue}'s policy ({ENV_PREFIX}RETRY_OVERRIDES)"] = self.retry_policy(queue)
        return policies

    def redelivery_horizon(self, extra: dict[str, RetryPolicy] | None = None) -> RedeliveryHorizon:
        """The broker horizon the TTL guard adds: the setting (Settings raises it to the queue adapter's own).

        ``extra``: more policies (label -> policy) the horizon must cover, e.g. a consumer's own.
        """
        return RedeliveryHorizon(setting=self.broker_redelivery_horizon, adapter=None)

    def max_retry_window(self) -> timedelta:
        """The longest time a job may still be retried: worst policy + broker redelivery horizon."""
        return worst_retry_window(self.retry_policies().values(), self.redelivery_horizon().value)

    def ttl_guard(self) -> TtlGuard:
        """The J-B7 check: the fence TTL must be at least TTL_MARGIN x the maximum retry window."""
        return TtlGuard(ttl=self.processed_jobs_ttl, window=self.max_retry_window(), margin=self.ttl_margin)
