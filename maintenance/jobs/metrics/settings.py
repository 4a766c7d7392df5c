"""The metrics job's settings, declared once: each field's default, bounds, unit (its type) and description.

It is the job's configuration: :class:`~maintenance.jobs.metrics.job.MetricsJob` takes it as it is
(read from the environment as part of :class:`maintenance.settings.Settings`, which composes this
mixin from the job catalog, or built in code, ``MetricsFields(metrics_tenant_top_n=2)``), validated
by pydantic either way. The option list of ``docs/metrics.md`` and ``docs/reference/settings.md``
are generated from it (``uv run python -m tools.reference``).
Where the metrics go (the Pushgateway) is the runtime's, not this job's:
``maintenance/settings/telemetry.py``.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from maintenance.fields.crontab import Crontab
from maintenance.fields.durations import PositiveDuration


class MetricsFields(BaseModel):
    """Success counting and the tenant label's cardinality: each field is its setting ``CORE_JOBS_<FIELD>``."""

    model_config = ConfigDict(extra="forbid")  # built in code, a misspelt field is an error too

    schedule_metrics: Crontab = Field(default="* * * * *", description="`serve`: crontab (UTC) of the metrics job.")
    metrics_max_transaction: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="The longest a consumer's work transaction stays open. Success counting waits for "
        "older open transactions only up to this long, and falls back to now minus this when it "
        "cannot see every session (no pg_read_all_stats) or a prepared transaction exists.",
    )
    metrics_tenant_label: bool = Field(
        default=False,
        description="Add a tenant label to core_jobs_successes_total (at most METRICS_TENANT_TOP_N "
        'tenants per consumer, the rest as tenant="other").',
    )
    metrics_tenant_top_n: int = Field(
        default=10,
        ge=1,
        le=100,
        description="Named tenants per consumer when METRICS_TENANT_LABEL is on (cardinality cap).",
    )
