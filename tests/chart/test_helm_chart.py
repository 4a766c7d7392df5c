"""The Helm chart helm/core-jobs, rendered offline with the real Helm library (helm-python-sdk).

Every rendered object is validated in strict mode against the schema of each Kubernetes minor
the chart claims, from Chart.yaml's kubeVersion floor up to the newest minor kubernetes-validate
ships (an install is checked against the cluster's own minor's schema, so the newest alone proves
nothing about older clusters), and the chart lints clean on each of them; the values schema must
refuse bad values, and no secret may reach a ConfigMap. No cluster and no database are needed.
"""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Iterator
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor
from support.helm_support import CHART_DIR

RELEASE = "ops"
NAMESPACE = "jobs"
SECRET = "core-jobs-secrets"
ENVIRONMENT = "production-eu"
JOBS = ("purge", "alerts", "metrics")
SECRET_SETTINGS = (
    "CORE_JOBS_DATABASE_URL",
    "CORE_JOBS_BETTERSTACK_API_TOKEN",
    "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL",
    "CORE_JOBS_QUEUE_URL",  # the broker's URL with its password: the relay's pod reads it from the Secret
)
SECRET_LOOKING = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.IGNORECASE)
CREDENTIALED_URL = re.compile(r"://[^/@\s]*@")
STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
}

# Value sets every structural test runs against (each on top of the required existingSecret).
API_ON = {
    "enabled": True,
    "jwksUrl": "https://id.ops.example/.well-known/jwks.json",
    "issuer": "https://id.ops.example/",
    "audience": "core-jobs-api",
}

# The outbox relay's Deployment (tests/chart/test_relay_chart.py).
RELAY_ON = {"enabled": True, "queues": ["points.credit", "orders.sync"]}

# Two worker groups (tests/chart/test_worker_chart.py): one of two consumers with a budget, one plain.
WORKERS = [
    {
        "name": "points",
        "consumers": ["billing.credit:consumer", "billing.refund:consumer"],
        "replicas": 2,
        "concurrency": 4,
        "env": [{"name": "CORE_JOBS_WORKER_BATCH_SIZE", "value": "20"}],
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
    },
    {"name": "ledger", "consumers": ["ledger.sync:consumer"]},
]

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "scheduler": {"mode": "scheduler"},
    "api": {"api": API_ON},
    "relay": {"relay": RELAY_ON},
    "workers": {"workers": WORKERS, "workerDefaults": {"queueUrlKey": "queue-url"}},
    "scheduler-api": {"mode": "scheduler", "api": API_ON},
    "suspended": {"jobs": {"purge": {"suspend": True}}},
    "custom-schedules": {
        "jobs": {
            "purge": {"schedule": "7 2 * * sun"},
            "alerts": {"schedule": "*/2 8-18 * * mon-fri"},
            "metrics": {"schedule": "*/5 * * * *"},
        }
    },
    "extra-env": {
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
            {"name": "SSL_CERT_FILE", "value": "/etc/ssl/certs/ca.pem"},
        ],
        "podAnnotations": {"team": "platform"},
    },
    "disabled-jobs": {"jobs": {"alerts": {"enabled": False}, "metrics": {"enabled": False}}},
    "everything": {
        "image": {"repository": "registry.example.com/core-jobs", "digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "regcred"}],
        "secrets": {"existingSecret": SECRET, "betterstackHeartbeatUrlKey": "heartbeat-url"},
        "settings": {
            "CORE_JOBS_LOG_FORMAT": "json",
            "CORE_JOBS_PROCESSED_JOBS_TTL": "P14D",
            "CORE_JOBS_TTL_MARGIN": "2",
            "CORE_JOBS_PURGE_BATCH_SIZE": "5000",
            "CORE_JOBS_METRICS_PUSHGATEWAY_URL": "http://pushgateway.monitoring:9091",
        },
        "serviceAccount": {"create": False, "name": "core-jobs-runner"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]
                }
            }
        },
        "partOf": "core-platform",
        "cronJob": {"backoffLimit": 2, "ttlSecondsAfterFinished": 3600},
    },
}


