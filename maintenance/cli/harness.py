"""The consumer-side commands of ``core-jobs``: worker, enqueue, dead-letters list/show/errors/replay/discard/release.

``dead-letters list`` and ``errors`` show ``pending_review`` letters, newest first, unless
``--status`` says otherwise (``any``: every status) — the API's default too, one definition in
maintenance/operations/dead_letters.py. ``dead-letters show ID`` is one letter whole: its error,
its stack trace, its payload and its audit history. ``dead-letters errors`` counts the letters by
the first line of their error, biggest group first.

``worker`` and ``enqueue`` use the queue adapter ``CORE_JOBS_QUEUE_URL`` selects (unset: the reference
queue in the database; harness/queue/adapters.py); a URL whose adapter cannot be loaded is a
configuration error (exit 2) naming the setting, never its password.

``dead-letters list`` shows a replayed letter's state as ``replayed:outstanding`` (its delivery
not handled yet: the purge keeps the job's fences) or ``replayed:<outcome>``; ``--outstanding``
lists only those still holding fences. ``dead-letters release`` ends an outstanding replay whose
message will never be delivered (maintenance/operations/dead_letters.py).

Exit codes as for every command: 0 ok; 1 the worker failed (lost its database connection, or a
handler raised ``KeyboardInterrupt``: ``harness.worker.error`` says why), or the database could
not be reached or failed the command (one ``database error`` line on stderr, secrets masked), or
the queue's broker could not be reached or refused it (one ``broker error`` line naming its
``host:port``, never the password: :func:`broker_failure`; the worker logs ``harness.worker.error`` too); 2 a
configuration or usage error (the worker: also a database whose durability tier does not give what the consumer
needs, harness/durability.py, or a URL that reaches a server in recovery), or an operator action refused as a whole (an unknown id, a dead
letter that is not ``pending_review`` — or, for release, not an outstanding replay, or one whose
message still waits in the queue —, a blank reason) — nothing changed. The worker exits with no
other code: a handler's ``SystemExit`` is that job's failure (harness/worker.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from contextlib import closing
from datetime import UTC
from typing import TYPE_CHECKING, Any

from harness.enumerations import DEAD_LETTER_STATUSES
from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, default_operator

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.operations.dead_letters import DeadLetterRow
    from maintenance.settings import Settings


# harness.enumerations imports nothing but typing: --help stays free of psycopg.
STATUS_CHOICES = DEAD_LETTER_STATUSES
ANY_STATUS = "any"
DEFAULT_STATUS = (
    "pending_review"  # maintenance.operations.dead_letters.DEFAULT_STATUS (not imported: --help stays light)
)


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


def consumer_references(given: list[str] | None, settings: Settings) -> tuple[list[str], str]:
    """The consumer references a command runs or checks, and where they were given: every ``--consumer``, else
    ``CORE_JOBS_WORKER_CONSUMERS`` (worker and check-config alike)."""
    from maintenance.settings import ENV_PREFIX

    if given:
        return given, "--consumer"
    return settings.worker_consumers, f"{ENV_PREFIX}WORKER_CONSUMERS"


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


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from harness.consumer.consumer import valid_name
    from harness.queue.adapters import QueueUrlError, adapter_class, open_queue
    from harness.queue.port import (
        NO_TENANT,
        Envelope,
        InvalidEnvelope,
        InvalidPayload,
        check_fields,
        check_payload,
        decode_payload,
    )
    from maintenance.runtime.db import Database
    from maintenance.settings import ENV_PREFIX, ConfigError

    if not valid_name(args.queue):  # a name no consumer can declare: the message would wait forever
        print(
            f"core-jobs: QUEUE {args.queue!r} is not a queue name (letters, digits and . _ : -, no spaces)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        print(f"core-jobs: --payload is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (RecursionError, ValueError):  # valid JSON Python cannot read (too deep, too long a number)
        payload = decode_payload(args.payload)  # an UndecodablePayload that says why
    try:
        check_payload(payload)  # publish checks too; here it is a usage error before any connection
    except InvalidPayload as exc:
        print(f"core-jobs: --payload cannot be published: {exc}", file=sys.stderr)
        return EXIT_USAGE
    envelope = Envelope(
        job_id=args.job_id or uuid.uuid4(),
        payload=payload,
        tenant_id=args.tenant_id or NO_TENANT,
        correlation_id=args.correlation_id,
    )
    try:
        check_fields(args.queue, envelope)
    except InvalidEnvelope as exc:
        print(f"core-jobs: the message cannot be published: {exc}", file=sys.stderr)
        return EXIT_USAGE
    queue_url = settings.queue_url_value()
    try:
        adapter_class(
            queue_url
        )  # before any connection: an extra not installed, a URL it refuses: configuration errors
    except QueueUrlError as exc:
        raise ConfigError(f"{ENV_PREFIX}QUEUE_URL: {exc}") from None
    with (
        Database(settings.conninfo()).connect(autocommit=True) as conn,
        closing(open_queue(queue_url, conn, lease=settings.worker_lease)) as queue,
    ):
        message_id = queue.publish(args.queue, envelope)
    shown = "" if message_id is None else f" (message {message_id})"  # a broker may have no id to tell
    print(f"enqueued job {envelope.job_id} on {args.queue}{shown}")
    return EXIT_OK


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


def _listed_status(args: argparse.Namespace) -> str | None:
    """``--status`` as the operations take it: ``any`` is None; unset, the one default — but every
    status with ``--outstanding``, whose replays are ``replayed`` by definition."""
    if args.status == ANY_STATUS or (args.status is None and getattr(args, "outstanding", False)):
        return None
    return args.status or DEFAULT_STATUS


def cmd_dead_letters_list(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import list_dead_letters
    from maintenance.runtime.db import Database

    with Database(settings.conninfo()).connect(autocommit=True) as conn:
        rows = list_dead_letters(
            conn, queue=args.queue, status=_listed_status(args), outstanding=args.outstanding, limit=args.limit
        )
    if args.json:
        print(json.dumps([_as_json(r) for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print("no dead letters match")
        return EXIT_OK
    print(f"{'id':>6}  {'status':<22}  {'queue':<20}  {'att':>3}  {'created_at (UTC)':<19}  job_id / last_error")
    for r in rows:
        print(
            f"{r.id:>6}  {_state(r):<22}  {r.queue:<20}  {r.attempts:>3}  {r.created_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}  "
            f"{r.job_id}  {_one_line(r.last_error, 80)}"
        )
    return EXIT_OK


def cmd_dead_letters_show(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import get_dead_letter
    from maintenance.operations.stored import shown
    from maintenance.runtime.db import Database

    with Database(settings.conninfo()).connect(autocommit=True) as conn:
        detail = get_dead_letter(conn, args.id)
    if detail is None:
        print(f"core-jobs: dead letter {args.id} does not exist", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        actions = [{**a.__dict__, "acted_at": a.acted_at.isoformat()} for a in detail.actions]
        print(json.dumps(_as_json(detail.row) | {"actions": actions}, indent=2))
        return EXIT_OK
    r = detail.row
    print(f"dead letter {r.id}: {_state(r)}, {r.attempts} attempt(s), created {_utc(r.created_at)} UTC")
    for label, value in (
        ("job", r.job_id),
        ("queue", r.queue),
        ("consumer", r.consumer),
        ("tenant", r.tenant_id),
        ("correlation", r.correlation_id),
        ("trace", r.traceparent),
        ("changed", f"{_utc(r.status_changed_at)} UTC" if r.status_changed_at else None),
        ("discard reason", r.discard_reason),
    ):
        if value is not None:
            print(f"  {label + ':':<15} {value}")
    print(f"  {'error:':<15} {r.last_error}")
    stored = shown("payload", r.payload)
    payload = stored["payload"] if stored["payload_undecodable"] is None else stored["payload_undecodable"]
    print(f"  {'payload:':<15} {json.dumps(payload, default=str)}")
    print("\ntraceback:" if r.traceback else "\ntraceback: none (a poison payload, or written before migration 0022)")
    if r.traceback:
        print("  " + r.traceback.rstrip().replace("\n", "\n  "))
    print("\nactions:" if detail.actions else "\nactions: none")
    for a in detail.actions:
        print(f"  {_utc(a.acted_at)} UTC  {a.action} by {a.operator}" + (f": {a.reason}" if a.reason else ""))
    return EXIT_OK


def cmd_dead_letters_errors(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import OperationRefused, error_groups
    from maintenance.runtime.db import Database

    try:
        with Database(settings.conninfo()).connect(autocommit=True) as conn:
            groups = error_groups(conn, status=_listed_status(args), queue=args.queue, limit=args.limit)
    except OperationRefused as exc:
        print(f"core-jobs: refused: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(
            json.dumps(
                [g.__dict__ | {"oldest": g.oldest.isoformat(), "newest": g.newest.isoformat()} for g in groups],
                indent=2,
            )
        )
        return EXIT_OK
    if not groups:
        print("no dead letters match")
        return EXIT_OK
    print(f"{'count':>6}  {'newest (UTC)':<19}  {'latest':>6}  {'queues':<24}  error")
    for g in groups:
        print(
            f"{g.count:>6}  {_utc(g.newest)}  {g.latest_id:>6}  {_one_line(', '.join(g.queues), 24):<24}  {_one_line(g.error, 80)}"
        )
    return EXIT_OK


def _utc(moment: Any) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def cmd_dead_letters_replay(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import replay

    if bool(args.ids) == bool(args.all_pending):
        print("core-jobs: give dead-letter IDs, or --queue Q --all-pending", file=sys.stderr)
        return EXIT_USAGE
    if args.all_pending and not args.queue:
        print("core-jobs: --all-pending needs --queue Q", file=sys.stderr)
        return EXIT_USAGE
    if args.queue and not args.all_pending:  # replay 7 --queue Q would silently replay 7 of any queue
        print(
            "core-jobs: --queue selects only with --all-pending; to replay by id, give the IDs alone", file=sys.stderr
        )
        return EXIT_USAGE
    return _act(
        settings,
        lambda conn: replay(
            conn,
            args.ids,
            queue=args.queue if args.all_pending else None,
            operator=args.operator,
            reason=args.reason,
            max_rows=settings.dead_letters_bulk_max,
        ),
        "replayed",
        args.operator,
    )


def cmd_dead_letters_discard(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import discard

    return _act(
        settings,
        lambda conn: discard(conn, args.ids, operator=args.operator, reason=args.reason),
        "discarded",
        args.operator,
    )


def cmd_dead_letters_release(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.dead_letters import release

    return _act(
        settings,
        lambda conn: release(conn, args.ids, operator=args.operator, reason=args.reason),
        "released",
        args.operator,
    )


def _act(settings: Settings, action: Any, verb: str, operator: str) -> int:
    from maintenance.operations.dead_letters import OperationRefused
    from maintenance.runtime.db import Database

    if not operator.strip():  # the operations refuse it too, in words that name no option
        print("core-jobs: refused: the operator is unknown: pass --operator NAME (or set $USER)", file=sys.stderr)
        return EXIT_USAGE
    try:
        with Database(settings.conninfo()).connect(autocommit=True) as conn:
            rows: list[DeadLetterRow] = action(conn)
    except OperationRefused as exc:
        for problem in exc.problems:
            print(f"core-jobs: refused: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for r in rows:
        print(f"{verb} dead letter {r.id} (job {r.job_id}, queue {r.queue})")
    print(f"{len(rows)} dead letter(s) {verb}")
    return EXIT_OK


def _state(row: DeadLetterRow) -> str:
    """The status, and for a replayed letter what became of its delivery: ``replayed:outstanding`` until handled."""
    if row.status != "replayed":
        return row.status
    return f"replayed:{row.replay_outcome or 'outstanding'}"


def _as_json(row: DeadLetterRow) -> dict[str, Any]:
    from maintenance.operations.stored import shown

    return {
        k: (str(v) if isinstance(v, uuid.UUID) else v.isoformat() if hasattr(v, "isoformat") else v)
        for k, v in (row.__dict__ | shown("payload", row.payload)).items()
    }


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _bounded_int(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    return parse


def add_limit_option(parser: argparse.ArgumentParser) -> None:
    """``--limit N`` of a list command: 1 to 1 000 000 rows, default 100."""
    parser.add_argument(
        "--limit",
        type=_bounded_int(1, 1_000_000),
        default=100,
        metavar="N",
        help="at most N rows, 1-1000000 (default 100)",
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register worker, enqueue and dead-letters on the ``core-jobs`` parser."""
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
        type=_bounded_int(1, 64),
        metavar="N",
        help="worker threads, 1-64 (default CORE_JOBS_WORKER_CONCURRENCY)",
    )
    p.add_argument(
        "--batch-size",
        type=_bounded_int(1, 1000),
        metavar="N",
        help="messages claimed at once, 1-1000 (default CORE_JOBS_WORKER_BATCH_SIZE)",
    )
    p.add_argument("--once", action="store_true", help="stop when no message is ready instead of polling")
    p.add_argument(
        "--metrics-port",
        type=_bounded_int(1, 65535),
        metavar="PORT",
        help="serve /metrics (the harness counters, for Prometheus) and /healthz (every consumer running) on this port"
        " (default: not served)",
    )
    p.set_defaults(handler=cmd_worker)

    p = sub.add_parser(
        "enqueue", help="publish one message on the queue of CORE_JOBS_QUEUE_URL (default the reference one)"
    )
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--payload", required=True, metavar="JSON")
    p.add_argument("--job-id", type=uuid.UUID, metavar="UUID", help="default: a new random one")
    p.add_argument(
        "--tenant-id",
        type=uuid.UUID,
        metavar="UUID",
        help="default: the nil UUID 00000000-0000-0000-0000-000000000000 (no tenant)",
    )
    p.add_argument("--correlation-id", metavar="ID")
    p.set_defaults(handler=cmd_enqueue)

    dl = sub.add_parser("dead-letters", help="list, replay or discard dead letters (audited)")
    dl_sub = dl.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = {
        "choices": (*STATUS_CHOICES, ANY_STATUS),
        "help": f"{DEFAULT_STATUS} unless given (every status with --outstanding); {ANY_STATUS}: every status",
    }
    p = dl_sub.add_parser("list", help=f"dead letters, newest first ({DEFAULT_STATUS} by default, as the API)")
    p.add_argument("--queue")
    p.add_argument("--status", **status)
    add_limit_option(p)
    p.add_argument(
        "--outstanding",
        action="store_true",
        help="only replays whose delivery is not handled yet (they hold their job's fences)",
    )
    p.add_argument("--json", action="store_true", help="JSON, payloads included")
    p.set_defaults(handler=cmd_dead_letters_list)

    p = dl_sub.add_parser("show", help="one dead letter: its error, traceback, payload and audit history")
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("--json", action="store_true", help="JSON")
    p.set_defaults(handler=cmd_dead_letters_show)

    p = dl_sub.add_parser("errors", help="dead letters grouped and counted by error, biggest group first")
    p.add_argument("--queue")
    p.add_argument("--status", **status)
    add_limit_option(p)
    p.add_argument("--json", action="store_true", help="JSON")
    p.set_defaults(handler=cmd_dead_letters_errors)

    operator = {"default": default_operator(), "help": "who acts, for the audit ledger (default: $USER)"}
    p = dl_sub.add_parser("replay", help="republish with the same job_id and mark replayed")
    p.add_argument("ids", nargs="*", type=int, metavar="ID")
    p.add_argument("--queue")
    p.add_argument("--all-pending", action="store_true", help="every pending dead letter of --queue")
    p.add_argument("--reason", help="why, for the audit ledger")
    p.add_argument("--operator", **operator)
    p.set_defaults(handler=cmd_dead_letters_replay)

    p = dl_sub.add_parser("discard", help="mark discarded, with a reason")
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--reason", required=True, help="why (required, non-blank)")
    p.add_argument("--operator", **operator)
    p.set_defaults(handler=cmd_dead_letters_discard)

    p = dl_sub.add_parser(
        "release",
        help="end an outstanding replay whose message will never be delivered"
        " (its fences become purgeable after the retry window)",
    )
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--reason", required=True, help="why (required, non-blank), e.g. the broker's incident")
    p.add_argument("--operator", **operator)
    p.set_defaults(handler=cmd_dead_letters_release)
