"""The worker's Prometheus series (harness/metrics.py): present from the start, latency, in-flight, queue lag, lease losses."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from prometheus_client import CollectorRegistry
from support.factories import QUEUE, publish
from support.harness_support import TTL

from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.examples.points import CreditPoints
from harness.examples.points import consumer as points
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.worker import Worker, WorkerConfig

CONFIG = WorkerConfig(fence_ttl=TTL)


def worker(database_url: str, consumer: Consumer = points) -> tuple[Worker, HarnessMetrics]:
    metrics = HarnessMetrics(CollectorRegistry())
    return Worker(database_url, consumer, policy=RetryPolicy(), config=CONFIG, metrics=metrics), metrics


def sample(metrics: HarnessMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_every_worker_series_is_exported_at_zero_before_the_first_message(database_url):
    """A worker just made, nothing handled: each counter, the in-flight, queue depth and age gauges and the histogram's count are 0 for its consumer and queue."""
    _worker, metrics = worker(database_url)
    consumer, queue = {"consumer": points.name}, {"queue": points.queue}
    for name in (
        "harness_jobs_processed_total",
        "harness_jobs_duplicates_total",
        "harness_jobs_retries_total",
        "harness_jobs_in_flight",
        "harness_leases_lost_total",
        "harness_handler_duration_seconds_count",
    ):
        assert sample(metrics, name, **consumer) == 0, name
    for reason in ("poison", "permanent", "exhausted"):
        assert sample(metrics, "harness_jobs_dead_lettered_total", **consumer, reason=reason) == 0
    assert sample(metrics, "harness_queue_depth", **queue) == 0
    assert sample(metrics, "harness_queue_oldest_ready_age_seconds", **queue) == 0


def test_queue_figures_count_ready_messages_and_age_the_oldest_by_the_database_clock(conn):
    """Two ready messages (one due 90 s ago), one scheduled later and one leased: depth 2, oldest ready age at least 90 s."""
    publish(conn, {"member_id": "leased", "points": 1})
    PgQueue(conn).claim(QUEUE, 1)
    publish(conn, {"member_id": "a", "points": 1})
    old = publish(conn, {"member_id": "b", "points": 1})
    publish(conn, {"member_id": "later", "points": 1}, delay=timedelta(hours=1))
    conn.execute("UPDATE core.queue_messages SET run_at = now() - interval '90 seconds' WHERE job_id = %s", (old,))

    depth, age = PgQueue(conn).figures(QUEUE)

    assert depth == 2
    assert 90 <= age < 120


def test_a_worker_reads_its_queue_figures_before_it_claims(database_url, conn):
    """Three ready messages, the oldest due 60 s ago: after one pass, the gauges show the depth 3 and age the worker read before claiming them."""
    for member in ("a", "b", "c"):
        publish(conn, {"member_id": member, "points": 1})
    conn.execute("UPDATE core.queue_messages SET run_at = now() - interval '60 seconds'")
    run, metrics = worker(database_url)

    run.run(once=True)

    assert sample(metrics, "harness_queue_depth", queue=points.queue) == 3
    assert sample(metrics, "harness_queue_oldest_ready_age_seconds", queue=points.queue) >= 60


def test_each_handled_delivery_is_timed_and_counted_in_flight_while_it_runs(database_url, conn):
    """Two deliveries: the histogram counts 2, each handler saw in-flight 1, and in-flight is back to 0 after."""
    seen: list[float | None] = []
    metrics_box: list[HarnessMetrics] = []

    def handler(c: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
        seen.append(sample(metrics_box[0], "harness_jobs_in_flight", consumer=points.name))

    observed = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=handler)
    publish(conn, {"member_id": "a", "points": 1})
    publish(conn, {"member_id": "b", "points": 1})
    run, metrics = worker(database_url, observed)
    metrics_box.append(metrics)

    run.run(once=True)

    assert seen == [1, 1]
    assert sample(metrics, "harness_handler_duration_seconds_count", consumer=points.name) == 2
    assert sample(metrics, "harness_handler_duration_seconds_sum", consumer=points.name) > 0
    assert sample(metrics, "harness_jobs_in_flight", consumer=points.name) == 0


def test_a_success_whose_lease_ran_out_before_its_ack_counts_a_lease_loss(database_url, conn):
    """A handler that commits its work after its own lease expired: its ack changes nothing, harness_leases_lost_total is 1, and the redelivery is a duplicate."""

    def handler(c: psycopg.Connection, payload: CreditPoints, ctx: JobContext) -> None:
        c.execute(
            "UPDATE core.queue_messages SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s",
            (ctx.job_id,),
        )

    late = Consumer(name=points.name, queue=points.queue, payload_schema=CreditPoints, handler=handler)
    publish(conn, {"member_id": "a", "points": 1})
    run, metrics = worker(database_url, late)

    stats = run.run(once=True)

    assert stats.leases_lost == 1
    assert sample(metrics, "harness_leases_lost_total", consumer=points.name) == 1
    assert stats.duplicates == 1  # the pass claims it again: the fence absorbs it


def cancelled_figures_in_a_transaction(queue: PgQueue, name: str) -> tuple[int, float]:
    """A figures read the server cancels (statement_timeout) inside a transaction: the connection is left aborted."""
    queue.conn.execute("BEGIN")
    queue.conn.execute("SET LOCAL statement_timeout = '1ms'")
    queue.conn.execute("SELECT pg_sleep(1)")  # raises QueryCanceled
    raise AssertionError("the statement was not cancelled")


def test_a_failing_queue_figures_read_is_logged_and_the_worker_goes_on_with_its_messages(
    database_url, conn, logs, monkeypatch
):
    """The figures statement cancelled by the server in an open transaction: figures_failed is logged with the error, the gauges keep their last values, and the published message is still claimed and processed."""
    publish(conn, {"member_id": "a", "points": 1})
    monkeypatch.setattr(PgQueue, "figures", cancelled_figures_in_a_transaction)
    run, metrics = worker(database_url)
    metrics.queue_figures(points.queue, 5, 7.0)

    stats = run.run(once=True)

    assert stats.processed == 1
    (failed,) = logs.named("harness.worker.figures_failed")
    assert failed["queue"] == points.queue
    assert failed["error"].startswith("QueryCanceled: canceling statement due to statement timeout")
    assert sample(metrics, "harness_queue_depth", queue=points.queue) == 5
    assert sample(metrics, "harness_queue_oldest_ready_age_seconds", queue=points.queue) == 7
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)


def lost_connection_figures(queue: PgQueue, name: str) -> tuple[int, float]:
    """A figures read whose connection is lost: the server ends its own backend."""
    queue.conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    raise AssertionError("the connection was not lost")


def test_a_queue_figures_read_that_loses_the_connection_reconnects_and_the_message_is_handled(
    database_url, conn, monkeypatch
):
    """The figures statement losing the worker's connection: the worker reconnects, as after any lost connection, and
    handles the message (the figures are read again only once their interval has passed)."""
    publish(conn, {"member_id": "a", "points": 1})
    monkeypatch.setattr(PgQueue, "figures", lost_connection_figures)
    run, _metrics = worker(database_url)

    stats = run.run(once=True)

    assert (stats.connections_lost, stats.processed) == (1, 1)
    assert conn.execute("SELECT count(*) FROM core.queue_messages").fetchone() == (0,)
