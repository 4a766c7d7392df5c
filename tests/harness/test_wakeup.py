"""An idle worker of the reference queue wakes on NOTIFY, polling as the fallback (harness/queue/wakeup.py).

The workers here poll every 30 s: a job credited within the few seconds a test allows was picked up
because it was announced, not found by a poll.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from support.factories import QUEUE, TENANT, dead_letter, publish
from support.harness_support import TTL, points, scalar
from support.tcp_proxy import TcpProxy, proxy_of, through
from support.waiting import wait_until

from harness.consumer.retry import RetryPolicy
from harness.examples.points import consumer as points_consumer
from harness.metrics import HarnessMetrics
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.queue.wakeup import Wakeup
from harness.worker import Worker, WorkerConfig
from maintenance.operations.dead_letters import replay

LONG_POLL = timedelta(seconds=30)
AT_ONCE = 5.0  # seconds a test allows for what the notification brings about: far below LONG_POLL


class Idling:
    """A worker's run() in a thread, once its first claim found nothing and it waits, listening."""

    def __init__(self, worker: Worker, conn) -> None:
        self.worker = worker
        self.outcome: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_until(lambda: (listening(conn) and claimed(conn)) or self.outcome, what="the worker idle and listening")
        assert not self.outcome, self.outcome

    def _run(self) -> None:
        try:
            self.outcome.append(self.worker.run())
        except BaseException as exc:
            self.outcome.append(exc)

    def stop(self, timeout: float = AT_ONCE):
        self.worker.stop()
        return self.result(timeout)

    def result(self, timeout: float):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the worker did not stop in {timeout} s"
        (outcome,) = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def idle_worker(database_url: str, **config) -> Worker:
    config.setdefault("poll_interval", LONG_POLL)
    return Worker(
        database_url,
        points_consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, **config),
        metrics=HarnessMetrics(CollectorRegistry()),
    )


def listener_pid(conn) -> int | None:
    return scalar(
        conn,
        "SELECT max(pid) FROM pg_stat_activity WHERE application_name = 'core-jobs-worker/listen'"
        " AND datname = current_database() AND state = 'idle' AND query ILIKE 'LISTEN%%'",
    )


def listening(conn) -> bool:
    return listener_pid(conn) is not None


def claimed(conn) -> bool:
    """The worker's thread ran its claim (one statement, its own transaction) and sits idle after it."""
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'core-jobs-worker'"
            " AND datname = current_database() AND state = 'idle' AND query LIKE '%%FOR UPDATE SKIP LOCKED%%'",
        )
    )


def credited_at_once(conn, member: str, amount: int = 1) -> None:
    wait_until(lambda: points(conn, member) == amount, timeout=AT_ONCE, what=f"{member} credited at once")


def test_a_job_published_while_the_worker_idles_is_picked_up_at_once(database_url, conn):
    idling = Idling(idle_worker(database_url), conn)
    publish(conn, {"member_id": "m-1", "points": 2})
    credited_at_once(conn, "m-1", 2)
    assert idling.stop().processed == 1


def test_a_batch_published_with_copy_wakes_the_worker(database_url, conn):
    idling = Idling(idle_worker(database_url), conn)
    PgQueue(conn).publish_many(
        [
            (QUEUE, Envelope(job_id=uuid.uuid4(), payload={"member_id": m, "points": 1}, tenant_id=TENANT))
            for m in ("m-1", "m-2", "m-3")
        ]
    )
    for member in ("m-1", "m-2", "m-3"):
        credited_at_once(conn, member)
    assert idling.stop().processed == 3


def test_a_replay_wakes_the_worker(database_url, conn):
    letter_id, _job_id = dead_letter(conn, {"member_id": "m-1", "points": 4})
    idling = Idling(idle_worker(database_url), conn)
    replay(conn, [letter_id], operator="ana")
    credited_at_once(conn, "m-1", 4)
    assert idling.stop().processed == 1


