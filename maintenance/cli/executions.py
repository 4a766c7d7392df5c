"""``core-jobs executions list|show``: the durable-action executions, read-only.

``list`` shows one state (default ``RECONCILIATION_REQUIRED``: the executions waiting for an
operator), oldest in that state first, optionally of one consumer, job id or business scope,
at most ``--limit`` rows (it says so when more match). ``show ID`` prints one execution with its
payload, its checkpoints in action order (effect, status, attempts, result, last error, and the
external key ``job_id:consumer:action`` to look the write up at the provider) and its history.
Both read :mod:`maintenance.operations.executions`, as the API does; ``--json`` prints its rows as JSON.
Nothing here changes an execution: resolving one is ``POST /v1/core/executions/{id}/resolve``
(R-5, docs/durable-actions.md).

Exit codes as for every command: 0 ok (an empty list too); 1 the database could not be reached
or failed the query (one ``database error`` line on stderr, secrets masked); 2 a usage error —
an unknown status, a limit out of range, an id that is no execution — naming the problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from harness.enumerations import EXECUTION_STATUSES
from maintenance.cli.common import add_limit_option, bounded_int, one_line
from maintenance.errors import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.operations.executions import ExecutionDetail
    from maintenance.settings import Settings

# harness.enumerations imports nothing but typing: --help stays free of psycopg.
STATUS_CHOICES = EXECUTION_STATUSES
DEFAULT_STATUS = "RECONCILIATION_REQUIRED"


def cmd_executions_list(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.executions import ExecutionFilter, list_executions
    from maintenance.runtime.db import Database

    where = ExecutionFilter(
        status=args.status, consumer=args.consumer, job_id=args.job_id, business_scope=args.business_scope
    )
    with Database(settings.conninfo()).connect(autocommit=True) as conn:
        page = list_executions(conn, where, limit=args.limit)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in page.rows], indent=2, default=_jsonable))
        return EXIT_OK
    if not page.rows:
        print(f"no {args.status} executions match")
        return EXIT_OK
    print(f"{'id':>6}  {'status':<23}  {'consumer':<22}  {'since (UTC)':<19}  job_id / reason")
    for r in page.rows:
        print(
            f"{r.id:>6}  {r.status:<23}  {r.consumer:<22}  {_utc(r.status_changed_at)}  "
            f"{r.job_id}  {one_line(r.reason or '', 80)}"
        )
    if page.next is not None:
        print(f"(more match: the first {args.limit} are shown; raise --limit)")
    return EXIT_OK


def cmd_executions_show(args: argparse.Namespace, settings: Settings) -> int:
    from maintenance.operations.executions import get_execution
    from maintenance.runtime.db import Database

    with Database(settings.conninfo()).connect(autocommit=True) as conn:
        detail = get_execution(conn, args.id)
    if detail is None:
        print(
            f"core-jobs: execution {args.id} does not exist (it may have succeeded: then only its fence remains)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.json:
        print(json.dumps(_as_json(detail), indent=2, default=_jsonable))
        return EXIT_OK
    r = detail.row
    print(f"execution {r.id}: {r.status} since {_utc(r.status_changed_at)} UTC")
    for label, value in (
        ("job", r.job_id),
        ("consumer", r.consumer),
        ("queue", r.queue),
        ("tenant", r.tenant_id),
        ("correlation", r.correlation_id),
        ("business scope", r.business_scope),
        ("reason", r.reason),
        ("reason action", r.reason_action),
        ("takes", r.takes),
        ("lease", f"{r.leased_by} until {_utc(r.lease_expires_at)}" if r.lease_expires_at else None),
        ("run at", _utc(r.run_at) if r.status == "RETRY_WAIT" else None),
        ("created", _utc(r.created_at)),
    ):
        if value is not None:
            print(f"  {label + ':':<15} {value}")
    print(f"  {'payload:':<15} {_stored(detail.payload)}")
    print("\ncheckpoints:" if detail.checkpoints else "\ncheckpoints: none (no action started)")
    for c in detail.checkpoints:
        print(f"  {c.position}. {c.action} [{c.effect}] {c.status}, {c.attempts} attempt(s), key {c.idempotency_key}")
        print(f"     started {_utc(c.started_at)}" + (f", finished {_utc(c.finished_at)}" if c.finished_at else ""))
        if c.result is not None:
            print(f"     result: {_stored(c.result, 200)}")
        if c.last_error:
            print(f"     last error: {one_line(c.last_error, 200)}")
    print("\nhistory:" if detail.events else "\nhistory: none")
    for v in detail.events:
        where = f" {v.action}" if v.action else ""
        attempt = f" attempt {v.attempt}" if v.attempt is not None else ""
        run_at = f", runs at {_utc(v.run_at)}" if v.run_at else ""
        print(
            f"  {_utc(v.at)}  {v.kind}{where}{attempt}{run_at}" + (f": {one_line(v.detail, 160)}" if v.detail else "")
        )
    return EXIT_OK


def _as_json(detail: ExecutionDetail) -> dict[str, Any]:
    """The detail as JSON; a payload or result Python cannot decode as ``null`` and ``<name>_undecodable``."""
    from maintenance.operations.stored import shown

    return {
        "row": dataclasses.asdict(detail.row),
        **shown("payload", detail.payload),
        "checkpoints": [
            dataclasses.asdict(dataclasses.replace(c, result=None)) | shown("result", c.result)
            for c in detail.checkpoints
        ],
        "events": [dataclasses.asdict(v) for v in detail.events],
    }


def _stored(value: Any, width: int | None = None) -> str:
    """A stored JSON value, cut to ``width``; one Python cannot decode as its stored text, said so."""
    from maintenance.operations.stored import UndecodablePayload

    text = f"(undecodable: {value.reason}) {value.text}" if isinstance(value, UndecodablePayload) else json.dumps(value)
    return one_line(text, width) if width is not None else text


def _utc(moment: datetime | None) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}" if moment is not None else "-"


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``executions list|show`` on the ``core-jobs`` parser."""
    ex = sub.add_parser("executions", help="list or show durable-action executions (read-only)")
    ex_sub = ex.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = ex_sub.add_parser("list", help="executions in one state, oldest in it first")
    p.add_argument(
        "--status", choices=STATUS_CHOICES, default=DEFAULT_STATUS, help=f"the state to list (default {DEFAULT_STATUS})"
    )
    p.add_argument("--consumer", help="only this consumer's executions")
    p.add_argument("--job-id", type=uuid.UUID, metavar="UUID", help="only this job's executions")
    p.add_argument("--business-scope", metavar="SCOPE", help="only executions of consumers declaring this scope")
    add_limit_option(p)
    p.add_argument("--json", action="store_true", help="JSON rows (payloads: executions show)")
    p.set_defaults(handler=cmd_executions_list)

    p = ex_sub.add_parser("show", help="one execution with its payload, checkpoints and history")
    p.add_argument("id", type=bounded_int(1, 2**63 - 1), metavar="ID")
    p.add_argument("--json", action="store_true", help="the execution as JSON")
    p.set_defaults(handler=cmd_executions_show)
