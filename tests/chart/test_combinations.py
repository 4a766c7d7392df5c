"""Every combination of chart values either works or refuses to render, naming the value to change.

A combination that renders but cannot work is worse than a refusal: the default chart with the
PrometheusRule on in mode cronjob and no Pushgateway installs silently and pages
CoreJobsMetricsAbsent (critical) a quarter of an hour later; a ServiceMonitor with nothing to
scrape was dropped without a word. templates/validate.yaml refuses each; this module renders each
refused combination, and the working neighbour of each.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.chart.test_helm_chart import API_ON, of_kind, render_objects, with_secret

PUSHGATEWAY = {"CORE_JOBS_METRICS_PUSHGATEWAY_URL": "http://pushgateway.monitoring:9091"}

# (values, a pattern of the refusal, which names the value to change)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "rules-in-cronjob-mode-without-a-pushgateway": (
        {"prometheusRule": {"enabled": True}},
        r"prometheusRule\.enabled with mode cronjob needs settings\.CORE_JOBS_METRICS_PUSHGATEWAY_URL",
    ),
    "rules-in-cronjob-mode-with-the-api-but-no-pushgateway": (
        {"prometheusRule": {"enabled": True}, "api": API_ON},
        r"settings\.CORE_JOBS_METRICS_PUSHGATEWAY_URL",
    ),
    "service-monitor-with-nothing-to-scrape": (
        {"serviceMonitor": {"enabled": True}},
        r"serviceMonitor\.enabled: nothing in this release serves /metrics.*mode: scheduler or api\.enabled",
    ),
    "pod-monitor-with-nothing-to-scrape": (
        {"podMonitor": {"enabled": True}},
        r"podMonitor\.enabled: nothing in this release serves /metrics",
    ),
    "service-and-pod-monitor-at-once": (
        {"mode": "scheduler", "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        r"serviceMonitor\.enabled and podMonitor\.enabled: every target would be scraped twice",
    ),
}

WORKING: dict[str, dict[str, Any]] = {
    "rules-in-cronjob-mode-with-a-pushgateway": {"prometheusRule": {"enabled": True}, "settings": PUSHGATEWAY},
    "rules-in-scheduler-mode": {"mode": "scheduler", "prometheusRule": {"enabled": True}},
    "service-monitor-on-the-scheduler": {"mode": "scheduler", "serviceMonitor": {"enabled": True}},
    "service-monitor-on-the-api-in-cronjob-mode": {"api": API_ON, "serviceMonitor": {"enabled": True}},
    "pod-monitor-on-the-scheduler": {"mode": "scheduler", "podMonitor": {"enabled": True}},
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_combination_that_cannot_work_refuses_to_render_naming_the_value(chart, name):
    values, message = REFUSED[name]
    with pytest.raises(helm_python.HelmError, match=message):
        render_objects(chart, with_secret(values))


@pytest.mark.parametrize("name", sorted(WORKING))
def test_its_working_neighbour_renders_what_it_asks_for(chart, name):
    values = WORKING[name]
    objects = render_objects(chart, with_secret(values))
    wanted = {
        "PrometheusRule": values.get("prometheusRule", {}).get("enabled", False),
        "ServiceMonitor": values.get("serviceMonitor", {}).get("enabled", False),
        "PodMonitor": values.get("podMonitor", {}).get("enabled", False),
    }
    for kind, on in wanted.items():
        assert bool(of_kind(objects, kind)) == on, kind
