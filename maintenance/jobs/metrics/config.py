"""The metrics job's configuration: :class:`MetricsConfig`, whose defaults are the settings' (``settings.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from maintenance.fields import default_of
from maintenance.jobs.metrics.settings import MetricsFields

if TYPE_CHECKING:
    from maintenance.settings import Settings

DEFAULT_MAX_TRANSACTION: timedelta = default_of(MetricsFields, "metrics_max_transaction")
DEFAULT_TENANT_LABEL: bool = default_of(MetricsFields, "metrics_tenant_label")
DEFAULT_TENANT_TOP_N: int = default_of(MetricsFields, "metrics_tenant_top_n")


@dataclass(frozen=True)
class MetricsConfig:
    """What the metrics job needs; the defaults are the settings' (above)."""

    max_transaction: timedelta = DEFAULT_MAX_TRANSACTION
    tenant_label: bool = DEFAULT_TENANT_LABEL
    tenant_top_n: int = DEFAULT_TENANT_TOP_N

    @classmethod
    def from_settings(cls, settings: Settings) -> MetricsConfig:
        return cls(settings.metrics_max_transaction, settings.metrics_tenant_label, settings.metrics_tenant_top_n)
