"""The metric names the alert rules and the dashboard may query: what the processes export, plus Prometheus's own.

What is exported is read from the exporting collectors themselves (``tools.reference.collect_metrics``,
which also writes docs/reference/metrics.md), so a rule or a panel that queries a renamed or removed
metric fails tests/monitoring/test_monitoring.py.
"""

from __future__ import annotations

from tools.reference import collect_metrics

PROMETHEUS_OWN = frozenset({"up"})


def exported_series() -> set[str]:
    """The sample names PromQL can query for every exported family (a histogram's _bucket, _count and _sum)."""
    names: set[str] = set()
    for family in collect_metrics():
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
        else:
            names.add(family.name)
    return names


def exported_families() -> dict[str, str]:
    """{family name as prometheus_client's parser gives it (no _total): type} of every exported family."""
    return {f.name.removesuffix("_total") if f.type == "counter" else f.name: f.type for f in collect_metrics()}
