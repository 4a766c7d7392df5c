"""A lost database connection does not stop the worker: each thread gives its batch back, reconnects with a bounded
backoff and goes on; one that cannot reconnect for ``reconnect_for`` makes the worker fail (harness.worker)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from support.factories import publish
from support.harness_consumers import fragile
from support.harness_support import TTL, points, scalar
from support.tcp_proxy import TcpProxy, proxy_of, through
from support.waiting import wait_until

import harness.worker
from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.worker import DatabaseUnavailable, Worker, WorkerConfig


def worker_on(url: str, consumer=points_consumer, **config) -> tuple[Worker, HarnessMetrics]:
    metrics = HarnessMetrics(CollectorRegistry())
    worker = Worker(
        url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, poll_interval=timedelta(milliseconds=20), **config),
        metrics=metrics,
    )
    return worker, metrics


class Running:
    """A worker's run() in a thread; ``result()`` joins it and returns its stats or raises its error."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.outcome: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome.append(self.worker.run())
        except BaseException as exc:
            self.outcome.append(exc)

    def result(self, timeout: float = 30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the worker is still running: {self.worker.stats.fields()}"
        (outcome,) = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def backends(conn) -> int:
    """The worker's sessions on this test's database, connected and idle between claims — having run a statement: a
    backend shows as idle before its client has finished connecting, and a cut then is a database unreachable from
    the start (the worker fails), not an outage."""
    return scalar(
        conn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'core-jobs-worker'"
        " AND datname = current_database() AND state = 'idle' AND query <> ''",
    )


@pytest.fixture
def proxy(database_url) -> Iterator[TcpProxy]:
    with proxy_of(database_url) as proxy:
        yield proxy


def test_a_handler_that_kills_its_backend_costs_its_own_job_and_the_worker_drains_the_rest(database_url, conn):
    """m-disconnect terminates the worker's backend: the worker reconnects (counted once, no error raised); m-4, after
    it in the batch, is credited; m-1, rolled back with the shared transaction, is retried counted; m-disconnect keeps
    its lease and attempt."""
    for member in ("m-1", "m-disconnect", "m-4"):
        publish(conn, {"member_id": member, "points": 1})
    worker, metrics = worker_on(database_url, fragile)
    stats = worker.run(once=True)
    assert (stats.connections_lost, stats.processed, stats.retried, stats.released) == (1, 1, 1, 1)
    assert [points(conn, m) for m in ("m-1", "m-disconnect", "m-4")] == [0, 0, 1]
    assert metrics.registry.get_sample_value("harness_worker_connections_lost_total", {"consumer": fragile.name}) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages WHERE lease_expires_at > now()") == 1


def test_a_worker_whose_backends_are_terminated_reconnects_and_goes_on(database_url, conn):
    """Every worker backend terminated while it idles (an administrator, a pooler restart): the worker keeps running
    and credits a job published afterwards."""
    worker, _metrics = worker_on(database_url, concurrency=2)
    running = Running(worker)
    wait_until(
        lambda: (
            scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'core-jobs-worker'"
                " AND datname = current_database() AND query <> ''",  # connected: a statement run
            )
            == 2
        ),
        what="two worker backends",
    )
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'core-jobs-worker' AND datname = current_database()"
    )
    publish(conn, {"member_id": "m-after", "points": 3})
    wait_until(
        lambda: points(conn, "m-after") == 3 or running.outcome, what="the job published after the outage credited"
    )
    assert not running.outcome, running.outcome
    assert worker.stats.connections_lost >= 1
    worker.stop()
    assert running.result().processed == 1