def kube_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as "1.31" or "1.31.0"."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def chart_kube_floor() -> tuple[int, int]:
    """The lowest minor Chart.yaml's kubeVersion admits; only the form ">=X.Y.0-0" is understood."""
    constraint = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0", constraint)
    assert match, f"Chart.yaml kubeVersion {constraint!r}: this test understands only '>=X.Y.0-0'"
    return int(match[1]), int(match[2])


# Every minor kubernetes-validate has schemas for ("1.25", …), and those the chart claims.
SHIPPED_KUBE_VERSIONS = sorted({major_minor(v) for v in all_versions()}, key=kube_minor)
SUPPORTED_KUBE_VERSIONS = [v for v in SHIPPED_KUBE_VERSIONS if kube_minor(v) >= chart_kube_floor()]


def with_secret(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Values with the required existingSecret and environment, plus overrides."""
    values = copy.deepcopy(overrides or {})
    values.setdefault("secrets", {}).setdefault("existingSecret", SECRET)
    values.setdefault("environment", ENVIRONMENT)
    return values


def render_objects(chart: helm_python.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders for these values (NOTES.txt left out)."""
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        obj
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for obj in yaml.safe_load_all(text)
        if obj
    ]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = of_kind(objects, kind)
    return obj


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod template) of every workload."""
    for obj in objects:
        if obj["kind"] == "CronJob":
            yield obj["metadata"]["name"], obj["spec"]["jobTemplate"]["spec"]["template"]
        elif obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], obj["spec"]["template"]


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            yield name, container


def cron_jobs_by_job(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["labels"]["app.kubernetes.io/component"]: obj for obj in of_kind(objects, "CronJob")}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS), ids=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, chart: helm_python.Chart) -> list[dict[str, Any]]:
    """The objects rendered for one of VALUE_SETS."""
    return render_objects(chart, with_secret(VALUE_SETS[request.param]))


@pytest.fixture(scope="module")
def cronjob_mode(chart: helm_python.Chart) -> list[dict[str, Any]]:
    return render_objects(chart, with_secret())


@pytest.fixture(scope="module")
def scheduler_mode(chart: helm_python.Chart) -> list[dict[str, Any]]:
    return render_objects(chart, with_secret({"mode": "scheduler"}))


# --- every value set -----------------------------------------------------------------------


def test_the_validated_minors_start_at_the_charts_kubeversion_floor():
    """kubernetes-validate has the kubeVersion floor's schema: no claimed minor goes unchecked."""
    assert SUPPORTED_KUBE_VERSIONS[:1] == ["{}.{}".format(*chart_kube_floor())], SHIPPED_KUBE_VERSIONS


@pytest.mark.parametrize("kube_version", SUPPORTED_KUBE_VERSIONS)
def test_every_manifest_validates_strictly_on_every_supported_kubernetes_minor(rendered, kube_version):
    """Each rendered object passes kubernetes-validate's strict schema of this claimed minor."""
    refused = []
    for obj in rendered:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            schema_version = kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(map(str, error.absolute_path))
            refused.append(f"{where}: {path}: {error.message}")
        else:
            assert schema_version == kube_version, f"{where}: validated against {schema_version}"
    assert refused == [], f"Kubernetes {kube_version} refuses:\n" + "\n".join(refused)


def test_every_object_carries_the_standard_labels(rendered):
    """Objects and pod templates carry exactly the app.kubernetes.io/* labels and helm.sh/chart."""
    labelled = [obj["metadata"] for obj in rendered] + [t["metadata"] for _, t in pod_templates(rendered)]
    for metadata in labelled:
        labels = metadata["labels"]
        assert set(labels) == STANDARD_LABELS
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/name"] == "core-jobs"
        assert labels["helm.sh/chart"] == "core-jobs-0.2.0"
        assert labels["app.kubernetes.io/version"] == "0.1.0"


