"""Settings: every knob of core-jobs, read from ``CORE_JOBS_*`` environment variables.

Every setting is the variable ``CORE_JOBS_<FIELD>`` (``processed_jobs_ttl`` is
``CORE_JOBS_PROCESSED_JOBS_TTL``). :func:`load_settings` reads them all at once and reports
every problem as :class:`ConfigError` (exit code 2) naming the variable, before any data is
touched. The generated table of all settings (variable, unit, default, meaning) is
``docs/reference/settings.md``; each field's description is its row there.

Where each setting is declared (import everything from ``maintenance.settings``):

- each job's own, its schedule included, beside its config: ``maintenance/jobs/<job>/settings.py``
  (a pydantic mixin ``<Job>Fields``: default, bounds, unit, description, written once), which
  the job's ``SPEC`` names; :class:`Settings` composes them from the job catalog;
- ``foundation.py`` — database URL, fence TTL, default retry policy and overrides, logging;
  ``telemetry.py`` — the Pushgateway; ``scheduler.py`` — `serve`'s misfires and HTTP server;
  ``worker.py`` — `core-jobs worker`; the operations API's ``maintenance/settings/api.py``;
- what they are made of, in ``maintenance/fields/`` (imported by the jobs and the settings
  alike, importing neither): ``durations.py`` — how durations are written and shown;
  ``urls.py`` — checking URLs and masking what is secret in them; ``crontab.py`` — crontab
  checks; ``retry.py`` — per-queue overrides, policy derivation and the TTL guard (J-B7);
  ``horizon.py`` — the broker's redelivery horizon the guard adds (raised to the queue adapter's own);
  ``environment.py`` — the prefix, unknown-variable detection, error messages.

:class:`Settings` composes the mixins. pydantic lists fields in reverse base order, so the
bases are written last topic first and the variables keep their order (foundation, then each
job in catalog order, then the runtime's). A new job needs nothing here; a new topic is one more
mixin, placed first among the bases, plus its names in ``__all__`` if public.

Durations are ISO-8601 (``P7D``, ``PT30S``, ``P1DT12H``) or a number of seconds (``30``,
``0.5``); months and years are refused. They are shown back as compact ISO-8601, exact to the
microsecond.

An unknown ``CORE_JOBS_*`` variable is an error that names it and suggests the closest valid
name, so a typo never silently falls back to a default (variables are read case-insensitively;
``CORE_JOBS_TEST_DATABASE_URL``, ``CORE_JOBS_TEST_RABBITMQ_URL``, ``CORE_JOBS_REQUIRE_RABBITMQ``,
``CORE_JOBS_REQUIRE_CLUSTERS`` and ``CORE_JOBS_BENCH_DATABASE_URL`` belong to the tests and benchmarks). URL settings are parsed the way httpx and urllib will use them (host, IPv6 brackets,
port 1-65535, no credentials), so a bad one fails at load, not after the jobs ran.

Secrets (the database and queue URLs' passwords, the Better Stack token, the heartbeat URL) are
``SecretStr``: shown redacted by ``check-config`` (:meth:`Settings.effective`), handed to the log
redactor (:meth:`Settings.secret_values`), and never echoed in an error message.
"""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from harness.consumer.retry import RetryPolicy, RetryPolicyError
from maintenance.errors import ConfigError
from maintenance.fields.crontab import check_crontab
from maintenance.fields.durations import (
    Duration,
    NonNegativeDuration,
    PositiveDuration,
    format_duration,
    format_factor,
    parse_duration,
)
from maintenance.fields.environment import (
    ENV_PREFIX,
    FOREIGN_VARIABLES,
    check_unknown_variables,
    describe_error,
    variable_names,
)
from maintenance.fields.horizon import RedeliveryHorizon, adapter_horizon
from maintenance.fields.retry import RetryOverride, TtlGuard
from maintenance.fields.urls import (
    DATABASE_URL_SCHEME_ALIASES,
    MASK,
    check_http_url,
    mask_url_passwords,
    normalize_database_url,
    redact_url,
    shown_url,
    url_passwords,
)
from maintenance.jobs.catalog import JOB_FIELDS
from maintenance.settings.api import ApiSettings
from maintenance.settings.foundation import FoundationFields
from maintenance.settings.scheduler import SchedulerFields
from maintenance.settings.telemetry import TelemetryFields
from maintenance.settings.worker import WorkerFields

