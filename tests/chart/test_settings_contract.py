"""The contract between the Helm chart and the application: what the chart gives a container,
the application accepts.

`load_settings` refuses an unknown ``CORE_JOBS_*`` variable (exit 2, the pod crash-loops), and
argparse refuses an unknown subcommand. So for the default values, mode scheduler, and a
``settings:`` map of real settings, every ``CORE_JOBS_*`` name a rendered container receives —
literal ``env``, ``secretKeyRef`` env, and the keys of a ConfigMap it reads by ``envFrom`` — must
be a real setting, the environment as a whole must load, and every ``core-jobs`` command line the
chart runs must parse (``run-once`` naming registered jobs only). The values schema lets only the
application's settings into ``settings:``, so a typo fails ``helm install`` instead of every pod;
and the scheduler pod's termination grace outlasts a run, since ``serve`` waits for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
from support.helm_support import CHART_DIR

from maintenance.cli import build_parser
from maintenance.jobs.catalog import by_name as jobs
from maintenance.settings import (
    ENV_PREFIX,
    FOREIGN_VARIABLES,
    known_variables,
    load_settings,
)
from tests.chart.test_helm_chart import (
    API_ON,
    ENVIRONMENT,
    RELAY_ON,
    SECRET_SETTINGS,
    pod_templates,
    render_objects,
    with_secret,
)

# Several real, non-secret settings with values the application accepts.
REAL_SETTINGS = {
    "CORE_JOBS_LOG_FORMAT": "json",
    "CORE_JOBS_LOG_LEVEL": "WARNING",
    "CORE_JOBS_PROCESSED_JOBS_TTL": "P14D",
    "CORE_JOBS_PURGE_BATCH_SIZE": "5000",
    "CORE_JOBS_BETTERSTACK_POLICY_ID": "P-123",
    "CORE_JOBS_ALERTS_MAX_INCIDENTS_PER_RUN": "50",
    "CORE_JOBS_METRICS_PUSHGATEWAY_URL": "http://pushgateway.monitoring:9091",
    "CORE_JOBS_METRICS_TENANT_LABEL": "true",
    "CORE_JOBS_SCHEDULER_MISFIRE_GRACE": "PT2M",
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "api": {"api": API_ON, "settings": {"CORE_JOBS_API_POOL_MAX_SIZE": "16", "CORE_JOBS_API_JWT_LEEWAY": "PT10S"}},
    "scheduler": {"mode": "scheduler"},
    "settings": {"settings": REAL_SETTINGS},
    "scheduler-settings-heartbeat": {
        "mode": "scheduler",
        "settings": REAL_SETTINGS,
        "secrets": {"betterstackHeartbeatUrlKey": "heartbeat-url"},
    },
}

# The relay's pod gets CORE_JOBS_QUEUE_URL, the adapter selection's setting: checked here once it is one.
if "CORE_JOBS_QUEUE_URL" in known_variables():
    VALUE_SETS["relay"] = {"relay": RELAY_ON}

# Stand-ins for what the Secret holds, by variable: the chart only names the keys.
SECRET_VALUES = {
    "CORE_JOBS_DATABASE_URL": "postgresql://core_jobs:pw@db.internal:5432/core",
    "CORE_JOBS_BETTERSTACK_API_TOKEN": "bs-token",
    "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL": "https://uptime.betterstack.com/api/v1/heartbeat/hb-token",
    "CORE_JOBS_QUEUE_URL": "amqp://core_jobs:pw@rabbitmq.internal:5672/%2F",
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS), ids=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, chart: helm_python.Chart) -> list[dict[str, Any]]:
    return render_objects(chart, with_secret(VALUE_SETS[request.param]))


def container_environments(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, str]]]:
    """(workload/container, {variable: value}) of every container, envFrom ConfigMaps resolved.

    A ``secretKeyRef`` variable gets its stand-in from SECRET_VALUES; an ``envFrom`` source the
    chart does not render itself (a Secret, a foreign ConfigMap) fails the test: its keys would
    be unknown here.
    """
    config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects if o["kind"] == "ConfigMap"}
    for workload, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            env: dict[str, str] = {}
            for source in container.get("envFrom") or []:
                assert set(source) <= {"configMapRef", "prefix"}, (
                    f"{workload}: envFrom {source} is not a chart ConfigMap"
                )
                name = source["configMapRef"]["name"]
                assert name in config_maps, (
                    f"{workload}: envFrom names ConfigMap {name}, which the chart does not render"
                )
                env |= {source.get("prefix", "") + key: value for key, value in config_maps[name].items()}
            for entry in container.get("env") or []:
                if "value" in entry:
                    env[entry["name"]] = entry["value"]
                else:
                    env[entry["name"]] = SECRET_VALUES.get(entry["name"], "placeholder")
            yield f"{workload}/{container['name']}", env


def command_lines(objects: list[dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    for workload, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            assert "command" not in container, f"{workload}: the image's entrypoint (core-jobs) must run"
            yield workload, list(container.get("args") or [])


def test_every_core_jobs_variable_the_chart_sets_is_a_real_setting(rendered):
    """Each CORE_JOBS_* name a container gets (env, secretKeyRef, envFrom ConfigMap keys) is in known_variables()."""
    known = set(known_variables())
    seen = set()
    for where, env in container_environments(rendered):
        ours = {name for name in env if name.startswith(ENV_PREFIX)}
        assert ours - known - FOREIGN_VARIABLES == set(), where
        assert not ours & FOREIGN_VARIABLES, f"{where}: test-only variables do not belong in a pod"
        seen |= ours
    assert "CORE_JOBS_DATABASE_URL" in seen  # the collection found the env at all


def test_every_container_environment_loads(rendered, clean_env):
    """The whole environment of each container passes load_settings (names and values)."""
    for where, env in container_environments(rendered):
        for name, value in env.items():
            clean_env.setenv(name, value)
        settings = load_settings()
        assert settings.conninfo(), where
        for name in env:
            clean_env.delenv(name)


def test_every_command_the_chart_runs_parses(rendered):
    """Each container's args, after the image's entrypoint core-jobs, form a command line build_parser() accepts."""
    dockerfile = (CHART_DIR.parents[1] / "Dockerfile").read_text()
    [entrypoint] = re.findall(r"^ENTRYPOINT\s+(.+)$", dockerfile, re.MULTILINE)
    assert json.loads(entrypoint) == ["core-jobs"]
    registered = set(jobs())
    parser = build_parser()
    ran = set()
    for workload, args in command_lines(rendered):
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{workload}: core-jobs {' '.join(args)} is not a valid command line")
        ran.add(parsed.command)
        if parsed.command == "run-once":
            assert set(parsed.jobs) <= registered, f"{workload}: runs an unregistered job {parsed.jobs}"
    assert ran & {"run-once", "serve"}  # some workload runs the jobs


def test_the_scheduler_pod_waits_for_the_run_in_hand_before_sigkill(chart, clean_env):
    """Default mode scheduler: terminationGracePeriodSeconds outlasts a purge run's budget plus its last batch.

    `serve` lets the runs in hand finish on SIGTERM; a shorter grace means SIGKILL mid-run and exit 137.
    """
    objects = render_objects(chart, with_secret({"mode": "scheduler"}))
    [(where, env)] = container_environments([o for o in objects if o["kind"] in ("Deployment", "ConfigMap")])
    for name, value in env.items():
        clean_env.setenv(name, value)
    settings = load_settings()
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    longest_run = settings.purge_max_runtime + settings.purge_statement_timeout
    assert grace > longest_run.total_seconds(), where


def test_every_container_runs_as_the_declared_environment(rendered):
    """Each container's CORE_JOBS_ALERTS_ENVIRONMENT is the values' `environment` (the alert identity is bound to it)."""
    for where, env in container_environments(rendered):
        assert env.get("CORE_JOBS_ALERTS_ENVIRONMENT") == ENVIRONMENT, where


def test_the_values_schema_allows_exactly_the_settings_the_application_knows():
    """settings: accepts every real non-secret setting the chart does not manage itself, and nothing else."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    allowed = set(schema["definitions"]["knownSetting"]["enum"])
    chart_managed = re.compile(
        r"^CORE_JOBS_(SCHEDULE_.*|HTTP_PORT|ALERTS_ENVIRONMENT|DEAD_LETTER_STALE_AFTER|WORKER_CONSUMERS|API_(HOST|PORT|JWKS_URL|JWT_ISSUER|JWT_AUDIENCE|JWT_PUBLIC_KEY_FILE))$"
    )
    expected = {n for n in known_variables() if n not in SECRET_SETTINGS and not chart_managed.match(n)}
    assert allowed == expected, "update definitions.knownSetting in helm/core-jobs/values.schema.json"


def test_a_misspelt_setting_is_refused_before_any_pod_starts(chart):
    """A typo in settings: fails schema validation naming it, instead of pods that exit 2 at start."""
    with pytest.raises(helm_python.HelmValuesError, match="CORE_JOBS_STALE_AFTER"):
        chart.validate_schema(with_secret({"settings": {"CORE_JOBS_STALE_AFTER": "P2D"}}))
