"""``core-jobs relay``: publish the outbox of queues that live on a broker, until SIGTERM.

A replay or a RESUME publishes in the database, in its own transaction (``core.queue_messages``,
the outbox); for a queue on a broker the relay moves those rows onto the broker
(harness/queue/relay.py, docs/outbox.md). Every worker on a broker already relays its own queue
between batches; this command runs a relay alone — for queues whose workers are scaled to zero,
or to keep the relay's latency off the workers (the Helm chart's optional relay Deployment).

::

    core-jobs relay --queue points.credit [--queue Q2 …] [--once] [--interval SECONDS] [--batch-size N]

Its connection switches to ``core_jobs_relay`` (``CORE_JOBS_RELAY_DATABASE_ROLE``, migration 0020):
the outbox and the dead letter of a row it cannot publish, nothing more.

The broker is the adapter named by ``CORE_JOBS_QUEUE_URL`` (or ``--queue-url``), the same setting
the worker uses; a URL that names the reference queue (unset, ``postgresql://…``) is refused: the
table is that queue itself, there is nothing to relay. The URL's password never reaches a log
line or an error.

It runs until SIGTERM/SIGINT (the batch in hand is finished and acked first), or with ``--once``
until no row of its queues' outbox is ready: rows still under another claimer's live lease (a
relay or worker, maybe a dead one) are not waited for but reported — ``harness.relay.still_leased``
per queue with when the last lease ends on PostgreSQL's clock, ``num_still_leased`` in
``harness.relay.stop`` — and a later run publishes them once the lease is over. A lost database connection (a failover, a restart, a terminated backend, a network cut) does not
stop it: ``harness.relay.connection_lost``, counted ``harness_relay_connections_lost_total``, then it
reconnects with a growing, capped backoff (``harness.relay.reconnect_failed`` per failed try,
``harness.relay.reconnected``), opening its broker port anew too; rows the broker confirmed before
the loss are acked on the new connection (not published again), rows it was giving back are released
there. After ``CORE_JOBS_WORKER_RECONNECT_FOR`` (2 min, the worker's setting) without a connection it
exits 1. ``--once`` does not wait out an outage: exit 1, the rows' leases expire and a later run
publishes them. Exit codes as ``worker``: **0** stopped as asked (or
``--once`` done), **1** the relay failed (the broker or the database: ``harness.relay.error`` says
why; the batch in hand is given back, nothing is lost), **2** a configuration or usage error.
Events: ``harness.relay.start`` / ``harness.relay.stop`` (counts), ``harness.relay.stopping`` on a
signal, ``harness.relay.error``, ``harness.relay.still_leased`` (``--once``),
``harness.relay.connection_lost``, ``harness.relay.reconnect_failed``, ``harness.relay.reconnected``,
``harness.relay.close_failed`` (the previous broker port could not be closed cleanly on a reconnect).
"""

from __future__ import annotations

import argparse
import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from maintenance.cli.common import bounded_int
from maintenance.errors import EXIT_FAILED, EXIT_OK, ConfigError

if TYPE_CHECKING:  # the parser stays light: each command imports what it needs when it runs
    import psycopg

    from harness.queue.pgqueue import PgQueue
    from harness.queue.relay import Publisher
    from maintenance.settings import Settings

APPLICATION_NAME = "core-jobs-relay"
QUEUE_URL_VARIABLE = "CORE_JOBS_QUEUE_URL"
REFERENCE_SCHEMES = ("", "postgresql", "postgres")


def queue_url(args: argparse.Namespace, settings: Settings) -> str | None:
    """The broker's URL: ``--queue-url``, else the setting ``CORE_JOBS_QUEUE_URL``."""
    return args.queue_url or settings.queue_url_value() or None


def open_target(url: str | None, conn: psycopg.Connection, *, worker: str, lease: timedelta) -> Publisher:
    """The adapter ``url`` names (``open_queue``, the harness's adapter selection); a ConfigError for the reference queue."""
    from maintenance.settings import ConfigError

    scheme = urlsplit(url or "").scheme.lower()
    if scheme in REFERENCE_SCHEMES:
        raise ConfigError(
            f"{QUEUE_URL_VARIABLE} names the reference queue (or is unset): core.queue_messages is that queue "
            "itself and there is nothing to relay; set it to the broker's URL (amqp://…)"
        )
    from harness.queue.adapters import open_queue

    try:
        return open_queue(url, conn, worker=worker, lease=lease)
    except ValueError as exc:  # an unknown scheme: open_queue names it, never the password
        raise ConfigError(f"{QUEUE_URL_VARIABLE}: {exc}") from None


