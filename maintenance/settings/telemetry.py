"""Telemetry settings: where every job run pushes its metrics (the Pushgateway).

The push is ``maintenance/service/telemetry.py``; the metrics job's own settings (success
counting, the tenant label) are ``maintenance/jobs/metrics/settings.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, field_validator

from maintenance.fields.durations import PositiveDuration
from maintenance.fields.urls import check_http_url

DEFAULT_METRICS_PUSH_TIMEOUT = timedelta(seconds=10)  # per push


class TelemetryFields(BaseModel):
    """The Pushgateway every job run pushes to."""

    metrics_pushgateway_url: str | None = Field(
        default=None,
        description="Prometheus Pushgateway base URL (http:// or https://, no credentials). When set, "
        "every job run pushes its metrics there (job label core-jobs, grouped by job_name); a failed "
        "push is logged, never fatal. Unset: metrics are only logged and served by `serve`.",
    )
    metrics_push_timeout: PositiveDuration = Field(
        default=DEFAULT_METRICS_PUSH_TIMEOUT, description="Timeout of one Pushgateway push."
    )

    @field_validator("metrics_pushgateway_url", mode="before")
    @classmethod
    def _pushgateway_url(cls, value: Any) -> Any:
        if value is None or str(value).strip() == "":
            return None
        return check_http_url(str(value), credentials_hint="; protect the Pushgateway by network policy")