__all__ = [
    "DATABASE_URL_SCHEME_ALIASES",
    "ENV_PREFIX",
    "FOREIGN_VARIABLES",
    "MASK",
    "ConfigError",
    "Duration",
    "FoundationFields",
    "NonNegativeDuration",
    "PositiveDuration",
    "RedeliveryHorizon",
    "RetryOverride",
    "SchedulerFields",
    "Settings",
    "TelemetryFields",
    "TtlGuard",
    "WorkerFields",
    "check_crontab",
    "check_http_url",
    "format_duration",
    "format_factor",
    "known_variables",
    "load_settings",
    "mask_url_passwords",
    "normalize_database_url",
    "parse_duration",
    "redact_url",
    "shown_url",
    "url_passwords",
]


# Settings that are URLs with a password: shown with only the password masked, the password alone a secret too.
PASSWORD_URL_SETTINGS = ("database_url", "queue_url")


class Settings(  # the jobs' bases come from the catalog, so mypy sees their fields as Any
    ApiSettings,
    WorkerFields,
    SchedulerFields,
    TelemetryFields,
    *reversed(JOB_FIELDS),  # type: ignore[misc]
    FoundationFields,
    BaseSettings,
):
    """All settings: the topic mixins and the jobs', last first (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    def redelivery_horizon(self, extra: dict[str, RetryPolicy] | None = None) -> RedeliveryHorizon:
        """The TTL guard's broker horizon: ``CORE_JOBS_BROKER_REDELIVERY_HORIZON`` raised to the horizon the
        queue adapter computes from ``CORE_JOBS_QUEUE_URL`` for the worst configured policy (and ``extra``'s),
        never lowered (maintenance/fields/horizon.py says why).

        ValueError when the queue URL's options do not read or its delivery limit is too low for a policy.
        """
        policies = self.labelled_policies() | (extra or {})
        return RedeliveryHorizon(self.broker_redelivery_horizon, adapter_horizon(self.queue_url_value(), policies))

    def secret_values(self) -> list[str]:
        """Every secret string configured, for the log redactor."""
        secrets: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                raw = value.get_secret_value()
                if raw:
                    secrets.append(raw)
        for name in PASSWORD_URL_SETTINGS:
            url = getattr(self, name)
            if url is not None:  # an error message may quote the password alone, not the whole URL
                secrets += url_passwords(url.get_secret_value())
        return secrets

    def effective(self) -> dict[str, str]:
        """Every setting as ``CORE_JOBS_NAME -> value``, secrets redacted, for check-config."""
        shown: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in PASSWORD_URL_SETTINGS and value is not None:
                text = redact_url(value.get_secret_value())
            elif isinstance(value, SecretStr):
                text = MASK if value.get_secret_value() else ""
            elif isinstance(value, timedelta):
                text = format_duration(value)
            elif isinstance(value, dict):
                text = json.dumps(
                    {
                        k: v.model_dump(mode="json", exclude_none=True) if isinstance(v, BaseModel) else v
                        for k, v in value.items()
                    }
                )
            elif value is None:
                text = ""
            else:
                text = str(value)
            shown[ENV_PREFIX + name.upper()] = text
        return shown


def known_variables() -> list[str]:
    """Every setting's environment variable, in field order."""
    return variable_names(Settings.model_fields)


def load_settings() -> Settings:
    """Read the settings from the environment; raise ConfigError naming the problem.

    Error messages never echo the value given: it could be a secret.
    """
    check_unknown_variables(os.environ, known_variables())
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError("; ".join(describe_error(e) for e in exc.errors())) from None
    except SettingsError as exc:
        # pydantic-settings fails this way when a JSON-valued variable does not parse.
        field = re.search(r'field "?(\w+)"?', str(exc))
        name = ENV_PREFIX + (field.group(1).upper() if field else "*")
        raise ConfigError(f"{name}: not valid JSON") from None
    try:
        settings.max_retry_window()  # builds every policy and sums its worst case, which may overflow
    except RetryPolicyError as exc:
        raise ConfigError(f"{ENV_PREFIX}RETRY_*: {exc}") from None
    # the queue URL's options, read for the redelivery horizon (maintenance/fields/horizon.py)
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}QUEUE_URL: {exc}") from None
    return settings