def cmd_relay(args: argparse.Namespace, settings: Settings) -> int:
    import socket

    from harness.errors import describe_error
    from harness.pg import SchemaNotMigrated, ServerInRecovery, connect, require_schema
    from harness.queue.pgqueue import PgQueue
    from harness.queue.relay import Relay
    from harness.reconnect import is_lost
    from maintenance.runtime.logs import get_logger
    from maintenance.runtime.signals import on_signals

    name = f"{socket.gethostname()}:{os.getpid()}/relay"
    metrics = _served_metrics(args.metrics_port)
    stop = threading.Event()  # SIGTERM/SIGINT set it: the batch in hand is finished and acked, then it stops
    url = queue_url(args, settings)
    opened: list[tuple[psycopg.Connection, Publisher]] = []  # the session's connection and target; the last is live

    def open_session() -> tuple[PgQueue, Publisher]:
        """A new connection and target (the previous ones closed): at start, and after the connection was lost."""
        close_session()
        conn = connect(
            settings.conninfo(),
            autocommit=True,
            role=settings.relay_database_role,
            application_name=APPLICATION_NAME,
            primary_only=True,  # a lease or the outbox read on a standby would be behind the primary
        )
        try:
            require_schema(conn)  # an unmigrated database: one line saying what to run (exit 2), not UndefinedTable
            target = open_target(url, conn, worker=name, lease=settings.worker_lease)
        except BaseException:
            conn.close()
            raise
        opened.append((conn, target))
        return PgQueue(conn, lease=settings.worker_lease, worker=name), target

    def close_session() -> None:
        while opened:
            conn, target = opened.pop()
            close = getattr(target, "close", None)
            try:
                if close is not None:
                    close()
            except Exception as exc:  # a target whose connection went with the database's
                get_logger().warning("harness.relay.close_failed", error=describe_error(exc))
            finally:
                conn.close()

    try:
        try:
            source, target = open_session()
        except ServerInRecovery as exc:  # the URL reaches a standby: the deployment's to fix (exit 2)
            raise ConfigError(str(exc)) from None
        relay = Relay(source, target, args.queue, batch_size=args.batch_size, metrics=metrics)

        def stopping(signal_name: str) -> None:
            get_logger().info("harness.relay.stopping", queues=relay.queues, signal=signal_name)

        try:
            with on_signals(stop, on_signal=stopping):
                if args.once:
                    result = relay.run_once()
                    leased = relay.report_still_leased()  # not waited for: a later run publishes them
                    get_logger().info(
                        "harness.relay.stop", queues=relay.queues, **result.fields(), num_still_leased=leased, ok=True
                    )
                else:
                    relay.run(
                        stop,
                        interval=timedelta(seconds=args.interval),
                        reconnect=open_session,
                        reconnect_for=settings.worker_reconnect_for,
                    )
        except SchemaNotMigrated:
            raise  # one line saying what to run, exit 2 (maintenance/cli)
        except Exception as exc:  # harness.relay.error already says why; the batch in hand was given back
            if args.once and is_lost(relay.source.conn):  # --once does not wait out an outage
                get_logger().error("harness.relay.error", queues=relay.queues, error=describe_error(exc))
            return EXIT_FAILED
    finally:
        close_session()
    return EXIT_OK


def _served_metrics(port: int | None) -> object | None:
    """The relay's counters (harness_relay_*_total) on a registry of its own, served on ``port``; None: not served."""
    if not port:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from harness.metrics import HarnessMetrics
    from maintenance.settings import ConfigError

    registry = CollectorRegistry()
    metrics = HarnessMetrics(registry)
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: cannot listen: {exc.strerror or exc}") from None
    return metrics


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``relay`` on the ``core-jobs`` parser."""
    p = sub.add_parser("relay", help="publish the outbox (replays, RESUMEs) of queues on a broker, until SIGTERM")
    p.add_argument("--queue", required=True, action="append", metavar="QUEUE", help="a queue to relay (repeatable)")
    p.add_argument("--once", action="store_true", help="stop when the outbox of the queues is empty")
    p.add_argument(
        "--interval",
        type=_positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how often the outbox is read (default 1; the latency bound is about this plus one batch)",
    )
    p.add_argument(
        "--batch-size",
        type=bounded_int(1, 1000),
        default=100,
        metavar="N",
        help="rows per publish, 1-1000 (default 100)",
    )
    p.add_argument(
        "--metrics-port",
        type=bounded_int(1, 65535),
        metavar="PORT",
        help="serve the relay's counters (harness_relay_*_total) for Prometheus on this port (default: not served)",
    )
    p.add_argument(
        "--queue-url", metavar="URL", help=f"the broker (default {QUEUE_URL_VARIABLE}); never logged with its password"
    )
    p.set_defaults(handler=cmd_relay)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 and at most 3600 seconds")
    return value
