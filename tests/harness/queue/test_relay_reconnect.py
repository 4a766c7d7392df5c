"""A lost database connection does not stop the outbox relay (harness/queue/relay.py, ``Relay.run`` with ``reconnect``;
``core-jobs relay``): it is logged and counted, the relay reconnects with a capped backoff and goes on, what the lost
connection left is settled on the next one (nothing lost, nothing published again), and a relay that cannot reconnect
for ``reconnect_for`` fails."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from support.factories import QUEUE, publish
from support.harness_support import scalar
from support.logcapture import events_in
from support.tcp_proxy import TcpProxy, proxy_of, through
from support.waiting import wait_until

from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.relay import Relay
from harness.reconnect import DatabaseUnavailable
from maintenance.cli import main
from maintenance.cli import relay as relay_cli
from maintenance.errors import EXIT_FAILED, EXIT_OK

APPLICATION = "test-relay-reconnect"
RELAY_NAME = "test-relay"


@pytest.fixture
def proxy(database_url) -> Iterator[TcpProxy]:
    with proxy_of(database_url) as proxy:
        yield proxy


def outbox(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM core.queue_messages")


def relay_backends(conn: psycopg.Connection, application: str = APPLICATION) -> int:
    """The relay's sessions on this test's database that have run a statement (connected, not just accepted)."""
    return scalar(
        conn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()"
        " AND query <> ''",
        (application,),
    )


class Running:
    """A relay's ``run`` in a thread, reconnecting through ``url``; ``result()`` stops and joins it."""

    def __init__(self, url: str, target, *, reconnect_for: timedelta = timedelta(minutes=1)) -> None:
        self.url = url
        self.target = target
        self.metrics = HarnessMetrics(CollectorRegistry())
        self.connections: list[psycopg.Connection] = []
        self.relay = Relay(self.source(), target, [QUEUE], metrics=self.metrics)
        self.stop = threading.Event()
        self.outcome: list = []
        self.reconnect_for = reconnect_for
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def source(self) -> PgQueue:
        conn = connect(self.url, autocommit=True, application_name=APPLICATION, connect_timeout=5)
        self.connections.append(conn)
        return PgQueue(conn, worker=RELAY_NAME)

    def _run(self) -> None:
        try:
            self.outcome.append(
                self.relay.run(
                    self.stop,
                    interval=timedelta(milliseconds=20),
                    reconnect=lambda: (self.source(), self.target),
                    reconnect_for=self.reconnect_for,
                )
            )
        except BaseException as exc:
            self.outcome.append(exc)

    def connections_lost(self) -> float:
        return self.metrics.registry.get_sample_value("harness_relay_connections_lost_total") or 0

    def result(self, timeout: float = 30):
        self.stop.set()
        self.thread.join(timeout)
        for conn in self.connections:
            conn.close()
        assert not self.thread.is_alive(), "the relay is still running"
        (outcome,) = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_a_relay_whose_backend_is_terminated_reconnects_counts_it_and_relays_what_is_published_afterwards(
    database_url, conn, relay_target
):
    first = publish(conn, {"member_id": "m-1", "points": 1})
    running = Running(database_url, relay_target.port())
    wait_until(lambda: outbox(conn) == 0 or running.outcome, what="the first row relayed")
    assert not running.outcome, running.outcome
    with capture_logs() as logs:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database()",
            (APPLICATION,),
        )
        second = publish(conn, {"member_id": "m-2", "points": 2})
        wait_until(lambda: (outbox(conn) == 0 and running.connections_lost()) or running.outcome, what="m-2 relayed")
        result = running.result()
    assert (result.published, running.connections_lost()) == (2, 1)
    assert sorted(d.envelope.job_id for d in relay_target.take(QUEUE)) == sorted([first, second])
    events = [e["event"] for e in logs if e["event"].startswith("harness.relay.")]
    assert "harness.relay.connection_lost" in events and "harness.relay.error" not in events


class CutAfterPublish:
    """The network to the outbox's database cut (and back) right after the target confirmed the first publish."""

    def __init__(self, target, proxy: TcpProxy) -> None:
        self.target, self.proxy, self.cuts = target, proxy, 0

    def publish_many(self, messages, *, delay=timedelta(0)) -> None:
        self.target.publish_many(messages, delay=delay)
        if not self.cuts:
            self.cuts += 1
            self.proxy.cut()
            self.proxy.restore()


