"""``core-jobs worker``: one or more consumers, each on its queue, until SIGTERM (harness/worker.py).

It uses the queue adapter ``CORE_JOBS_QUEUE_URL`` selects (unset: the reference queue in the database;
harness/queue/adapters.py); a URL whose adapter cannot be loaded is a configuration error (exit 2) naming the
setting, never its password. ``--metrics-port`` serves /metrics (the harness counters) and /healthz.

Exit codes: 0 stopped as asked (or ``--once`` and the queue empty); 1 the worker failed (lost its database
connection, or a handler raised ``KeyboardInterrupt``: ``harness.worker.error`` says why), or the queue's broker
could not be reached or refused it (one ``broker error`` line naming its ``host:port``, never the password:
:func:`broker_failure`; the worker logs ``harness.worker.error`` too); 2 a configuration or usage error (also a
database whose durability tier does not give what the consumer needs, harness/durability.py, or a URL that reaches a
server in recovery). The worker exits with no other code: a handler's ``SystemExit`` is that job's failure
(harness/worker.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING, Any

from maintenance.cli.common import bounded_int, consumer_references
from maintenance.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.settings import Settings


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from prometheus_client import CollectorRegistry

    from harness.durability import DurabilityTierTooLow
    from harness.errors import describe_error
    from harness.metrics import HarnessMetrics
    from harness.pg import SchemaNotMigrated, ServerInRecovery
    from harness.queue.adapters import QueueUrlError
    from harness.worker import Worker, WorkerConfig, WorkerGroup, WorkerGroupError
    from maintenance.runtime.logs import get_logger
    from maintenance.runtime.signals import on_signals
    from maintenance.service.http import make_server, serve_in_background
    from maintenance.settings import ENV_PREFIX, ConfigError

    consumers = worker_consumers(args.consumers, settings)
    config = WorkerConfig(
        fence_ttl=settings.processed_jobs_ttl,
        lease=settings.worker_lease,
        batch_size=args.batch_size or settings.worker_batch_size,
        poll_interval=settings.worker_poll_interval,
        concurrency=args.concurrency or settings.worker_concurrency,
        reconnect_for=settings.worker_reconnect_for,
        ttl_margin=settings.ttl_margin,
        await_standby=settings.worker_await_standby,
        accept_asynchronous_replication=settings.worker_accept_asynchronous_replication,
        listen=settings.worker_listen,
    )
    stop = threading.Event()  # this command's: SIGTERM/SIGINT set it, every worker finishes the message in hand
    registry = CollectorRegistry()  # every consumer's counters, labelled by consumer, which --metrics-port serves
    metrics = HarnessMetrics(registry)
    try:
        group = WorkerGroup(
            [
                Worker(
                    settings.conninfo(),
                    consumer,
                    policy=settings.retry_policy(consumer.queue),
                    config=config,
                    metrics=metrics,
                    stop=stop,
                    queue_url=settings.queue_url_value(),
                    database_role=settings.worker_database_role,
                )
                for consumer in consumers
            ]
        )
    except QueueUrlError as exc:  # its adapter cannot be imported (an extra not installed)
        raise ConfigError(f"{ENV_PREFIX}QUEUE_URL: {exc}") from None
    if args.metrics_port:  # served until the process exits (a daemon thread), as prometheus_client's own server
        try:  # /metrics (harness_jobs_*_total) and /healthz (every consumer's worker running)
            server = make_server("0.0.0.0", args.metrics_port, health=group.health, registry=registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {args.metrics_port}: cannot listen: {exc.strerror or exc}") from None
        serve_in_background(server)
    names = ", ".join(c.name for c in consumers)

    def stopping(signal_name: str) -> None:
        get_logger().info("harness.worker.stopping", consumer=names, signal=signal_name)

    with on_signals(stop, on_signal=stopping):
        try:
            group.run(once=args.once)
        except WorkerGroupError as exc:  # whatever stopped it, the exit code is a documented one
            if isinstance(exc.error, DurabilityTierTooLow | ServerInRecovery):  # before its threads: the deployment's
                raise ConfigError(str(exc.error)) from None
            # The stop event already carries the counts; say why, and which consumer.
            get_logger().error("harness.worker.error", consumer=exc.consumer, error=describe_error(exc.error))
            if isinstance(exc.error, SchemaNotMigrated) or broker_failure(exc.error, settings) is not None:
                raise exc.error from None  # its one line on stderr, as for every command (maintenance/cli)
            return EXIT_FAILED
    return EXIT_OK


def worker_consumers(references: list[str] | None, settings: Settings) -> list[Any]:
    """The consumers ``core-jobs worker`` runs: every ``--consumer``, else ``CORE_JOBS_WORKER_CONSUMERS``; each
    loaded and its TTL guard checked, or ConfigError (exit 2) naming the one refused and where it was given."""
    from maintenance.consumers import consumer_ttl_guard, load_consumer
    from maintenance.settings import ENV_PREFIX, ConfigError

    references, label = consumer_references(references, settings)
    if not references:
        raise ConfigError(
            f"--consumer is required (or {ENV_PREFIX}WORKER_CONSUMERS): the consumer(s) to run,"
            " e.g. --consumer harness.examples.points:consumer"
        )
    consumers: list[Any] = []
    names: dict[str, str] = {}
    for reference in references:
        consumer = load_consumer(reference, label)
        guard = consumer_ttl_guard(settings, consumer)
        if not guard.ok:
            raise ConfigError(f"{label} {reference}: {guard.explain()}")
        if consumer.name in names:  # one consumer twice in a process: raise its concurrency instead
            raise ConfigError(
                f"{label} {reference}: consumer {consumer.name} is already given as {names[consumer.name]};"
                " run it once, with more --concurrency"
            )
        names[consumer.name] = reference
        consumers.append(consumer)
    return consumers


def broker_failure(exc: BaseException, settings: Settings) -> str | None:
    """What to say of a queue broker that could not be reached or refused a command (one line naming its
    ``host:port``, never the password); None when ``exc`` is no broker's error.

    pika is looked up only if the command loaded it: an error of RabbitMQ's cannot come from a command that did not.
    """
    rabbitmq: Any = sys.modules.get("harness.queue.rabbitmq")
    if rabbitmq is None:
        return None
    if isinstance(exc, rabbitmq.BrokerUnavailable):
        return str(exc)  # "RabbitMQ at host:port unreachable after 3 attempts: why"
    pika_exceptions: Any = sys.modules.get("pika.exceptions")
    if pika_exceptions is not None and isinstance(exc, pika_exceptions.AMQPError):
        from harness.queue.rabbitmq_topology import broker_address

        where = broker_address(settings.queue_url_value() or "")
        return f"RabbitMQ at {where}: {rabbitmq.describe_broker_error(exc)}"
    return None


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``worker`` on the ``core-jobs`` parser."""
    p = sub.add_parser(
        "worker",
        help="run one or more consumers, each on its queue (CORE_JOBS_QUEUE_URL, default the reference one;"
        " graceful on SIGTERM)",
    )
    p.add_argument(
        "--consumer",
        dest="consumers",
        action="append",
        metavar="MODULE:OBJECT",
        help="a Consumer to run, e.g. harness.examples.points:consumer; repeatable: one process runs them all, each"
        " on its own queue (default CORE_JOBS_WORKER_CONSUMERS)",
    )
    p.add_argument(
        "--concurrency",
        type=bounded_int(1, 64),
        metavar="N",
        help="worker threads, 1-64 (default CORE_JOBS_WORKER_CONCURRENCY)",
    )
    p.add_argument(
        "--batch-size",
        type=bounded_int(1, 1000),
        metavar="N",
        help="messages claimed at once, 1-1000 (default CORE_JOBS_WORKER_BATCH_SIZE)",
    )
    p.add_argument("--once", action="store_true", help="stop when no message is ready instead of polling")
    p.add_argument(
        "--metrics-port",
        type=bounded_int(1, 65535),
        metavar="PORT",
        help="serve /metrics (the harness counters, for Prometheus) and /healthz (every consumer running) on this port"
        " (default: not served)",
    )
    p.set_defaults(handler=cmd_worker)
