"""The alert rules and the dashboard the chart ships (helm/core-jobs/monitoring/) are valid and
query only what core-jobs exports.

The rules go through Prometheus's own tooling: ``promtool check rules`` and ``promtool test
rules`` on the unit tests next to them (Debian's ``prometheus`` package; .ci/run installs it, a
machine without it skips those two with the reason). Every alert links a section of
docs/runbook.md. Every metric a rule or a dashboard panel queries must be in the names contract
(tests/support/monitoring_contract.py), and the contracted names that exist today must be what the real
/metrics of `serve` and of the API serve.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT
from support.markdown import anchors
from support.monitoring_contract import PROMETHEUS_OWN, exported_families, exported_series

from harness.metrics import HarnessMetrics
from maintenance.service.http import make_server, serve_in_background
from maintenance.service.runner import build_jobs, job_env, run_job
from maintenance.service.telemetry import Telemetry
from maintenance.settings import Settings

MONITORING = ROOT / "helm" / "core-jobs" / "monitoring"
RULES = MONITORING / "core-jobs.rules.yaml"
RULE_TESTS = MONITORING / "core-jobs.rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run installs it)"
)


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120, check=False)


@needs_promtool
def test_promtool_check_rules_accepts_the_rules_file():
    """`promtool check rules` finds the rules file valid."""
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_of_every_alert_pass():
    """`promtool test rules` passes the unit tests, which show each alert both firing and silent."""
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tested for case in test.get("alert_rule_test", [])]
    for rule in alert_rules():
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == rule["alert"]}
        assert outcomes == {True, False}, f"{rule['alert']} is not tested both firing and silent"


@pytest.mark.pure
def test_every_alert_has_a_runbook_url_to_a_runbook_section():
    """Each alert's runbook_url is docs/runbook.md#<a heading of docs/runbook.md>, and it names a severity."""
    sections = anchors(RUNBOOK.read_text())
    for rule in alert_rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbook.md", rule["alert"]
        assert anchor in sections, f"{rule['alert']}: no heading #{anchor} in docs/runbook.md"
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]


# --- every queried metric is exported ----------------------------------------------------------

# PromQL has no Python parser; this strips what is not a metric name: strings, label matchers,
# range/subquery brackets, the label lists of by/without/on/ignoring/group_*, numbers and
# durations, then keeps the identifiers that are neither keywords nor called (functions, aggregations).
PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
PROMQL_MATCHERS = re.compile(r"\{[^{}]*\}")
PROMQL_RANGE = re.compile(r"\[[^\[\]]*\]")
PROMQL_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
PROMQL_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = PROMQL_STRING.sub('""', expr)
    text = PROMQL_MATCHERS.sub("", text)
    text = PROMQL_RANGE.sub("", text)
    text = PROMQL_LABEL_LIST.sub("", text)
    return {name for name, call in PROMQL_IDENTIFIER.findall(text) if not call and name.lower() not in PROMQL_KEYWORDS}


def queried() -> dict[str, set[str]]:
    """Every metric name queried, with where: the rules file's rules and the dashboard JSON's targets."""
    where: dict[str, set[str]] = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for name in metric_names(str(rule["expr"])):
                where.setdefault(name, set()).add(f"rule {rule.get('alert') or rule['record']}")
    dashboard = json.loads((MONITORING / "core-jobs-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in metric_names(target["expr"]):
                where.setdefault(name, set()).add(f"panel {panel['title']}")
    return where


def recorded() -> set[str]:
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}


@pytest.mark.pure
def test_the_promql_name_scan_finds_selectors_and_skips_functions_labels_and_keywords():
    """metric_names keeps metric selectors and drops functions, label names and values, durations and keywords."""
    expr = (
        'sum by (job_name, le) (rate(a_total{status=~"5..", route!~"/x|b_total"}[5m])) / on (job_name) '
        "group_left () b:rec unless histogram_quantile(0.9, c_bucket[$__rate_interval] offset 1h) > bool 1e3"
    )
    assert metric_names(expr) == {"a_total", "b:rec", "c_bucket"}


@pytest.mark.pure
def test_every_rule_and_panel_queries_only_exported_metrics():
    """Each metric name a rule or dashboard panel queries is exported by a process (its collectors), Prometheus's own, or recorded here."""
    known = exported_series() | PROMETHEUS_OWN | recorded()
    unknown = {name: sorted(places) for name, places in queried().items() if name not in known}
    assert unknown == {}, f"queried but not exported: {unknown}"
    assert len(queried()) >= 20  # the scan is not vacuous


def scraped_families(text: str) -> dict[str, str]:
    """{family name: type} of a Prometheus text exposition."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_every_exported_family_is_scraped_from_serve_the_api_and_the_worker(db, database_url, api):
    """Every family the collectors declare is on serve's /metrics (after a run of each job), the API's or the worker's registry, with its type."""
    settings = Settings(database_url=database_url)
    telemetry = Telemetry()
    for spec, job in build_jobs(settings, job_env(settings, db), ["purge", "alerts", "metrics"]):
        run_job(spec, job, db, telemetry)
    server = make_server("127.0.0.1", 0, health=lambda: (True, {}), registry=telemetry.registry)
    serve_in_background(server)
    try:
        serve = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    api.get("/v1/core/dead-letters")
    families = scraped_families(serve.text) | scraped_families(api.get("/metrics").text)
    harness = HarnessMetrics(registry=CollectorRegistry())
    harness.watch("points.credit", "points.credit")
    harness.processed("points.credit")
    harness.duplicate("points.credit")
    harness.retry("points.credit")
    harness.dead_lettered("points.credit", "poison")
    families |= scraped_families(generate_latest(harness.registry).decode())
    missing = [f"{name} ({kind})" for name, kind in exported_families().items() if families.get(name) != kind]
    assert missing == [], f"declared, not scraped with that type: {missing}; scraped: {sorted(families)}"


@pytest.mark.pure
def test_every_dashboard_query_is_scoped_by_the_cluster_namespace_and_job_variables():
    """One Prometheus watching staging and production: every panel's query selects by the dashboard's cluster,
    namespace and job variables, and a harness series by its queue or consumer too, so no environment's series
    hides another's."""
    dashboard = json.loads((MONITORING / "core-jobs-dashboard.json").read_text())
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"cluster", "namespace", "job", "queue", "consumer"} <= variables
    unscoped = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            wanted = [f'{label}=~"${label}"' for label in ("cluster", "namespace", "job")]
            missing = [matcher for matcher in wanted if matcher not in expr]
            if "harness_" in expr and 'queue=~"$queue"' not in expr and 'consumer=~"$consumer"' not in expr:
                missing.append("queue or consumer")
            if missing:
                unscoped.append((panel["title"], missing))
    assert dashboard["panels"] and unscoped == []


def test_every_dashboard_panel_and_row_has_a_unique_id_kept_by_its_row():
    """Grafana keys links (``viewPanel=``), annotations and library state on panel ids: every panel and row of the
    committed JSON has one, unique, and a panel's id is its row's hundred plus its place, so adding a panel to one
    row moves no other row's ids."""
    panels = json.loads((MONITORING / "core-jobs-dashboard.json").read_text())["panels"]
    ids = [panel.get("id") for panel in panels]
    assert all(isinstance(i, int) and i > 0 for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    row_id = 0
    for panel in panels:
        if panel["type"] == "row":
            row_id = panel["id"]
            assert row_id % 100 == 0, panel["title"]
        else:
            assert row_id < panel["id"] < row_id + 100, panel["title"]
