"""``core-jobs enqueue QUEUE --payload JSON``: one message published on the queue of ``CORE_JOBS_QUEUE_URL`` (unset:
the reference queue in the database; harness/queue/adapters.py).

The queue name, the payload and the envelope's fields are checked before any connection: a message no consumer could
take is a usage error (exit 2) saying why; an adapter that cannot be loaded is a configuration error (exit 2) naming
the setting, never its password. Exit 1: the database or the broker could not be reached or refused it.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from contextlib import closing
from typing import TYPE_CHECKING

from maintenance.errors import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.settings import Settings


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from harness.consumer.consumer import valid_name
    from harness.queue.adapters import QueueUrlError, adapter_class, open_queue
    from harness.queue.ids import new_job_id
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
        job_id=args.job_id or new_job_id(),
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


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``enqueue`` on the ``core-jobs`` parser."""
    p = sub.add_parser(
        "enqueue", help="publish one message on the queue of CORE_JOBS_QUEUE_URL (default the reference one)"
    )
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--payload", required=True, metavar="JSON")
    p.add_argument("--job-id", type=uuid.UUID, metavar="UUID", help="default: a new time-ordered one (UUID version 7)")
    p.add_argument(
        "--tenant-id",
        type=uuid.UUID,
        metavar="UUID",
        help="default: the nil UUID 00000000-0000-0000-0000-000000000000 (no tenant)",
    )
    p.add_argument("--correlation-id", metavar="ID")
    p.set_defaults(handler=cmd_enqueue)
