"""Metrics settings (issue 5): the Pushgateway, the success-counting horizon and the tenant label.

The metrics job is ``maintenance/jobs/metrics/__init__.py``, the push ``maintenance/runtime/telemetry.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, field_validator

from maintenance.jobs.metrics.config import (  # the job owns its defaults; the settings import them
    DEFAULT_MAX_TRANSACTION as DEFAULT_METRICS_MAX_TRANSACTION,
)
from maintenance.jobs.metrics.config import (
    DEFAULT_TENANT_LABEL as DEFAULT_METRICS_TENANT_LABEL,
)
from maintenance.jobs.metrics.config import (
    DEFAULT_TENANT_TOP_N as DEFAULT_METRICS_TENANT_TOP_N,
)
from maintenance.settings.durations import PositiveDuration
from maintenance.settings.urls import check_http_url

DEFAULT_METRICS_PUSH_TIMEOUT = timedelta(seconds=10)  # per push


class MetricsFields(BaseModel):
    """Pushgateway, success counting, tenant label cardinality."""

    metrics_pushgateway_url: str | None = Field(
        default=None,
        description="Prometheus Pushgateway base URL (http:// or https://, no credentials). When set, "
        "every job run pushes its metrics there (job label core-jobs, grouped by job_name); a failed "
        "push is logged, never fatal. Unset: metrics are only logged and served by `serve`.",
    )
    metrics_push_timeout: PositiveDuration = Field(
        default=DEFAULT_METRICS_PUSH_TIMEOUT, description="Timeout of one Pushgateway push."
    )
    metrics_max_transaction: PositiveDuration = Field(
        default=DEFAULT_METRICS_MAX_TRANSACTION,
        description="The longest a consumer's work transaction stays open. Success counting waits for "
        "older open transactions only up to this long, and falls back to now minus this when it "
        "cannot see every session (no pg_read_all_stats) or a prepared transaction exists.",
    )
    metrics_tenant_label: bool = Field(
        default=DEFAULT_METRICS_TENANT_LABEL,
        description="Add a tenant label to core_jobs_successes_total (at most METRICS_TENANT_TOP_N "
        'tenants per consumer, the rest as tenant="other").',
    )
    metrics_tenant_top_n: int = Field(
        default=DEFAULT_METRICS_TENANT_TOP_N,
        ge=1,
        le=100,
        description="Named tenants per consumer when METRICS_TENANT_LABEL is on (cardinality cap).",
    )

    @field_validator("metrics_pushgateway_url", mode="before")
    @classmethod
    def _pushgateway_url(cls, value: Any) -> Any:
        if value is None or str(value).strip() == "":
            return None
        return check_http_url(str(value), credentials_hint="; protect the Pushgateway by network policy")
