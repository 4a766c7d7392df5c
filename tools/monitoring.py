"""The Grafana dashboard of core-jobs, built as code, and the table of every panel and rule.

``uv run python -m tools.reference`` writes helm/core-jobs/monitoring/core-jobs-dashboard.json
from :func:`dashboard` (grafana-foundation-sdk, Grafana's own typed builders: a dev dependency,
so a production install never imports this module) and the "Alert rules and dashboard" table of
docs/metrics.md from :func:`render_table`. Nobody edits the JSON by hand:
tests/project/test_reference_docs.py fails when the committed file differs from what this module
builds, and tests/monitoring/test_monitoring.py fails when a panel or rule queries a metric core-jobs does
not export. The chart ships the JSON as a ConfigMap for Grafana's dashboard sidecar
(grafanaDashboard.enabled) and the rules (helm/core-jobs/monitoring/core-jobs.rules.yaml) as a
PrometheusRule (prometheusRule.enabled).

Every panel reads one Prometheus data source, chosen by the dashboard's ``datasource``
variable; job panels split by ``job_name``, worker panels by ``consumer`` or ``queue``. Like the
kube-prometheus mixins' dashboards, every selector is narrowed to the ``cluster``, ``namespace``
and ``job`` variables (the rules' default grouping labels), and to ``queue`` or ``consumer`` where
the metric has that label (:func:`scoped`), so one Grafana over several deployments shows one at a
time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

MONITORING_DIR = Path(__file__).resolve().parent.parent / "helm" / "core-jobs" / "monitoring"
RULES_FILE = MONITORING_DIR / "core-jobs.rules.yaml"
RULES_SOURCE = MONITORING_DIR / "core-jobs.rules.in.yaml"
CHART_VALUES = MONITORING_DIR.parent / "values.yaml"
UID = "core-jobs"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    """One panel: its title, unit (Grafana's unit ids), kind and queries."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    kind: str = "timeseries"  # or "stat"


# The dashboard's scope, as the kube-prometheus mixins' dashboards have it: every selector carries
# the deployment variables (cluster, namespace, scrape job: the rules' default grouping labels,
# prometheusRule.groupLabels) and, on a metric labelled by queue or consumer, that variable too.
SCOPE = ("cluster", "namespace", "job")
QUEUE_METRICS = ("core_jobs_dead_letters_", "harness_queue_")
CONSUMER_METRICS = (
    "harness_jobs_",
    "harness_handler_",
    "harness_leases_",
    "core_jobs_executions",
    "core_jobs_execution_",
    "core_jobs_successes_total",
)
_SELECTOR = re.compile(r"\b((?:core_jobs|harness)_[a-z_]+|up)\b(\{)?")


def scoped(expr: str) -> str:
    """``expr`` with every metric selector narrowed to the dashboard's variables."""

    def narrow(match: re.Match[str]) -> str:
        name, brace = match[1], match[2]
        labels = list(SCOPE)
        if name.startswith(QUEUE_METRICS):
            labels.append("queue")
        elif name.startswith(CONSUMER_METRICS):
            labels.append("consumer")
        matchers = ", ".join(f'{label}=~"${label}"' for label in labels)
        return f"{name}{{{matchers}" + (", " if brace else "}")

    return _SELECTOR.sub(narrow, expr)


def q(expr: str, legend: str = "") -> Query:
    return Query(scoped(expr), legend)


# Rows of panels, top to bottom. $__rate_interval lets Grafana pick a window of at least four scrapes.
ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    (
        "Jobs",
        (
            PanelSpec(
                "Runs by outcome",
                "short",
                (
                    q(
                        "sum by (job_name, outcome) (increase(core_jobs_job_runs_total[$__rate_interval]))",
                        "{{job_name}} {{outcome}}",
                    ),
                ),
                "Runs per interval (under serve; in CronJob mode each pushed group holds only its last run).",
            ),
            PanelSpec(
                "Time since last success",
                "s",
                (q("time() - max by (job_name) (core_jobs_job_last_success_timestamp_seconds)", "{{job_name}}"),),
                "Alert CoreJobsJobNotSucceeding fires past the job's expected interval.",
            ),
            PanelSpec(
                "Last run duration",
                "s",
                (q("max by (job_name) (core_jobs_job_duration_seconds)", "{{job_name}}"),),
            ),
            PanelSpec(
                "Purge: rows deleted and left",
                "short",
                (
                    q("max(core_jobs_purge_rows_deleted)", "deleted (last run)"),
                    q("max(core_jobs_purge_rows_left)", "expired rows left"),
                ),
                "Rows left above 0 on consecutive runs: the purge falls behind.",
            ),
            PanelSpec(
                "Purge: batches and longest batch",
                "s",
                (
                    q("max(core_jobs_purge_longest_batch_seconds)", "longest batch"),
                    q("max(core_jobs_purge_batches)", "batches"),
                ),
            ),
            PanelSpec(
                "Alerts: incidents",
                "short",
                (
                    q("max(core_jobs_alerts_incidents_opened)", "opened"),
                    q("max(core_jobs_alerts_incidents_resolved)", "resolved"),
                    q("max(core_jobs_alerts_escalations)", "escalations"),
                ),
                "Per run of the alerts job.",
            ),
            PanelSpec(
                "Successful jobs by consumer",
                "ops",
                (q("sum by (consumer) (rate(core_jobs_successes_total[$__rate_interval]))", "{{consumer}}"),),
                "Fences counted by the metrics job (J-B9).",
            ),
        ),
    ),
    (
        "Dead letters and reconciliation",
        (
            PanelSpec(
                "Dead letters pending",
                "short",
                (q("sum by (queue) (core_jobs_dead_letters_pending)", "{{queue}}"),),
            ),
            PanelSpec(
                "Oldest pending dead letter",
                "s",
                (q("max by (queue) (core_jobs_dead_letters_oldest_pending_age_seconds)", "{{queue}}"),),
            ),
            PanelSpec(
                "Executions by status",
                "short",
                (q("sum by (consumer, status) (core_jobs_executions)", "{{consumer}} {{status}}"),),
            ),
            PanelSpec(
                "Oldest execution awaiting reconciliation",
                "s",
                (q("max by (consumer) (core_jobs_executions_oldest_reconciliation_age_seconds)", "{{consumer}}"),),
            ),
            PanelSpec(
                "Operator resolutions",
                "short",
                (
                    q(
                        "sum by (consumer, command) (increase(core_jobs_execution_resolutions_total[$__rate_interval]))",
                        "{{consumer}} {{command}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Worker",
        (
            PanelSpec(
                "Throughput",
                "ops",
                (
                    q(
                        "sum by (consumer) (rate(harness_jobs_processed_total[$__rate_interval]))",
                        "{{consumer}} processed",
                    ),
                    q("sum by (consumer) (rate(harness_jobs_retries_total[$__rate_interval]))", "{{consumer}} retries"),
                    q(
                        "sum by (consumer) (rate(harness_jobs_dead_lettered_total[$__rate_interval]))",
                        "{{consumer}} dead-lettered",
                    ),
                    q(
                        "sum by (consumer) (rate(harness_jobs_duplicates_total[$__rate_interval]))",
                        "{{consumer}} duplicates",
                    ),
                ),
            ),
            PanelSpec(
                "Handler duration p50 / p95",
                "s",
                (
                    q(
                        "histogram_quantile(0.5, sum by (consumer, le) (rate(harness_handler_duration_seconds_bucket[$__rate_interval])))",
                        "{{consumer}} p50",
                    ),
                    q(
                        "histogram_quantile(0.95, sum by (consumer, le) (rate(harness_handler_duration_seconds_bucket[$__rate_interval])))",
                        "{{consumer}} p95",
                    ),
                ),
            ),
            PanelSpec(
                "In flight",
                "short",
                (q("sum by (consumer) (harness_jobs_in_flight)", "{{consumer}}"),),
            ),
            PanelSpec(
                "Queue depth (ready messages)",
                "short",
                (q("max by (queue) (harness_queue_depth)", "{{queue}}"),),
            ),
            PanelSpec(
                "Lag: oldest ready message",
                "s",
                (q("max by (queue) (harness_queue_oldest_ready_age_seconds)", "{{queue}}"),),
            ),
            PanelSpec(
                "Leases lost",
                "short",
                (q("sum by (consumer) (increase(harness_leases_lost_total[$__rate_interval]))", "{{consumer}}"),),
                "A worker lost its lease mid-job: another delivery may run it (the fence keeps it once).",
            ),
        ),
    ),
    (
        "Operations API",
        (
            PanelSpec(
                "Requests by status",
                "reqps",
                (q("sum by (status) (rate(core_jobs_api_requests_total[$__rate_interval]))", "{{status}}"),),
            ),
            PanelSpec(
                "5xx ratio",
                "percentunit",
                (
                    q(
                        'sum(rate(core_jobs_api_requests_total{status=~"5..", route!~"/healthz|/readyz|/metrics"}[$__rate_interval]))'
                        ' / sum(rate(core_jobs_api_requests_total{route!~"/healthz|/readyz|/metrics"}[$__rate_interval]))',
                        "5xx",
                    ),
                ),
                "Alert above 1 % (CoreJobsApiErrors).",
                kind="stat",
            ),
            PanelSpec(
                "Latency p95 by route",
                "s",
                (
                    q(
                        "histogram_quantile(0.95, sum by (route, le) "
                        '(rate(core_jobs_api_request_duration_seconds_bucket{route!~"/healthz|/readyz|/metrics"}[$__rate_interval])))',
                        "{{route}}",
                    ),
                ),
                "Budget: p95 < 1 s (docs/spec.md §7).",
            ),
            PanelSpec(
                "Scrape targets up",
                "short",
                (q('up{job=~".*core-jobs.*"}', "{{job}} {{instance}}"),),
            ),
        ),
    ),
)


def _panel(spec: PanelSpec, panel_id: int) -> timeseries.Panel | stat.Panel:
    panel = timeseries.Panel() if spec.kind == "timeseries" else stat.Panel()
    panel.id(panel_id).title(spec.title).unit(spec.unit).datasource(DATASOURCE).height(8).span(8)
    if spec.description:
        panel.description(spec.description)
    for index, query in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index)).range()
        if query.legend:
            target.legend_format(query.legend)
        panel.with_target(target)
    return panel


# What each variable lists: the values of its label on core-jobs' and the harness's series in scope.
_ANY_SERIES = '__name__=~"core_jobs_.+|harness_.+"'
_VARIABLES = (
    # (name, label, series queried, multi-valued with "All")
    ("cluster", "Cluster", _ANY_SERIES, True),
    ("namespace", "Namespace", _ANY_SERIES + ', cluster=~"$cluster"', False),
    ("job", "Scrape job", _ANY_SERIES + ', cluster=~"$cluster", namespace=~"$namespace"', True),
    ("queue", "Queue", '__name__=~"harness_queue_depth|core_jobs_dead_letters_pending", namespace=~"$namespace"', True),
    (
        "consumer",
        "Consumer",
        '__name__=~"harness_jobs_processed_total|core_jobs_executions", namespace=~"$namespace"',
        True,
    ),
)


def _variables() -> list[db.QueryVariable]:
    """The deployment and queue/consumer variables; "All" is ``.*``, which also matches a missing label."""
    found = []
    for name, label, series, multi in _VARIABLES:
        variable = (
            db.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(f"label_values({{{series}}}, {name})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
        )
        if multi:
            variable.multi(True).include_all(True).all_value(".*")
        found.append(variable)
    return found


def dashboard() -> dict[str, object]:
    """The dashboard's JSON model, as Grafana imports it."""
    builder = (
        db.Dashboard("core-jobs")
        .uid(UID)
        .description("Scheduled jobs, dead letters and reconciliation, the worker and the operations API (core-jobs).")
        .tags(["core-jobs"])
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("utc")
        .readonly()
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for variable in _variables():
        builder.with_variable(variable)
    # Stable ids (Grafana's links and state key on them): row n is 100 x n, its panels the next ids after it,
    # so adding a panel to one row moves no other row's.
    for row_number, (title, panels) in enumerate(ROWS, start=1):
        assert len(panels) < 100, f"row {title}: at most 99 panels keep the ids of the rows after it"
        builder.with_row(db.Row(title).id(100 * row_number))
        for place, spec in enumerate(panels, start=1):
            builder.with_panel(_panel(spec, 100 * row_number + place))
    model: dict[str, object] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return model


def render_dashboard() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(row, panel title, PromQL) of every dashboard target."""
    return [(row, spec.title, query.expr) for row, panels in ROWS for spec in panels for query in spec.queries]


# The interval rule of core-jobs.rules.in.yaml, repeated per job (templates/prometheusrule.yaml does the same).
_INTERVAL_RULE = re.compile(r"^      - record: core_jobs:job_success_max_age_seconds\n(?:        .*\n)+", re.MULTILINE)
_GENERATED = (
    "# GENERATED from core-jobs.rules.in.yaml with the chart's default values (values.yaml) by\n"
    "# `uv run python -m tools.reference` (tools/monitoring.py): edit the source, not this file.\n"
)


def rule_parameters(values: dict[str, Any]) -> dict[str, str]:
    """The rules' ``${...}`` parameters from the chart's values (prometheusRule.*, alerting.*)."""
    rule = values["prometheusRule"]
    return {
        "${by}": ", ".join(rule["groupLabels"]),
        "${deadLetterStaleAfterSeconds}": str(int(values["alerting"]["deadLetterStaleAfterSeconds"])),
        **{f"${{{name}}}": str(value) for name, value in sorted(rule["thresholds"].items())},
    }


def fill_rules(source: str, values: dict[str, Any]) -> str:
    """``source`` (the rules template) with the parameters of ``values`` filled in, as the chart fills them."""
    selector = values["prometheusRule"]["selector"]
    if selector:
        text = source.replace("${selector}", selector)
    else:  # no matcher to add: drop the placeholder with its comma or its braces
        text = source.replace(", ${selector}}", "}").replace("{${selector}}", "")
    for name, value in rule_parameters(values).items():
        text = text.replace(name, value)
    jobs = values["jobs"]
    within = values["prometheusRule"]["successWithinSeconds"]

    def per_job(match: re.Match[str]) -> str:
        return "".join(
            match[0].replace("${jobName}", job).replace("${successWithinSeconds}", str(int(seconds)))
            for job, seconds in within.items()
            if jobs[job]["enabled"] and not jobs[job]["suspend"]
        )

    return _INTERVAL_RULE.sub(per_job, text)


def render_rules() -> str:
    """core-jobs.rules.yaml: the rules template with the chart's default values."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    return _GENERATED + fill_rules(RULES_SOURCE.read_text(), values)


def rule_queries() -> list[tuple[str, str, str]]:
    """(group, alert or recorded series, PromQL) of every rule in the rules file."""
    groups = yaml.safe_load(render_rules())["groups"]
    found = []
    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"] + "".join(
                f'{{{k}="{v}"}}' for k, v in rule.get("labels", {}).items()
            )
            found.append((group["name"], name, " ".join(str(rule["expr"]).split())))
    return found


def render_table() -> str:
    """The Markdown table of every rule and panel with its query, for docs/metrics.md."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| where | rule or panel | query |", "|---|---|---|"]
    for group, name, expr in rule_queries():
        lines.append(f"| rule group `{group}` | `{name}` | `{cell(expr)}` |")
    for row, title, expr in dashboard_queries():
        lines.append(f"| dashboard row {row} | {title} | `{cell(expr)}` |")
    return "\n".join(lines) + "\n"
