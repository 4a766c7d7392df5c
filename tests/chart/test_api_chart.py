"""The chart's optional operations-API Deployment and Service (issue 11).

Every-minor validation and pod hardening run on the API's value sets in tests/chart/test_helm_chart.py
(``api``, ``scheduler-api``); the settings contract in tests/chart/test_settings_contract.py.
"""

from __future__ import annotations

import helm_python
import pytest

from tests.chart.test_helm_chart import API_ON, of_kind, render_objects, with_secret


@pytest.fixture(scope="module")
def api_mode(chart):
    return render_objects(chart, with_secret({"api": API_ON}))


def api_objects(objects, kind):
    return [o for o in of_kind(objects, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == "api"]


def test_the_api_is_off_by_default(chart):
    """Without api.enabled the chart renders no API Deployment or Service."""
    objects = render_objects(chart, with_secret())
    assert api_objects(objects, "Deployment") == [] and api_objects(objects, "Service") == []


def test_the_api_deployment_runs_core_jobs_api_with_both_probes(api_mode):
    """`core-jobs api` on the API port, liveness on /healthz, readiness on /readyz, its own resources."""
    (deployment,) = api_objects(api_mode, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == ["api"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "192Mi"}
    assert spec["terminationGracePeriodSeconds"] == 30 and deployment["spec"]["replicas"] == 2


def test_the_api_gets_its_own_database_login_and_no_other_secret(api_mode):
    """CORE_JOBS_DATABASE_URL comes from api.databaseUrlKey; the Better Stack secrets never reach the API pod."""
    (deployment,) = api_objects(api_mode, "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CORE_JOBS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "api-database-url"
    assert {n for n, e in env.items() if "valueFrom" in e} == {"CORE_JOBS_DATABASE_URL"}
    assert env["CORE_JOBS_API_JWKS_URL"]["value"] == API_ON["jwksUrl"]
    assert (env["CORE_JOBS_API_JWT_ISSUER"]["value"], env["CORE_JOBS_API_JWT_AUDIENCE"]["value"]) == (
        API_ON["issuer"],
        API_ON["audience"],
    )


def test_the_api_service_targets_the_api_pods_and_is_scraped(api_mode):
    """The Service selects the API component only and carries the prometheus.io annotations for /metrics."""
    (service,) = api_objects(api_mode, "Service")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "api"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert service["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("missing", ["jwksUrl", "issuer", "audience"])
def test_an_enabled_api_without_its_issuer_settings_fails_to_render(chart, missing):
    """api.enabled without the JWKS URL, issuer or audience fails the install, naming the value."""
    values = {**API_ON, missing: ""}
    with pytest.raises(helm_python.HelmError, match=f"api.{missing} is required"):
        render_objects(chart, with_secret({"api": values}))


def test_chart_managed_api_settings_are_refused_in_settings(chart):
    """CORE_JOBS_API_JWKS_URL belongs to api.jwksUrl: the values schema refuses it in settings."""
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(with_secret({"settings": {"CORE_JOBS_API_JWKS_URL": "https://x.example/jwks"}}))