def test_every_pod_is_hardened(rendered):
    """Pods run as non-root 10001 with seccomp, no API token, read-only root and a /tmp emptyDir."""
    for name, template in pod_templates(rendered):
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    for name, container in containers(rendered):
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        # The API's own resources (api.resources), everyone else's the chart-wide ones.
        assert container["resources"]["limits"]["memory"] == ("384Mi" if name.endswith("-api") else "256Mi"), name


def test_secrets_come_only_from_the_existing_secret(rendered):
    """Each secret setting reaches a container only as a secretKeyRef into existingSecret."""
    for name, container in containers(rendered):
        secret_env = {e["name"]: e for e in container["env"] if e["name"] in SECRET_SETTINGS}
        assert "CORE_JOBS_DATABASE_URL" in secret_env, name
        for entry in secret_env.values():
            assert set(entry) == {"name", "valueFrom"}
            assert entry["valueFrom"]["secretKeyRef"]["name"] == SECRET


def test_no_secret_value_reaches_a_config_map(rendered):
    """No ConfigMap key or value is a secret setting, looks secret, or is a URL with credentials."""
    for config_map in of_kind(rendered, "ConfigMap"):
        for key, value in config_map["data"].items():
            assert key not in SECRET_SETTINGS
            assert not SECRET_LOOKING.search(key)
            assert not CREDENTIALED_URL.search(value)
    for name, container in containers(rendered):
        for entry in container["env"]:
            if "value" in entry:
                assert not SECRET_LOOKING.search(entry["name"]), (name, entry)
                assert not CREDENTIALED_URL.search(entry["value"]), (name, entry)


