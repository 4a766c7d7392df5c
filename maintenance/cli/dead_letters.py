"""``core-jobs dead-letters list|show|errors|replay|discard|release``: the dead letters, and the operator's audited
actions on them (maintenance/operations/dead_letters.py, as the API's).

``dead-letters list`` and ``errors`` show ``pending_review`` letters, newest first, unless
``--status`` says otherwise (``any``: every status) — the API's default too, one definition in
maintenance/operations/dead_letters.py. ``dead-letters show ID`` is one letter whole: its error,
its stack trace, its payload and its audit history. ``dead-letters errors`` counts the letters by
the first line of their error, biggest group first.

``dead-letters list`` shows a replayed letter's state as ``replayed:outstanding`` (its delivery
not handled yet: the purge keeps the job's fences) or ``replayed:<outcome>``; ``--outstanding``
lists only those still holding fences. ``dead-letters release`` ends an outstanding replay whose
message will never be delivered (maintenance/operations/dead_letters.py).

Exit codes as for every command: 0 ok; 1 the database could not be reached or failed the command (one
``database error`` line on stderr, secrets masked); 2 a usage error, or an operator action refused as a whole (an unknown id, a dead letter that
is not ``pending_review`` — or, for release, not an outstanding replay, or one whose message still waits in the
queue —, a blank reason) — nothing changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import UTC
from typing import TYPE_CHECKING, Any

from harness.enumerations import DEAD_LETTER_STATUSES
from maintenance.cli.common import add_limit_option, one_line
from maintenance.errors import EXIT_OK, EXIT_USAGE, default_operator

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.operations.dead_letters import DeadLetterRow
    from maintenance.settings import Settings


# harness.enumerations imports nothing but typing: --help stays free of psycopg.
STATUS_CHOICES = DEAD_LETTER_STATUSES
ANY_STATUS = "any"
DEFAULT_STATUS = (
    "pending_review"  # maintenance.operations.dead_letters.DEFAULT_STATUS (not imported: --help stays light)
)


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
            f"{r.job_id}  {one_line(r.last_error, 80)}"
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
            f"{g.count:>6}  {_utc(g.newest)}  {g.latest_id:>6}  {one_line(', '.join(g.queues), 24):<24}  {one_line(g.error, 80)}"
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


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``dead-letters list|show|errors|replay|discard|release`` on the ``core-jobs`` parser."""
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