def test_a_connection_lost_while_being_set_up_is_an_outage_not_a_wrong_address(database_url, conn, monkeypatch):
    """The server answered, then the new session's backend was terminated before its settings were pinned (a pg_terminate_backend
    racing a worker's start): the thread counts a lost connection and reconnects, instead of failing the worker as one
    whose database was unreachable from the start."""
    real_prepare = harness.worker.prepare
    terminated: list[int] = []

    def terminated_first(session, **kwargs):
        if not terminated:
            terminated.append(session.info.backend_pid)
            conn.execute("SELECT pg_terminate_backend(%s)", terminated)
        return real_prepare(session, **kwargs)

    monkeypatch.setattr(harness.worker, "prepare", terminated_first)
    publish(conn, {"member_id": "m-set-up", "points": 4})
    worker, metrics = worker_on(database_url)
    with capture_logs() as logs:
        stats = worker.run(once=True)
    assert (len(terminated), stats.connections_lost, stats.processed) == (1, 1, 1)
    assert points(conn, "m-set-up") == 4
    assert (
        metrics.registry.get_sample_value("harness_worker_connections_lost_total", {"consumer": points_consumer.name})
        == 1
    )
    tier = "harness.worker.durability_tier"  # read at the start, on a connection of its own
    assert [e["event"] for e in logs if e["event"].startswith("harness.worker.") and e["event"] != tier][1:3] == [
        "harness.worker.connection_lost",
        "harness.worker.reconnect_failed",
    ]


def test_a_worker_waits_out_an_outage_and_drains_what_was_published_during_it(database_url, conn, proxy):
    """The database unreachable (every connection cut, new ones refused) and back: the worker reconnects by itself."""
    worker, _metrics = worker_on(through(database_url, proxy), reconnect_for=timedelta(minutes=1))
    running = Running(worker)
    wait_until(lambda: backends(conn) == 1 or running.outcome, what="the worker connected")
    assert not running.outcome, running.outcome
    proxy.cut()
    wait_until(lambda: worker.stats.connections_lost or running.outcome, what="the worker saw its connection lost")
    assert (worker.stats.connections_lost, running.outcome) == (1, [])
    publish(conn, {"member_id": "m-during", "points": 2})
    proxy.restore()
    wait_until(lambda: points(conn, "m-during") == 2, what="the job published during the outage credited")
    worker.stop()
    assert running.result().processed == 1


def test_a_worker_that_cannot_reconnect_for_reconnect_for_fails(database_url, conn, proxy):
    """The database gone for good: after reconnect_for the worker stops with DatabaseUnavailable saying how long."""
    worker, _metrics = worker_on(through(database_url, proxy), reconnect_for=timedelta(milliseconds=500))
    running = Running(worker)
    wait_until(lambda: backends(conn) == 1 or running.outcome, what="the worker connected")
    assert not running.outcome, running.outcome
    proxy.cut()
    with pytest.raises(DatabaseUnavailable, match="could not be reached again"):
        running.result()
    assert worker.stats.connections_lost == 1


def test_a_batch_that_could_not_be_given_back_during_an_outage_is_given_back_on_the_next_connection(
    database_url, conn, proxy
):
    """m-cut's handler takes the database away mid-batch (no fresh connection either: give_back_failed). Once it is
    back, the worker acks m-ok's success and releases m-next on its new connection — neither waits out its lease —
    and handles m-next; m-cut keeps its lease and its attempt."""
    for member in ("m-ok", "m-cut", "m-next"):
        publish(conn, {"member_id": member, "points": 1})

    def cut_off(conn_, payload, ctx):
        if payload.member_id == "m-cut":
            proxy.cut()
        points_consumer.handler(conn_, payload, ctx)

    consumer = replace(points_consumer, handler=cut_off, shares_transactions=False)
    worker, _metrics = worker_on(through(database_url, proxy), consumer, reconnect_for=timedelta(minutes=1))

    def restore_once_lost() -> None:
        wait_until(lambda: worker.stats.connections_lost == 1, what="the worker saw its connection lost")
        proxy.restore()

    restorer = threading.Thread(target=restore_once_lost, daemon=True)
    restorer.start()
    with capture_logs() as logs:
        stats = worker.run(once=True)
    restorer.join(30)
    assert [e["event"] for e in logs if e["event"].startswith("harness.worker.give_back")] == [
        "harness.worker.give_back_failed"
    ]
    assert (stats.processed, stats.released, stats.leases_lost) == (2, 1, 0)
    assert [points(conn, m) for m in ("m-ok", "m-cut", "m-next")] == [1, 0, 1]
    assert conn.execute(
        "SELECT payload->>'member_id', attempts, lease_expires_at > now() FROM core.queue_messages"
    ).fetchall() == [("m-cut", 1, True)]
