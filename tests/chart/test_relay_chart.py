"""The chart's optional outbox relay Deployment (``core-jobs relay``, docs/outbox.md).

Every-minor validation and pod hardening run on the ``relay`` value set in tests/chart/test_helm_chart.py;
the settings contract (tests/chart/test_settings_contract.py) joins it once ``CORE_JOBS_QUEUE_URL`` is a setting.
"""

from __future__ import annotations

import helm_python
import pytest

from tests.chart.test_helm_chart import RELAY_ON, SECRET, of_kind, render_objects, with_secret


@pytest.fixture(scope="module")
def relay_mode(chart):
    return render_objects(chart, with_secret({"relay": RELAY_ON}))


def relay_objects(objects):
    return [
        o for o in of_kind(objects, "Deployment") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "relay"
    ]


def test_the_relay_is_off_by_default(chart):
    """Without relay.enabled the chart renders no relay Deployment."""
    assert relay_objects(render_objects(chart, with_secret())) == []


def test_the_relay_runs_core_jobs_relay_for_each_queue_with_its_interval_and_resources(relay_mode):
    """`core-jobs relay --queue Q --queue Q2 --interval 1 --batch-size 100`, one replica, its own resources and grace period."""
    (deployment,) = relay_objects(relay_mode)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == [
        "relay",
        "--queue",
        "points.credit",
        "--queue",
        "orders.sync",
        "--interval",
        "1",
        "--batch-size",
        "100",
    ]
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert deployment["spec"]["replicas"] == 1 and spec["terminationGracePeriodSeconds"] == 30


def test_the_brokers_url_comes_from_the_secret_and_appears_nowhere_else(relay_mode):
    """CORE_JOBS_QUEUE_URL is a secretKeyRef of relay.queueUrlKey in the existing Secret, beside the database URL; no value or arg carries a URL."""
    (deployment,) = relay_objects(relay_mode)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["CORE_JOBS_QUEUE_URL"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "queue-url"}
    assert env["CORE_JOBS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-url"
    assert not any("://" in str(a) for a in container["args"])
    assert not any("://" in e.get("value", "") for e in container["env"])


def test_an_enabled_relay_without_queues_fails_to_render(chart):
    """relay.enabled with no queue fails the install, naming relay.queues."""
    with pytest.raises(helm_python.HelmError, match=r"relay\.queues is required"):
        render_objects(chart, with_secret({"relay": {"enabled": True}}))


@pytest.mark.parametrize(
    "relay",
    [
        {"enabled": True, "queues": ["bad queue"]},
        {"enabled": True, "queues": ["q"], "intervalSeconds": 0},
        {"enabled": True, "queues": ["q"], "queueUrl": "amqp://user:pw@rabbitmq/"},
    ],
    ids=["queue-name-with-a-space", "zero-interval", "a-url-in-values"],
)
def test_the_schema_refuses_bad_relay_values(chart, relay):
    """A queue name no consumer can have, a zero interval, or a broker URL given as a value fail `helm install`."""
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(with_secret({"relay": relay}))
