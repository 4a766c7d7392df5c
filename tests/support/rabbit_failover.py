"""A drain on the RabbitMQ cluster rig (tests/support/rabbit_cluster.py) while its quorum queue's leader is killed.

:func:`drain_with_broker_faults` publishes ``jobs`` jobs of the failover rig's effect consumer
(tests/support/failover_consumers.py: one row of the independent effects table per run of its
work) from a producer thread on the cluster's multi-host URL — in batches, so publishes are in
flight when a node dies — and drains them with a supervised ``core-jobs worker`` subprocess on
the same URL, while it

- **kills** the queue's leader node (SIGKILL of its beam process) ``kills`` times, each once the
  effects reach the next mark (spread over the drain), then starts it again;
- **stops** the leader node's application (``rabbitmqctl stop_app``: cut off from its peers and its
  clients, as a partitioned node is) ``stops`` times, then starts it again;
- optionally, at the first kill, also **fails the PostgreSQL primary over** (``database_failover``,
  the failover rig's :meth:`~support.failover.FailoverRig.failover` and a new standby): both engines
  lose a node in the same drain.

When every queue of the run's prefix is empty, each job is counted (:func:`support.failover.tally`):
its effects and dead letters. The figures: faults, jobs, effects, dead letters, lost, double, the
publishes the adapter sent again (producer's and worker's, ``harness.rabbitmq.publish_retried``),
the worker's reconnections (``harness.rabbitmq.reconnected``) and restarts.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from harness.queue.port import Envelope
from harness.queue.rabbitmq import RabbitQueue
from support.failover import SupervisedWorker, effects, tally
from support.failover_consumers import QUEUE
from support.rabbit_cluster import RabbitCluster
from support.waiting import wait_until

CONSUMER = "support.failover_consumers:effect"
BATCH = 20


class Producer(threading.Thread):
    """Publishes ``job_ids`` in batches on the cluster's URL, each once the work queue's backlog is below two batches
    (so publishing lasts as long as the drain, and publishes are in flight when a node dies); a batch that raises is
    published again from where the error says it stopped (``published``), as a relay does."""

    def __init__(self, cluster: RabbitCluster, database_url: str, prefix: str, job_ids: list[uuid.UUID], work_ms: int):
        super().__init__(daemon=True)
        self.cluster, self.database_url, self.prefix = cluster, database_url, prefix
        self.job_ids, self.work_ms = job_ids, work_ms
        self.retried = 0  # the adapter's publishes sent again
        self.errors = 0  # publish_many calls that raised (and were resumed)
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            port = RabbitQueue(self.cluster.url(), conn, worker="producer", prefix=self.prefix)
            try:
                for start in range(0, len(self.job_ids), BATCH):
                    batch = [
                        (QUEUE, Envelope(job_id=job, payload={"n": start + i, "work_ms": self.work_ms}))
                        for i, job in enumerate(self.job_ids[start : start + BATCH])
                    ]
                    self._wait_for_room(port)
                    while batch:
                        try:
                            port.publish_many(batch)
                            batch = []
                        except Exception as exc:
                            self.errors += 1
                            batch = batch[getattr(exc, "published", 0) :]
                            time.sleep(0.5)  # a producer's own pause before it tries the rest again
            finally:
                self.retried = port.publishes_retried
                port.close()
                self.done.set()

    def _wait_for_room(self, port: RabbitQueue) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if port.figures(QUEUE)[0] < 2 * BATCH:
                    return
            except Exception:  # the node being asked died: the next try goes to another
                pass
            time.sleep(0.05)  # a producer's pacing, not a test waiting for time


def drain_with_broker_faults(
    cluster: RabbitCluster,
    *,
    database_url: str | Callable[[], str],
    worker_database_url: str | None = None,
    jobs: int,
    kills: int,
    stops: int = 0,
    work_ms: int = 20,
    database_failover: Callable[[], None] | None = None,
    timeout: float = 300,
) -> dict[str, object]:
    """Run the drain and its faults (see the module docstring); the figures. ``database_url`` (or what it returns
    when called: the failover rig's current primary) is where the effects are counted; ``worker_database_url``
    (default: the same) is what the worker is given (the failover rig's multi-host URL)."""
    counting: Callable[[], str] = database_url if callable(database_url) else lambda: str(database_url)
    prefix = f"failover.{uuid.uuid4().hex[:8]}."
    work_queue = prefix + QUEUE
    job_ids = [uuid.uuid4() for _ in range(jobs)]
    log = Path(tempfile.mkdtemp(prefix="core-jobs-rabbit-failover-")) / "worker.log"
    producer = Producer(cluster, counting(), prefix, job_ids, work_ms)
    worker = SupervisedWorker(
        worker_database_url or counting(),
        CONSUMER,
        log,
        env={"CORE_JOBS_QUEUE_URL": f"{cluster.url()}?prefix={prefix}", "CORE_JOBS_WORKER_BATCH_SIZE": "10"},
    )
    faults = ["kill"] * kills + ["stop"] * stops
    faults = [faults[i] for i in sorted(range(len(faults)), key=lambda i: (i * 7919) % len(faults))]  # interleaved
    done: list[str] = []
    after_drain = 0  # faults that came once every job had its effect (the drain was too short for them)
    began = time.monotonic()
    producer.start()
    wait_until(lambda: cluster.messages(prefix).get(work_queue) is not None, 60, f"{work_queue} declared")
    worker.start()
    both = 0
    try:
        for i, fault in enumerate(faults, start=1):
            mark = i * jobs // (len(faults) + 2)  # the last stretch of the drain left without a fault
            wait_until(lambda mark=mark: _effects(counting()) >= mark, timeout, f"{mark} effects before fault {i}")
            after_drain += _effects(counting()) >= jobs
            leader = cluster.leader(work_queue)
            if fault == "kill":
                cluster.kill(leader)
                if database_failover is not None and both == 0:
                    database_failover()  # the PostgreSQL primary lost in the same drain
                    both += 1
                cluster.leader(work_queue)  # a new leader elected among the two left
                cluster.restart(leader)
            else:
                cluster.stop_app(leader)
                cluster.leader(work_queue)
                cluster.start_app(leader)
            done.append(f"{fault}:{leader.name.split('@')[0]}")
        producer.join(timeout)
        wait_until(lambda: not any(cluster.messages(prefix).values()), timeout, f"every queue of {prefix} empty")
    finally:
        worker.stop()
        cluster.heal()
    drained = time.monotonic() - began
    arguments = cluster.ctl(cluster.nodes[0], "list_queues", "name", "arguments")
    limit_kept = any(
        line.startswith(work_queue + "\t") and "x-delivery-limit" in line for line in arguments.splitlines()
    )
    members = cluster.members(work_queue)
    with psycopg.connect(counting(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    events = _events(log)
    cluster.delete_queues(prefix)
    return {
        "kills": sum(1 for d in done if d.startswith("kill")),
        "stops": sum(1 for d in done if d.startswith("stop")),
        "database_failovers": both,
        "after_drain": after_drain,
        **outcome.figures(),
        "publishes_retried": producer.retried + events.get("harness.rabbitmq.publish_retried", 0),
        "producer_errors": producer.errors,
        "reconnections": events.get("harness.rabbitmq.reconnected", 0),
        "worker_restarts": len(worker.exits),
        "delivery_limit_kept": limit_kept,
        "members": len(members),
        "drain_s": round(drained, 1),
        "faults": ",".join(done),
        "lost_ids": [str(j) for j in outcome.lost],
        "doubled_ids": [str(j) for j in outcome.doubled],
        "log": str(log),
    }


def _effects(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return effects(conn)


def _events(log: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line).get("event")
        except (ValueError, AttributeError):
            continue
        if isinstance(event, str):
            counts[event] = counts.get(event, 0) + 1
    return counts