def test_rows_the_target_confirmed_before_the_connection_was_lost_are_acked_on_the_next_one_not_published_again(
    database_url, conn, relay_target, proxy
):
    """The ack of a confirmed batch fails with the connection: on the next connection the relay acks those rows
    (their lease still live) instead of leaving them to be published again when it ends."""
    job = publish(conn, {"member_id": "m-1", "points": 1})
    target = CutAfterPublish(relay_target.port(), proxy)
    running = Running(through(database_url, proxy), target)
    wait_until(lambda: (target.cuts and outbox(conn) == 0) or running.outcome, what="the confirmed row acked")
    result = running.result()
    assert (result.published, result.leases_lost, running.connections_lost()) == (1, 0, 1)
    assert [d.envelope.job_id for d in relay_target.take(QUEUE)] == [job]


def test_a_relay_that_cannot_reconnect_for_reconnect_for_fails_saying_how_long(database_url, conn, relay_target, proxy):
    running = Running(through(database_url, proxy), relay_target.port(), reconnect_for=timedelta(milliseconds=500))
    wait_until(lambda: relay_backends(conn) == 1 or running.outcome, what="the relay connected")
    with capture_logs() as logs:
        proxy.cut()
        running.thread.join(30)
    with pytest.raises(DatabaseUnavailable, match="could not be reached again"):
        running.result()
    assert running.connections_lost() == 1
    assert [e["event"] for e in logs if e["event"] in ("harness.relay.reconnect_failed", "harness.relay.error")][
        -1
    ] == ("harness.relay.error")


@pytest.fixture
def cli(clean_env, database_url, proxy, relay_target, monkeypatch):
    """``core-jobs relay`` on this test's database through the proxy, its broker ``relay_target``."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", through(database_url, proxy))
    monkeypatch.setattr(relay_cli, "open_target", lambda url, conn, **_: relay_target.port())
    return main


def in_background(action) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def test_core_jobs_relay_reconnects_after_its_backend_is_terminated_and_goes_on(cli, conn, relay_target, capsys):
    """The command outlives a terminated backend (counted, logged) and relays what was published afterwards; SIGTERM
    then stops it with 0."""

    publish(conn, {"member_id": "m-before", "points": 1})

    def terminate_publish_and_stop() -> None:
        wait_until(lambda: outbox(conn) == 0, what="the relay relaying")  # in its loop, not still connecting
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database()",
            (relay_cli.APPLICATION_NAME,),
        )
        publish(conn, {"member_id": "m-after", "points": 1})
        wait_until(lambda: outbox(conn) == 0, what="the row published after the outage relayed")
        os.kill(os.getpid(), signal.SIGTERM)  # the command's handler is installed: it is relaying

    helper = in_background(terminate_publish_and_stop)
    assert cli(["relay", "--queue", QUEUE, "--interval", "0.05", "--queue-url", relay_target.url]) == EXIT_OK
    helper.join(30)
    out = capsys.readouterr().out
    assert len(events_in(out, "harness.relay.connection_lost")) == 1
    (stop,) = events_in(out, "harness.relay.stop")
    assert (stop["num_published"], stop["ok"]) == (2, True)
    assert len(relay_target.take(QUEUE)) == 2


def test_core_jobs_relay_exits_1_after_the_reconnect_time_without_its_database(cli, clean_env, conn, proxy, capsys):
    clean_env.setenv("CORE_JOBS_WORKER_RECONNECT_FOR", "PT0.5S")
    publish(conn, {"member_id": "m-1", "points": 1})

    def cut_once_relaying() -> None:
        # Relayed: the command is in its loop (a cut while it is still connecting is a database unreachable at start).
        wait_until(lambda: outbox(conn) == 0, what="the relay relaying")
        proxy.cut()

    helper = in_background(cut_once_relaying)
    assert cli(["relay", "--queue", QUEUE, "--interval", "0.05"]) == EXIT_FAILED
    helper.join(30)
    (error,) = events_in(capsys.readouterr().out, "harness.relay.error")
    assert "could not be reached again" in error["error"]


def test_a_relay_whose_target_cannot_be_reopened_after_a_lost_connection_fails_saying_why(database_url, conn):
    """Reconnecting opens the broker's port anew; a port that will not open (the broker down too) is the relay's
    failure, logged harness.relay.error, not an outage waited out."""

    class Unopenable(Running):
        def _run(self) -> None:
            def reconnect():
                self.source()
                raise ConnectionRefusedError("broker unreachable")

            try:
                self.relay.run(self.stop, interval=timedelta(milliseconds=20), reconnect=reconnect)
            except BaseException as exc:
                self.outcome.append(exc)

    class Idle:
        def publish_many(self, messages, *, delay=timedelta(0)) -> None:
            pass

    with capture_logs() as logs:
        running = Unopenable(database_url, Idle())
        wait_until(lambda: relay_backends(conn) == 1 or running.outcome, what="the relay connected")
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database()",
            (APPLICATION,),
        )
        running.thread.join(30)
    with pytest.raises(ConnectionRefusedError):
        running.result()
    (error,) = [e for e in logs if e["event"] == "harness.relay.error"]
    assert "broker unreachable" in error["error"]