@pytest.mark.parametrize("kube_version", SUPPORTED_KUBE_VERSIONS)
def test_lint_passes_strict_on_every_supported_kubernetes_minor(kube_version):
    """`helm lint --strict` against this claimed minor reports no warning or error."""
    for overrides in VALUE_SETS.values():
        report = helm_python.lint(CHART_DIR, with_secret(overrides), strict=True, kube_version=f"v{kube_version}.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_values_the_schema_refuses():
    """Lint is not vacuous: values breaking the schema come back as a lint error."""
    report = helm_python.lint(CHART_DIR, with_secret({"mode": "daemon"}), strict=True)
    assert any("mode" in error for error in report["errors"])


# --- mode cronjob --------------------------------------------------------------------------


def test_cronjob_mode_renders_one_cronjob_per_job_and_no_deployment(cronjob_mode):
    """The default mode renders a CronJob per job running `run-once <job>`, and no Deployment."""
    cron_jobs = cron_jobs_by_job(cronjob_mode)
    assert sorted(cron_jobs) == sorted(JOBS)
    for job, cron_job in cron_jobs.items():
        assert cron_job["metadata"]["name"] == f"{RELEASE}-core-jobs-{job}"
        pod = cron_job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["args"] == ["run-once", job]
        assert pod["restartPolicy"] == "Never"
    assert of_kind(cronjob_mode, "Deployment") == []
    assert of_kind(cronjob_mode, "Service") == []


def test_cronjobs_have_the_documented_defaults(cronjob_mode):
    """Schedules, Forbid, UTC, deadlines, retries, TTL, history, failure policy: as documented."""
    expected = {
        "purge": ("*/15 * * * *", 120, 840),
        "alerts": ("*/5 * * * *", 120, 240),
        "metrics": ("* * * * *", 30, 50),
    }
    for job, cron_job in cron_jobs_by_job(cronjob_mode).items():
        schedule, starting_deadline, active_deadline = expected[job]
        spec = cron_job["spec"]
        assert spec["schedule"] == schedule
        assert spec["timeZone"] == "Etc/UTC"
        assert spec["suspend"] is False
        assert spec["concurrencyPolicy"] == "Forbid"
        assert spec["startingDeadlineSeconds"] == starting_deadline
        assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (1, 3)
        job_spec = spec["jobTemplate"]["spec"]
        assert job_spec["activeDeadlineSeconds"] == active_deadline
        assert job_spec["backoffLimit"] == 0
        assert job_spec["ttlSecondsAfterFinished"] == 86400
        fail_fast, disrupted = job_spec["podFailurePolicy"]["rules"]
        assert fail_fast["action"] == "FailJob" and fail_fast["onExitCodes"]["values"] == [2]
        assert disrupted == {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }


def test_suspend_suspends_only_that_job(chart):
    """jobs.purge.suspend=true suspends the purge CronJob and leaves the others running."""
    cron_jobs = cron_jobs_by_job(render_objects(chart, with_secret(VALUE_SETS["suspended"])))
    assert {job: cj["spec"]["suspend"] for job, cj in cron_jobs.items()} == {
        "purge": True,
        "alerts": False,
        "metrics": False,
    }


def test_disabled_jobs_get_no_cronjob(chart):
    """A job with enabled=false renders no CronJob; the remaining ones still do."""
    cron_jobs = cron_jobs_by_job(render_objects(chart, with_secret(VALUE_SETS["disabled-jobs"])))
    assert sorted(cron_jobs) == ["purge"]


def test_custom_schedules_reach_cronjobs_and_scheduler_settings(chart):
    """A job's schedule is both its CronJob's schedule and its CORE_JOBS_SCHEDULE_* setting."""
    objects = render_objects(chart, with_secret(VALUE_SETS["custom-schedules"]))
    settings = only(objects, "ConfigMap")["data"]
    for job, overrides in VALUE_SETS["custom-schedules"]["jobs"].items():
        assert cron_jobs_by_job(objects)[job]["spec"]["schedule"] == overrides["schedule"]
        assert settings[f"CORE_JOBS_SCHEDULE_{job.upper()}"] == overrides["schedule"]


def test_job_keys_override_cronjob_defaults_even_when_zero(chart):
    """A job's own backoffLimit: 0 wins over a non-zero cronJob default (no falsy-merge bug)."""
    values = with_secret(
        {
            "cronJob": {"backoffLimit": 3, "successfulJobsHistoryLimit": 2},
            "jobs": {"purge": {"backoffLimit": 0, "successfulJobsHistoryLimit": 0}},
        }
    )
    cron_jobs = cron_jobs_by_job(render_objects(chart, values))
    limits = {
        job: (
            cj["spec"]["jobTemplate"]["spec"]["backoffLimit"],
            cj["spec"]["successfulJobsHistoryLimit"],
        )
        for job, cj in cron_jobs.items()
    }
    assert limits == {"purge": (0, 0), "alerts": (3, 2), "metrics": (3, 2)}


def test_long_release_names_keep_cronjob_names_within_52_characters(chart):
    """CronJob names stay within Kubernetes' 52-character limit for any release name."""
    manifests = chart.render(with_secret(), name="r" * 53, namespace=NAMESPACE)
    names = [
        obj["metadata"]["name"] for obj in yaml.safe_load_all(manifests["core-jobs/templates/cronjob.yaml"]) if obj
    ]
    assert len(names) == 3
    assert max(len(name) for name in names) <= 52
    assert len(set(names)) == 3


# --- mode scheduler ------------------------------------------------------------------------


def test_scheduler_mode_runs_one_serve_deployment_with_health_probes(scheduler_mode):
    """Mode scheduler renders one `core-jobs serve` replica with /healthz probes, and no CronJob."""
    deployment = only(scheduler_mode, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["serve"]
    assert container["ports"] == [{"name": "http", "containerPort": 9108, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert only(scheduler_mode, "ConfigMap")["data"]["CORE_JOBS_HTTP_PORT"] == "9108"
    assert of_kind(scheduler_mode, "CronJob") == []


def test_scheduler_service_exposes_metrics_to_annotation_discovery(scheduler_mode):
    """The Service selects the scheduler pod and carries prometheus.io scrape annotations."""
    service = only(scheduler_mode, "Service")
    pod_labels = only(scheduler_mode, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 9108, "targetPort": "http", "protocol": "TCP"}]
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9108",
        "prometheus.io/path": "/metrics",
    }


def test_scheduler_restarts_when_settings_change(chart):
    """The pod's config checksum follows the settings, so a changed ConfigMap rolls the pod."""

    def checksum(settings: dict[str, str]) -> str:
        objects = render_objects(chart, with_secret({"mode": "scheduler", "settings": settings}))
        return only(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum({"CORE_JOBS_LOG_FORMAT": "json"}) != checksum({"CORE_JOBS_LOG_FORMAT": "console"})


@pytest.mark.parametrize("job_override", [{"enabled": False}, {"suspend": True}], ids=["disabled", "suspended"])
def test_scheduler_mode_refuses_disabled_or_suspended_jobs(chart, job_override):
    """enabled/suspend cannot be honoured by `core-jobs serve`, so the chart refuses them there."""
    values = with_secret({"mode": "scheduler", "jobs": {"alerts": job_override}})
    with pytest.raises(helm_python.HelmRenderError, match="apply to mode cronjob only"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# --- migration hook, settings, secrets -----------------------------------------------------


def test_migration_job_is_a_pre_install_and_pre_upgrade_hook(cronjob_mode):
    """The migration Job runs `core-jobs migrate` as a pre-install/pre-upgrade hook."""
    migration = only(cronjob_mode, "Job")
    annotations = migration["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-weight"] == "-5"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    pod = migration["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["migrate"]
    assert pod["restartPolicy"] == "Never"


def test_migration_hook_needs_nothing_the_release_creates_later(cronjob_mode):
    """The hook runs before the release's ConfigMap and ServiceAccount exist, so it uses neither."""
    pod = only(cronjob_mode, "Job")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "envFrom" not in container
    assert pod["serviceAccountName"] == "default"
    inline = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert inline == only(cronjob_mode, "ConfigMap")["data"]


def test_migration_can_be_disabled(chart):
    """migration.enabled=false renders no hook Job."""
    assert of_kind(render_objects(chart, with_secret({"migration": {"enabled": False}})), "Job") == []


def test_settings_pass_through_to_the_config_map(chart):
    """Any non-secret CORE_JOBS_* setting lands verbatim in the ConfigMap that containers read."""
    objects = render_objects(chart, with_secret(VALUE_SETS["everything"]))
    config_map = only(objects, "ConfigMap")
    assert config_map["data"].items() >= VALUE_SETS["everything"]["settings"].items()
    for name, container in containers(objects):
        if "envFrom" in container:
            assert container["envFrom"] == [{"configMapRef": {"name": config_map["metadata"]["name"]}}], name


def test_extra_env_reaches_every_container(chart):
    """extraEnv entries are plain env values in every container."""
    objects = render_objects(chart, with_secret(VALUE_SETS["extra-env"]))
    for name, container in containers(objects):
        for entry in VALUE_SETS["extra-env"]["extraEnv"]:
            assert entry in container["env"], name


def test_optional_secret_keys_are_referenced_only_when_named(chart):
    """An empty key name leaves its variable unset; a named key becomes a secretKeyRef."""

    def secret_keys(secrets: dict[str, str]) -> dict[str, str]:
        objects = render_objects(chart, with_secret({"secrets": secrets}))
        (_, container), *_ = containers(objects)
        return {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if "valueFrom" in e}

    assert secret_keys({"betterstackApiTokenKey": ""}) == {"CORE_JOBS_DATABASE_URL": "database-url"}
    assert secret_keys({"betterstackHeartbeatUrlKey": "heartbeat"}) == {
        "CORE_JOBS_DATABASE_URL": "database-url",
        "CORE_JOBS_BETTERSTACK_API_TOKEN": "betterstack-api-token",
        "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL": "heartbeat",
    }


def test_workloads_run_as_the_release_service_account_without_an_api_token(cronjob_mode):
    """The chart's ServiceAccount mounts no token, and the CronJobs' pods run as it."""
    service_account = only(cronjob_mode, "ServiceAccount")
    assert service_account["automountServiceAccountToken"] is False
    for cron_job in of_kind(cronjob_mode, "CronJob"):
        pod = cron_job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == service_account["metadata"]["name"]


def test_an_existing_service_account_and_image_digest_are_used_everywhere(chart):
    """create=false uses the named ServiceAccount (hook included); a digest pins the image."""
    objects = render_objects(chart, with_secret(VALUE_SETS["everything"]))
    assert of_kind(objects, "ServiceAccount") == []
    for name, template in pod_templates(objects):
        assert template["spec"]["serviceAccountName"] == "core-jobs-runner", name
        (container,) = template["spec"]["containers"]
        assert container["image"] == "registry.example.com/core-jobs@sha256:" + "a" * 64


def test_rendering_without_existing_secret_fails_with_a_clear_message(chart):
    """Without secrets.existingSecret the chart refuses to render and says what to set."""
    with pytest.raises(helm_python.HelmRenderError, match=r"secrets\.existingSecret is required"):
        chart.render({"environment": ENVIRONMENT}, name=RELEASE, namespace=NAMESPACE)


def test_rendering_without_an_environment_fails_with_a_clear_message(chart):
    """Without `environment` the chart refuses to render and says why: the alert identity is bound to it."""
    with pytest.raises(helm_python.HelmRenderError, match=r"environment is required.*physical copy"):
        chart.render({"secrets": {"existingSecret": SECRET}}, name=RELEASE, namespace=NAMESPACE)


def test_the_schema_refuses_an_environment_with_a_space_and_the_setting_under_settings(chart):
    """`environment` is a name compared exactly (no space), and only `environment` sets it, never `settings:`."""
    with pytest.raises(helm_python.HelmValuesError, match="environment"):
        chart.validate_schema(with_secret({"environment": "staging eu"}))
    with pytest.raises(helm_python.HelmValuesError, match="CORE_JOBS_ALERTS_ENVIRONMENT"):
        chart.validate_schema(with_secret({"settings": {"CORE_JOBS_ALERTS_ENVIRONMENT": "staging"}}))


# --- the values schema ---------------------------------------------------------------------


def bad_setting(name: str, value: str) -> tuple[dict[str, Any], str]:
    """A `settings` entry the schema must refuse, and the name its complaint must mention."""
    return {"settings": {name: value}}, name


BAD_VALUES = {
    "unknown-mode": ({"mode": "daemon"}, "/mode"),
    "database-url-in-settings": bad_setting("CORE_JOBS_DATABASE_URL", "postgresql://db/x"),
    "api-token-in-settings": bad_setting("CORE_JOBS_BETTERSTACK_API_TOKEN", "t"),
    "heartbeat-url-in-settings": bad_setting(
        "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "https://uptime.example/api/v1/heartbeat/x"
    ),
    "password-looking-setting": bad_setting("CORE_JOBS_SMTP_PASSWORD", "p"),
    "credentialed-url-setting": bad_setting("CORE_JOBS_METRICS_PUSHGATEWAY_URL", "http://user:pw@push:9091"),
    "chart-managed-schedule-in-settings": bad_setting("CORE_JOBS_SCHEDULE_PURGE", "* * * * *"),
    "chart-managed-port-in-settings": bad_setting("CORE_JOBS_HTTP_PORT", "8080"),
    "non-core-jobs-setting": bad_setting("LOG_LEVEL", "debug"),
    "number-setting": ({"settings": {"CORE_JOBS_TTL_MARGIN": 2}}, "want string"),
    "secret-looking-extra-env": (
        {"extraEnv": [{"name": "API_TOKEN", "value": "t"}]},
        "/extraEnv/0/name",
    ),
    "setting-as-extra-env": (
        {"extraEnv": [{"name": "CORE_JOBS_LOG_FORMAT", "value": "json"}]},
        "/extraEnv/0/name",
    ),
    "secret-ref-as-extra-env": (
        {"extraEnv": [{"name": "X", "value": "", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "valueFrom",
    ),
    "enabled-not-boolean": ({"jobs": {"purge": {"enabled": "yes"}}}, "/jobs/purge/enabled"),
    "unknown-job": ({"jobs": {"vacuum": {"enabled": True, "schedule": "* * * * *"}}}, "vacuum"),
    "unknown-job-key": ({"jobs": {"purge": {"replicas": 2}}}, "replicas"),
    "six-field-cron": ({"jobs": {"purge": {"schedule": "0 */15 * * * *"}}}, "/jobs/purge/schedule"),
    "cron-macro": ({"jobs": {"purge": {"schedule": "@hourly"}}}, "/jobs/purge/schedule"),
    "numeric-weekday": ({"jobs": {"purge": {"schedule": "0 3 * * 0"}}}, "/jobs/purge/schedule"),
    "negative-backoff": ({"cronJob": {"backoffLimit": -1}}, "/cronJob/backoffLimit"),
    "port-as-string": ({"scheduler": {"port": "9108"}}, "/scheduler/port"),
    "unknown-top-level-key": ({"replicaCount": 2}, "replicaCount"),
}


@pytest.mark.parametrize("overrides, complaint", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_rejects_bad_values(chart, overrides, complaint):
    """The values schema refuses the value and the error names it; nothing renders."""
    values = with_secret(overrides)
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("overrides", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_schema_accepts_the_value_sets(chart, overrides):
    """Every value set the other tests render is valid, so the rejections above are specific."""
    chart.validate_schema(with_secret(overrides))


@pytest.mark.parametrize("setting", [*SECRET_SETTINGS, "CORE_JOBS_PUSH_SECRET"])
def test_template_refuses_secret_settings_even_without_the_schema(tmp_path, setting):
    """Under --skip-schema-validation the template itself still refuses secret settings."""
    unchecked = tmp_path / "core-jobs"
    shutil.copytree(CHART_DIR, unchecked)
    (unchecked / "values.schema.json").unlink()
    with (
        helm_python.Chart.load(unchecked) as chart,
        pytest.raises(helm_python.HelmRenderError, match="looks secret"),
    ):
        chart.render(with_secret({"settings": {setting: "s3cr3t"}}), name=RELEASE, namespace=NAMESPACE)


# --- Prometheus Operator monitors ------------------------------------------------------------
MONITORED = {"mode": "scheduler", "api": API_ON}


@pytest.mark.parametrize(
    ("kind", "toggle", "endpoints"),
    [
        ("ServiceMonitor", "serviceMonitor", "endpoints"),
        ("PodMonitor", "podMonitor", "podMetricsEndpoints"),
    ],
)
def test_a_monitor_toggle_scrapes_the_scheduler_and_the_api_by_their_own_labels(chart, kind, toggle, endpoints):
    """With the toggle on, one monitor per served component selects exactly that component's Service (or pods) on port http /metrics, carrying the extra labels; the rest of the release still validates strictly."""
    values = with_secret(MONITORED | {toggle: {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}})
    objects = render_objects(chart, values)
    monitors = {m["metadata"]["labels"]["app.kubernetes.io/component"]: m for m in of_kind(objects, kind)}
    assert set(monitors) == {"scheduler", "api"}
    targets = of_kind(objects, "Service") if kind == "ServiceMonitor" else [t for _, t in pod_templates(objects)]
    for component, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kps"
        selector = monitor["spec"]["selector"]["matchLabels"]
        chosen = [t for t in targets if selector.items() <= t["metadata"]["labels"].items()]
        assert len(chosen) == 1, f"{component}: selects {len(chosen)} targets"
        assert monitor["spec"][endpoints] == [
            {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
        ]
    for obj in objects:
        if obj["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(obj, SUPPORTED_KUBE_VERSIONS[-1], strict=True)


def test_no_monitor_by_default(cronjob_mode):
    """The monitors are off by default (with nothing to scrape, turning one on refuses to render:
    tests/chart/test_combinations.py)."""
    assert not [o for o in cronjob_mode if o["apiVersion"] == "monitoring.coreos.com/v1"]


def test_the_schema_refuses_a_monitor_interval_prometheus_would_not_parse(chart):
    """serviceMonitor.interval must be a Prometheus duration: "30 seconds" is refused by the values schema."""
    with pytest.raises(Exception, match="interval"):
        render_objects(chart, with_secret({"serviceMonitor": {"enabled": True, "interval": "30 seconds"}}))
