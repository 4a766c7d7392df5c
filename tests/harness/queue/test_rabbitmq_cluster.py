"""On a 3-node RabbitMQ cluster (tests/support/rabbit_cluster.py), quorum queues on all three: the adapter given
every node follows the cluster when a node dies, and a drain whose queue leader is killed, or stopped (a node cut
off), loses no job and applies none twice (tests/support/rabbit_failover.py; bench/rabbit_failover.py runs it with
ten kills and more).
"""

from __future__ import annotations

import uuid

import pytest
from support.failover import EFFECTS_TABLE
from support.failover_consumers import QUEUE
from support.rabbit_failover import drain_with_broker_faults

from harness.queue.port import Envelope
from harness.queue.rabbitmq import RabbitQueue

pytestmark = pytest.mark.rabbit_cluster


@pytest.fixture
def effects_table(conn):
    conn.execute(EFFECTS_TABLE)


def test_a_queue_declared_on_the_cluster_has_a_member_on_every_node(rabbit_cluster, conn):
    prefix = f"members.{uuid.uuid4().hex[:8]}."
    port = RabbitQueue(rabbit_cluster.url(), conn, worker="t", prefix=prefix)
    try:
        port.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 1}))
        assert rabbit_cluster.members(prefix + QUEUE) == ["cj1@localhost", "cj2@localhost", "cj3@localhost"]
    finally:
        port.close()
        rabbit_cluster.delete_queues(prefix)


def test_the_adapter_given_every_node_reconnects_to_the_next_one_when_its_node_dies(rabbit_cluster, conn, logs):
    """Connected to the first node; the first node killed; the next publish goes through the second, logged."""
    prefix = f"hosts.{uuid.uuid4().hex[:8]}."
    port = RabbitQueue(rabbit_cluster.url(), conn, worker="t", prefix=prefix)
    try:
        port.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 1}))
        rabbit_cluster.kill(rabbit_cluster.nodes[0])
        port.publish(QUEUE, Envelope(job_id=uuid.uuid4(), payload={"n": 2}))
        assert port.figures(QUEUE)[0] == 2
        assert [e["node"] for e in logs.named("harness.rabbitmq.reconnected")] == ["127.0.0.1:5702"]
        assert "cluster-secret" not in logs.text and "cluster-secret" not in repr(port)
    finally:
        port.close()
        rabbit_cluster.heal()
        rabbit_cluster.delete_queues(prefix)


def test_a_drain_whose_queue_leader_is_killed_and_stopped_loses_no_job_and_applies_none_twice(
    rabbit_cluster, database_url, effects_table
):
    """Two SIGKILLs of the leader's node and one stop_app of it mid-drain, jobs still being published: every job
    has exactly one effect (none lost, none doubled), the worker never exited, and the work queue still has its
    delivery limit and a member on every node."""
    figures = drain_with_broker_faults(rabbit_cluster, database_url=database_url, jobs=300, kills=2, stops=1)
    assert (figures["lost"], figures["double"], figures["dead_letters"]) == (0, 0, 0), figures
    assert figures["effects"] == figures["jobs"] == 300, figures
    assert (figures["kills"], figures["stops"]) == (2, 1), figures
    assert figures["worker_restarts"] == 0, figures
    assert figures["delivery_limit_kept"] and figures["members"] == 3, figures


@pytest.mark.failover
def test_a_drain_that_loses_the_database_primary_and_the_queue_leader_at_once_loses_no_job_and_applies_none_twice(
    rabbit_cluster, failover_rigs
):
    """The PostgreSQL primary killed and its synchronous standby promoted (tests/support/failover.py) right after the
    queue leader's node is SIGKILLed, in the same drain: every job has exactly one effect on the new primary."""
    rig = failover_rigs.fresh(synchronous=True)

    def database_failover() -> None:
        rig.failover()
        rig.rebuild_standby()

    figures = drain_with_broker_faults(
        rabbit_cluster,
        database_url=rig.primary_url,
        worker_database_url=rig.url(),
        jobs=200,
        kills=1,
        database_failover=database_failover,
    )
    assert (figures["lost"], figures["double"], figures["effect_and_dead_letter"]) == (0, 0, 0), figures
    assert figures["effects"] == figures["jobs"] == 200, figures
    assert (figures["kills"], figures["database_failovers"]) == (1, 1), figures
