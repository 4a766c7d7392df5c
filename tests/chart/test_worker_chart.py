"""The chart's consumer worker groups (values ``workers``, docs/deployment.md#consumer-workers): one Deployment per group
running ``core-jobs worker`` with every consumer of the group, probed on the /healthz it serves, and its
PodDisruptionBudget; a group that cannot work refuses to render, naming the value.

Every-minor validation and pod hardening run on the ``workers`` value set in tests/chart/test_helm_chart.py.
"""

from __future__ import annotations

import copy

import helm_python
import pytest

from tests.chart.test_helm_chart import SECRET, WORKERS, of_kind, render_objects, with_secret


@pytest.fixture(scope="module")
def workers_mode(chart):
    return render_objects(chart, with_secret({"workers": WORKERS, "workerDefaults": {"queueUrlKey": "queue-url"}}))


def component(obj) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def worker_deployments(objects) -> dict[str, dict]:
    return {component(o): o for o in of_kind(objects, "Deployment") if component(o).startswith("worker-")}


def container_of(deployment) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_no_worker_by_default(chart):
    objects = render_objects(chart, with_secret())
    assert worker_deployments(objects) == {} and of_kind(objects, "PodDisruptionBudget") == []


def test_each_group_is_one_deployment_running_all_its_consumers_in_one_worker_process(workers_mode):
    """`core-jobs worker --consumer A --consumer B --concurrency 4 --metrics-port 9102`, the group's replicas."""
    deployments = worker_deployments(workers_mode)
    assert set(deployments) == {"worker-points", "worker-ledger"}
    points, ledger = deployments["worker-points"], deployments["worker-ledger"]
    assert points["metadata"]["name"] == "ops-core-jobs-worker-points"
    assert container_of(points)["args"] == [
        "worker",
        "--consumer",
        "billing.credit:consumer",
        "--consumer",
        "billing.refund:consumer",
        "--concurrency",
        "4",
        "--metrics-port",
        "9102",
    ]
    assert container_of(ledger)["args"] == ["worker", "--consumer", "ledger.sync:consumer", "--metrics-port", "9102"]
    assert (points["spec"]["replicas"], ledger["spec"]["replicas"]) == (2, 1)


def test_the_probes_ask_the_workers_own_healthz_on_its_metrics_port(workers_mode):
    """Liveness and readiness are HTTP GETs of /healthz on the named port the worker's --metrics-port listens on."""
    container = container_of(worker_deployments(workers_mode)["worker-points"])
    assert container["ports"] == [{"name": "http", "containerPort": 9102, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_a_groups_resources_and_env_are_its_own_and_the_brokers_url_comes_from_the_secret(chart):
    """A group's resources replace the defaults; its env follows the secrets; CORE_JOBS_QUEUE_URL is a secretKeyRef."""
    workers = copy.deepcopy(WORKERS)
    workers[1]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    objects = render_objects(chart, with_secret({"workers": workers, "workerDefaults": {"queueUrlKey": "queue-url"}}))
    deployments = worker_deployments(objects)
    assert container_of(deployments["worker-ledger"])["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert container_of(deployments["worker-points"])["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    env = {e["name"]: e for e in container_of(deployments["worker-points"])["env"]}
    assert env["CORE_JOBS_QUEUE_URL"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "queue-url"}
    assert env["CORE_JOBS_WORKER_BATCH_SIZE"]["value"] == "20"
    assert "CORE_JOBS_WORKER_BATCH_SIZE" not in {e["name"] for e in container_of(deployments["worker-ledger"])["env"]}


def test_without_a_queue_url_key_the_workers_use_the_reference_queue(chart):
    objects = render_objects(chart, with_secret({"workers": WORKERS}))
    env = {e["name"] for e in container_of(worker_deployments(objects)["worker-points"])["env"]}
    assert "CORE_JOBS_QUEUE_URL" not in env


def test_a_group_that_asks_for_a_disruption_budget_gets_one_selecting_only_its_pods(workers_mode):
    (budget,) = of_kind(workers_mode, "PodDisruptionBudget")
    points = worker_deployments(workers_mode)["worker-points"]
    assert budget["metadata"]["name"] == points["metadata"]["name"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == points["spec"]["selector"]["matchLabels"]


def test_a_pod_monitor_scrapes_each_worker_group(chart):
    objects = render_objects(chart, with_secret({"workers": WORKERS, "podMonitor": {"enabled": True}}))
    monitors = {component(m): m for m in of_kind(objects, "PodMonitor")}
    assert set(monitors) == {"worker-points", "worker-ledger"}
    assert all(len(m["metadata"]["name"]) <= 63 for m in monitors.values())


def group(**changes) -> list[dict]:
    return [{"name": "points", "consumers": ["billing.credit:consumer"], **changes}]


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"workers": group(consumers=[])}, r"workers\[0\]\.consumers is required"),
        ({"workers": group() + group()}, r"workers\[1\]\.name points is given twice"),
        (
            {"workers": group(podDisruptionBudget={"enabled": True, "minAvailable": 1})},
            r"workers\[0\]\.podDisruptionBudget allows no pod of its 1 replica\(s\) to be evicted.*workers\[0\]\.replicas",
        ),
        (
            {"workers": group(replicas=3, podDisruptionBudget={"enabled": True, "maxUnavailable": 0})},
            r"workers\[0\]\.podDisruptionBudget allows no pod",
        ),
        (
            {"workers": group(podDisruptionBudget={"enabled": True, "minAvailable": 1, "maxUnavailable": 1})},
            r"workers\[0\]\.podDisruptionBudget: set minAvailable or maxUnavailable, not both",
        ),
        (
            {"workers": group(podDisruptionBudget={"enabled": True})},
            r"workers\[0\]\.podDisruptionBudget\.enabled needs minAvailable or maxUnavailable",
        ),
        (
            {"mode": "scheduler", "workers": group(), "serviceMonitor": {"enabled": True}},
            r"serviceMonitor\.enabled with workers: the worker pods have no Service.*podMonitor\.enabled",
        ),
    ],
    ids=[
        "no-consumers",
        "a-name-twice",
        "a-budget-no-pod-may-leave",
        "max-unavailable-zero",
        "both-budget-forms",
        "a-budget-without-a-bound",
        "service-monitor-with-workers",
    ],
)
def test_a_worker_group_that_cannot_work_refuses_to_render_naming_the_value(chart, values, refusal):
    with pytest.raises(helm_python.HelmError, match=refusal):
        render_objects(chart, with_secret(values))


def test_a_budget_below_the_replicas_renders(chart):
    """minAvailable 1 of 2 replicas lets a drain evict one pod at a time: it works, so it renders."""
    objects = render_objects(
        chart, with_secret({"workers": group(replicas=2, podDisruptionBudget={"enabled": True, "minAvailable": 1})})
    )
    (budget,) = of_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1


@pytest.mark.parametrize(
    "workers",
    [
        group(consumers=["not a reference"]),
        group(name="Points_Group"),
        group(env=[{"name": "CORE_JOBS_QUEUE_URL", "value": "amqp://u:p@rabbit/"}]),
        group(concurrency=0),
    ],
    ids=["a-consumer-that-is-no-module-colon-object", "a-name-that-is-no-dns-label", "a-secret-in-env", "zero-threads"],
)
def test_the_schema_refuses_bad_worker_values(chart, workers):
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(with_secret({"workers": workers}))