def test_every_thread_of_a_process_shares_one_listening_connection(database_url, conn):
    idling = Idling(idle_worker(database_url, concurrency=3), conn)
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'core-jobs-worker/listen'"
            " AND datname = current_database()",
        )
        == 1
    )
    publish(conn, {"member_id": "m-1", "points": 1})
    credited_at_once(conn, "m-1")
    idling.stop()


def test_a_lost_listening_connection_is_listened_again_and_wakes_the_worker(database_url, conn):
    idling = Idling(idle_worker(database_url), conn)
    lost = listener_pid(conn)
    with capture_logs() as logs:
        conn.execute("SELECT pg_terminate_backend(%s)", (lost,))
        # The event, not the new backend (it shows in pg_stat_activity before its LISTEN has run).
        wait_until(
            lambda: any(e["event"] == "harness.worker.listening" for e in logs), timeout=AT_ONCE, what="listening again"
        )
    assert [e["event"] for e in logs] == ["harness.worker.listen_lost", "harness.worker.listening"]
    assert listener_pid(conn) not in (None, lost)
    publish(conn, {"member_id": "m-1", "points": 1})
    credited_at_once(conn, "m-1")
    assert idling.stop().connections_lost == 0  # the worker's own connection was never lost


def test_a_worker_stops_at_once_while_it_idles_listening(database_url, conn):
    idling = Idling(idle_worker(database_url), conn)
    started = time.monotonic()
    idling.stop()
    assert time.monotonic() - started < AT_ONCE
    wait_until(lambda: not listening(conn), timeout=AT_ONCE, what="the listening connection closed")


def test_a_worker_stops_at_once_when_its_stop_event_is_set(database_url, conn):
    stop = threading.Event()
    worker = Worker(
        database_url,
        points_consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=TTL, poll_interval=LONG_POLL),
        stop=stop,
    )
    idling = Idling(worker, conn)
    stop.set()  # as core-jobs worker's SIGTERM handler does
    idling.result(AT_ONCE)


def test_a_worker_that_does_not_listen_opens_no_listening_connection(database_url, conn):
    worker = idle_worker(database_url, listen=False, poll_interval=timedelta(milliseconds=50))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_until(lambda: claimed(conn), what="the worker polling")
    assert not listening(conn)
    publish(conn, {"member_id": "m-1", "points": 1})
    credited_at_once(conn, "m-1")  # found by its poll
    worker.stop()
    thread.join(AT_ONCE)
    assert not thread.is_alive()


@pytest.fixture
def proxy(database_url) -> Iterator[TcpProxy]:
    with proxy_of(database_url) as proxy:
        yield proxy


def test_without_its_listening_connection_a_wait_is_a_poll_until_it_is_back(database_url, conn, proxy):
    """The database unreachable for the listener: each wait lasts its timeout (the worker's poll_interval), as
    without NOTIFY; once the listener is back, an announcement ends a wait at once again."""
    wakeup = Wakeup(through(database_url, proxy)).start()
    try:
        wait_until(lambda: wakeup.listening, what="listening")
        proxy.cut()
        wait_until(lambda: not wakeup.listening, what="the listening connection lost")
        publish(conn, {"member_id": "m-1", "points": 1})  # announced, but not heard
        started = time.monotonic()
        wakeup.wait(QUEUE, 0.2)
        assert time.monotonic() - started >= 0.2  # a poll: the full timeout
        proxy.restore()
        wait_until(lambda: wakeup.listening, timeout=10, what="listening again")
        wakeup.wait(QUEUE, LONG_POLL.total_seconds())  # the wake-up of a new listen: what was missed meanwhile
        ready = threading.Event()

        def wait_long() -> None:
            wakeup.wait(QUEUE, 0)  # this thread has seen what was announced so far
            ready.set()
            wakeup.wait(QUEUE, LONG_POLL.total_seconds())

        waiter = threading.Thread(target=wait_long, daemon=True)
        waiter.start()
        ready.wait(AT_ONCE)
        publish(conn, {"member_id": "m-2", "points": 1})
        waiter.join(AT_ONCE)
        assert not waiter.is_alive(), "the announcement did not end the wait"
    finally:
        wakeup.close()
        wakeup.join(AT_ONCE)
