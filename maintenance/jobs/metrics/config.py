"""The metrics job's configuration: named defaults with their units, and :class:`MetricsConfig`.

The settings (``maintenance/settings/metrics.py``) take their defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maintenance.settings import Settings

DEFAULT_MAX_TRANSACTION = timedelta(minutes=5)  # the longest a consumer's work transaction stays open
DEFAULT_TENANT_LABEL = False  # no tenant label on core_jobs_successes_total
DEFAULT_TENANT_TOP_N = 10  # named tenants per consumer when the label is on
DEFAULT_SCHEDULE = "* * * * *"  # crontab (UTC) under `core-jobs serve`


@dataclass(frozen=True)
class MetricsConfig:
    """What the metrics job needs; the defaults are the named constants above."""

    max_transaction: timedelta = DEFAULT_MAX_TRANSACTION
    tenant_label: bool = DEFAULT_TENANT_LABEL
    tenant_top_n: int = DEFAULT_TENANT_TOP_N

    @classmethod
    def from_settings(cls, settings: Settings) -> MetricsConfig:
        return cls(settings.metrics_max_transaction, settings.metrics_tenant_label, settings.metrics_tenant_top_n)
