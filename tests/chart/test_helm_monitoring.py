"""The chart's monitoring toggles: prometheusRule renders the rules file as a PrometheusRule,
grafanaDashboard the dashboard JSON as a ConfigMap for Grafana's sidecar.

Rendered offline like tests/chart/test_helm_chart.py. The ConfigMap is validated strictly on every
Kubernetes minor the chart claims; the PrometheusRule is a custom resource kubernetes-validate
has no schema for, so its metadata is validated as an ObjectMeta on each minor and its spec by
Prometheus's own `promtool check rules` and `promtool test rules` (what the operator hands to
Prometheus is exactly ``spec.groups``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml
from support.helm_support import CHART_DIR

from tests.chart.test_helm_chart import SUPPORTED_KUBE_VERSIONS, of_kind, only, render_objects, with_secret

MONITORING = CHART_DIR / "monitoring"
PUSHGATEWAY = {"CORE_JOBS_METRICS_PUSHGATEWAY_URL": "http://pushgateway.monitoring:9091"}
# In mode cronjob the rules need a Pushgateway (tests/chart/test_combinations.py).
ON = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}, "settings": PUSHGATEWAY}
VALUE_SETS = {
    "cronjob-monitoring": ON,
    "scheduler-monitoring": {**ON, "mode": "scheduler"},
    "monitoring-labelled": {
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "runbookBaseUrl": "https://git.example.com/ops/core-jobs/blob/main/",
            "successWithinSeconds": {"purge": 7200, "alerts": 1200, "metrics": 600},
        },
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Platform"}},
        "jobs": {"alerts": {"enabled": False}},
        "settings": PUSHGATEWAY,
    },
}
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module", params=sorted(VALUE_SETS), ids=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, chart: helm_python.Chart) -> list[dict]:
    return render_objects(chart, with_secret(VALUE_SETS[request.param]))


def recorded_intervals(rule: dict) -> dict[str, str]:
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "core-jobs-expected-intervals"]
    return {r["labels"]["job_name"]: r["expr"] for r in group["rules"]}


def test_monitoring_is_off_by_default(chart):
    """Without the toggles the chart renders no PrometheusRule and no dashboard ConfigMap."""
    objects = render_objects(chart, with_secret())
    assert of_kind(objects, "PrometheusRule") == []
    assert all(not o["metadata"]["name"].endswith("-dashboard") for o in of_kind(objects, "ConfigMap"))


@pytest.mark.parametrize("kube_version", SUPPORTED_KUBE_VERSIONS)
def test_monitoring_objects_validate_strictly_on_every_supported_kubernetes_minor(rendered, kube_version):
    """The dashboard ConfigMap, and the PrometheusRule's metadata, pass this minor's strict schema."""
    rule = only(rendered, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    as_meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": rule["metadata"], "data": {}}
    dashboard = next(o for o in of_kind(rendered, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard"))
    for obj in (as_meta, dashboard):
        kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("kube_version", SUPPORTED_KUBE_VERSIONS)
def test_lint_passes_strict_with_the_monitoring_toggles_on(kube_version):
    """`helm lint --strict` against this claimed minor reports nothing with every monitoring value set."""
    for overrides in VALUE_SETS.values():
        report = helm_python.lint(CHART_DIR, with_secret(overrides), strict=True, kube_version=f"v{kube_version}.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_prometheus_rule_carries_the_rules_file_with_an_interval_per_running_job(chart):
    """Every alert of the rules file is in the PrometheusRule; intervals come from the values, disabled jobs get none."""
    source = yaml.safe_load((MONITORING / "core-jobs.rules.yaml").read_text())
    alerts = [r for g in source["groups"] for r in g["rules"] if "alert" in r]
    rule = only(render_objects(chart, with_secret(VALUE_SETS["monitoring-labelled"])), "PrometheusRule")
    rendered_alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert [r["alert"] for r in rendered_alerts] == [r["alert"] for r in alerts]
    per_deployment = "group by (cluster, namespace, job) (core_jobs_job_runs_total) * "
    assert recorded_intervals(rule) == {"purge": per_deployment + "7200", "metrics": per_deployment + "600"}
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for alert in rendered_alerts:
        assert alert["annotations"]["runbook_url"].startswith(
            "https://git.example.com/ops/core-jobs/blob/main/docs/runbook.md#"
        )


def rendered_rules(chart: helm_python.Chart, values: dict) -> dict[str, str]:
    """alert or recorded series -> its expression, one line, from the PrometheusRule these values render."""
    rule_values = {"enabled": True, **values.get("prometheusRule", {})}
    with_rules = with_secret({**values, "settings": PUSHGATEWAY, "prometheusRule": rule_values})
    rule = only(render_objects(chart, with_rules), "PrometheusRule")
    return {
        r.get("alert") or f"{r['record']}{{{r['labels']['job_name']}}}": " ".join(r["expr"].split())
        for g in rule["spec"]["groups"]
        for r in g["rules"]
    }


def test_every_rule_aggregates_by_the_group_labels_and_selects_by_the_selector(chart):
    """prometheusRule.selector reaches every selector and groupLabels every aggregation and join (the mixins' way)."""
    exprs = rendered_rules(
        chart, {"prometheusRule": {"selector": 'namespace="jobs"', "groupLabels": ["region", "namespace"]}}
    )
    for name, expr in exprs.items():
        selectors = re.findall(r"\b(?:core_jobs|harness|up)[\w:]*(?:\{[^}]*\})?", expr)
        assert selectors, name
        for selector in selectors:
            if not selector.startswith("core_jobs:"):  # a recorded series is already scoped
                assert 'namespace="jobs"' in selector, (name, selector)
        for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            assert clause.startswith("region, namespace"), (name, clause)
        assert "cluster, namespace, job" not in expr and "${" not in expr, name


def test_the_stale_dead_letter_threshold_is_the_alerts_jobs_setting(chart):
    """alerting.deadLetterStaleAfterSeconds sets CORE_JOBS_DEAD_LETTER_STALE_AFTER and the stale rule's threshold."""
    values = {"alerting": {"deadLetterStaleAfterSeconds": 86400}}
    assert rendered_rules(chart, values)["CoreJobsDeadLettersPendingTooLong"].endswith("> 86400")
    objects = render_objects(chart, with_secret(values))
    (config_map,) = [o for o in of_kind(objects, "ConfigMap") if not o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["data"]["CORE_JOBS_DEAD_LETTER_STALE_AFTER"] == "86400"
    assert rendered_rules(chart, {})["CoreJobsDeadLettersPendingTooLong"].endswith("> 259200")


def test_the_stale_after_setting_belongs_to_the_alerting_value(chart):
    """Set in `settings`, the stale age could drift from the rule's: the schema refuses it there."""
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(with_secret({"settings": {"CORE_JOBS_DEAD_LETTER_STALE_AFTER": "P2D"}}))


@pytest.mark.parametrize(
    "rule",
    [
        {"groupLabels": []},
        {"groupLabels": ["job_name"]},
        {"selector": "namespace=jobs"},
        {"selector": '{namespace="jobs"}'},
    ],
    ids=["no-group-labels", "a-rule-label-as-group-label", "unquoted-selector", "selector-in-braces"],
)
def test_the_schema_refuses_a_selector_or_group_labels_promql_would_not_take(chart, rule):
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(with_secret({"prometheusRule": {"enabled": True, **rule}}))


def test_the_default_intervals_equal_the_rules_files(chart):
    """With default values the rendered spec.groups equal the plain rules file: one source, two forms."""
    source = yaml.safe_load((MONITORING / "core-jobs.rules.yaml").read_text())
    rule = only(render_objects(chart, with_secret(ON)), "PrometheusRule")
    assert sorted(rule["spec"]["groups"][0]["rules"], key=str) == sorted(source["groups"][0]["rules"], key=str)
    assert rule["spec"]["groups"][1:] == source["groups"][1:]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run installs it)")
def test_promtool_checks_and_unit_tests_the_rendered_rules(chart, tmp_path: Path):
    """The PrometheusRule's spec.groups pass `promtool check rules` and the rules file's unit tests."""
    rule = only(render_objects(chart, with_secret(ON)), "PrometheusRule")
    (tmp_path / "rendered.rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    tests = yaml.safe_load((MONITORING / "core-jobs.rules.test.yaml").read_text())
    tests["rule_files"] = ["rendered.rules.yaml"]
    (tmp_path / "rendered.test.yaml").write_text(yaml.safe_dump(tests))
    for args in (["check", "rules", "rendered.rules.yaml"], ["test", "rules", "rendered.test.yaml"]):
        result = subprocess.run(
            [PROMTOOL, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_config_map_carries_the_generated_json_and_the_sidecar_label(chart):
    """The ConfigMap holds core-jobs-dashboard.json verbatim under the sidecar's label and the given annotations."""
    objects = render_objects(chart, with_secret(VALUE_SETS["monitoring-labelled"]))
    (config_map,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Platform"}
    expected = json.loads((MONITORING / "core-jobs-dashboard.json").read_text())
    assert json.loads(config_map["data"]["core-jobs.json"]) == expected
