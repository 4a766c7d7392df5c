"""``core-jobs alerts identity show|adopt|renew``: the alert identity of a database that may be a copy.

The alert feed refuses to alert when the database is not where its identity was bound, or runs as
another environment (``CORE_JOBS_ALERTS_ENVIRONMENT``) than the one it was bound under, and it has
alerts (alerts/identity.py says why, and what is and is not detected). An
operator then says which it is:

* ``adopt --reason R`` — the same installation, moved (``pg_upgrade``, a dump and restore as the
  upgrade path) or its deployment renamed: the identity is kept and bound here, under the
  environment; its incidents stay its own. Already bound here under it: nothing changes.
* ``renew --reason R`` — a copy (staging restored from prod, a snapshot included): a new
  identity, bound here under the environment; the origin's open alerts are recorded ``resolved``
  (``inherited``), its pending intents ``cancelled`` (``inherited``); nothing is sent to Better
  Stack. Allowed while bound here too (a copy run with its origin's configuration cannot be told
  from it).

Both record ``--environment`` (default: the configured ``CORE_JOBS_ALERTS_ENVIRONMENT``, so run
them where the feed runs, e.g. ``kubectl exec``; ``--environment ''`` records none).
* ``show`` — the identity, its binding, where the database is now, and what the next feed run
  will do.

Both actions are recorded in ``core.installation_history`` with ``--operator`` (default
``$USER``) and the reason, and take the feed's lock (``core_jobs.alerts``), so no run is halfway.

Exit codes as for every command: 0 ok (``show``: the feed will alert); 1 ``show``: the feed
refuses until an operator adopts or renews; the feed's lock is held by a run (try again); the
database could not be reached or refused (one line on stderr); 2 a usage error (a blank reason
or operator) — nothing changed.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, default_operator

if TYPE_CHECKING:  # each command imports what it needs when it runs: the parser stays light
    from maintenance.settings import Settings

NEXT_RUN = {
    "bound_here": "the alert feed alerts under this identity",
    "declares": "the next feed run records the configured environment (the first one) and alerts under this identity",
    "renews_itself": "bound elsewhere, and this database never recorded an alert: the next feed run takes a new"
    " identity by itself",
    "unconfirmed": "the alert feed refuses to alert (it sends Better Stack nothing) until an operator runs"
    " `core-jobs alerts identity adopt` (the same installation, moved or renamed) or `renew` (a copy)",
}


def cmd_identity_show(args: argparse.Namespace, settings: Settings) -> int:
    from alerts.identity import read_identity
    from maintenance.runtime.db import Database

    with Database(settings.conninfo()).connect(autocommit=True) as conn:
        identity = read_identity(conn, configured=settings.alerts_environment)
    print(f"installation {identity.id}")
    print(f"  bound to  {identity.bound}, environment {identity.environment or '(none)'}")
    print(
        f"            {identity.bound_how} by {identity.bound_by} at {identity.bound_at.isoformat()}"
        + (f": {identity.bound_reason}" if identity.bound_reason else "")
    )
    print(f"  here      {identity.here}, environment {identity.configured or '(none)'}")
    print(f"  state     {identity.state}: {NEXT_RUN[identity.state]}")
    return EXIT_FAILED if identity.state == "unconfirmed" else EXIT_OK


def cmd_identity_adopt(args: argparse.Namespace, settings: Settings) -> int:
    from alerts.identity import ADOPTED

    return _rebind(args, settings, ADOPTED)


def cmd_identity_renew(args: argparse.Namespace, settings: Settings) -> int:
    from alerts.identity import RENEWED

    return _rebind(args, settings, RENEWED)


def _rebind(args: argparse.Namespace, settings: Settings, how: str) -> int:
    from alerts.feed import LOCK_NAME
    from alerts.identity import ADOPTED, read_identity, rebind
    from harness.pg import advisory_lock, server_now
    from maintenance.runtime.db import Database
    from maintenance.runtime.logs import get_logger

    reason, operator = (args.reason or "").strip(), (args.operator or "").strip()
    environment = settings.alerts_environment
    if args.environment is not None:
        from pydantic import ValidationError

        from alerts.settings import AlertsFields

        try:
            environment = AlertsFields(alerts_environment=args.environment).alerts_environment
        except ValidationError as exc:
            print(f"core-jobs: refused: --environment {exc.errors()[0]['msg']}", file=sys.stderr)
            return EXIT_USAGE
    if not reason or not operator:
        print("core-jobs: refused: --reason and --operator must not be blank (the binding's audit)", file=sys.stderr)
        return EXIT_USAGE
    with Database(settings.conninfo()).connect(autocommit=True) as conn, advisory_lock(conn, LOCK_NAME) as acquired:
        if not acquired:
            print(f"core-jobs: an alert feed run holds {LOCK_NAME}; try again when it is done", file=sys.stderr)
            return EXIT_FAILED
        identity = read_identity(conn, configured=environment)
        if how == ADOPTED and identity.bound_here and identity.environment == environment:
            print(
                f"installation {identity.id} is already bound to {identity.here}, environment {environment}: nothing changed"
            )
            return EXIT_OK
        done = rebind(conn, how, by=operator, reason=reason, now=server_now(conn), environment=environment)
    audit = {**done.previous.log_fields(), "operator": operator, "reason": reason}
    if how == ADOPTED:
        get_logger(job="alerts").warning("alerts.identity.adopted", **audit)
    else:
        get_logger(job="alerts").warning(
            "alerts.identity.renewed",
            **audit,
            renewed_to=done.installation,
            automatic=False,
            resolved_inherited=done.resolved_inherited,
            cancelled_inherited=done.cancelled_inherited,
        )
    print(
        f"{how}: installation {done.previous.id} -> {done.installation}, bound to {done.previous.here},"
        f" environment {environment or '(none)'}"
    )
    if done.resolved_inherited or done.cancelled_inherited:
        print(
            f"  the origin's alerts, left to it at Better Stack: {done.resolved_inherited} open recorded resolved"
            f" (inherited), {done.cancelled_inherited} pending cancelled (inherited)"
        )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``alerts identity show|adopt|renew`` on the ``core-jobs`` parser."""
    area = sub.add_parser("alerts", help="the alert feed's installation identity (a copied database)")
    alerts_sub = area.add_subparsers(dest="area", required=True, metavar="AREA")
    identity = alerts_sub.add_parser("identity", help="show, adopt or renew this database's alert identity")
    identity_sub = identity.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = identity_sub.add_parser("show", help="the identity, where it is bound, where the database is")
    p.set_defaults(handler=cmd_identity_show)
    for name, handler, help_ in (
        ("adopt", cmd_identity_adopt, "the same installation, moved: keep the identity, bind it here"),
        ("renew", cmd_identity_renew, "a copy: a new identity bound here; the origin's alerts left to it"),
    ):
        p = identity_sub.add_parser(name, help=help_)
        p.add_argument("--reason", required=True, help="why, for core.installation_history (required, non-blank)")
        p.add_argument("--operator", default=default_operator(), help="who acts (default: $USER)")
        p.add_argument(
            "--environment",
            default=None,
            help="the environment to bind it under (default: CORE_JOBS_ALERTS_ENVIRONMENT; '' records none)",
        )
        p.set_defaults(handler=handler)
