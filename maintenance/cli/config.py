"""``core-jobs check-config``: the effective settings (secrets redacted), the retry policies and their windows, the
TTL guard (J-B7), the queue's adapter, each ``--consumer``'s own window and guard, with ``--tier`` the database's
durability tier against what each consumer needs; ``--json``: all of it as one document.

It loads the settings and nothing of the jobs' code, the API, Alembic or APScheduler, nor psycopg or httpx but to
check a URL that is not plain or to read the tier (tests/maintenance/cli/test_imports.py). Exit 0 when every guard holds,
2 when one does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from maintenance.cli.common import consumer_references
from maintenance.errors import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from maintenance.settings import Settings

SHOWN_DELAYS = 10  # check-config lists this many retry delays of a policy, then a count


def cmd_check_config(args: argparse.Namespace, settings: Settings) -> int:
    from harness.consumer.retry import compute_delay, max_retry_window
    from maintenance.jobs.catalog import NAMES as JOB_NAMES  # the names only: no job's code is imported
    from maintenance.settings import format_duration

    if args.json:
        return _check_config_json(args, settings)
    out = sys.stdout
    out.write("Effective settings (secrets redacted):\n")
    for name, value in settings.effective().items():
        out.write(f"  {name}={value}\n")
    out.write("\nRetry policies (J-B3) and their worst-case retry windows:\n")
    for queue, policy in settings.retry_policies().items():
        label = "default" if queue is None else f"queue {queue}"
        if queue is not None:
            out.write(f"  {label}: justification: {settings.retry_overrides[queue].justification}\n")
        shown = min(policy.max_attempts - 1, SHOWN_DELAYS)  # a huge max_attempts must not print them all
        nominal = [format_duration(compute_delay(policy, k, random=lambda: 0.5)) for k in range(1, shown + 1)]
        if policy.max_attempts - 1 > shown:
            nominal.append(f"… ({policy.max_attempts - 1 - shown} more)")
        out.write(
            f"  {label}: {policy.max_attempts} attempts, nominal delays {', '.join(nominal) or 'none'};"
            f" window {format_duration(max_retry_window(policy))}\n"
        )
    out.write(f"  broker redelivery horizon: {settings.redelivery_horizon().explain()}\n")
    guard = settings.ttl_guard()
    out.write(f"\nTTL guard (J-B7): {guard.explain()}\n")
    out.write(f"\nQueue: {_queue_shown(settings)}\n")
    references, label = consumer_references(args.consumers, settings)
    consumers_ok = _check_consumers(references, label, settings, out)
    durability_ok = True
    if args.tier:
        durability = _durability_document(references, settings)
        durability_ok = durability["ok"]
        out.write(f"\nDurability tier (read from the primary): {durability['tier']}\n  {durability['meaning']}\n")
        for consumer in durability["consumers"]:
            verdict = "ok" if consumer["ok"] else f"REFUSED: {consumer['shortfall']}"
            if consumer["accepted"]:
                verdict = f"accepted (CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION): {consumer['shortfall']}"
            out.write(f"  {consumer['consumer']}: needs {consumer['needs']}: {verdict}\n")
    out.write(f"\nJobs: {', '.join(JOB_NAMES) or '(none registered)'}\n")
    return EXIT_OK if guard.ok and consumers_ok and durability_ok else EXIT_USAGE


def _check_config_json(args: argparse.Namespace, settings: Settings) -> int:
    """check-config --json: the effective settings (secrets redacted), the guards and the jobs, one document."""
    from maintenance.consumers import consumer_ttl_guard, load_consumer
    from maintenance.jobs.catalog import NAMES as JOB_NAMES
    from maintenance.settings import ENV_PREFIX

    guard = settings.ttl_guard()
    consumers: list[dict[str, Any]] = []
    references, label = consumer_references(args.consumers, settings)
    for reference in references:
        consumer = load_consumer(reference, label)
        consumer_guard = consumer_ttl_guard(settings, consumer)
        consumers.append(
            {
                "consumer": consumer.name,
                "reference": reference,
                "guard": {"ok": consumer_guard.ok, "explanation": consumer_guard.explain()},
            }
        )
    durability = _durability_document(references, settings) if args.tier else None
    ok = guard.ok and all(c["guard"]["ok"] for c in consumers) and (durability is None or durability["ok"])
    effective = settings.effective()
    document = {
        "ok": ok,
        "settings": effective,
        "guard": {"ok": guard.ok, "explanation": guard.explain()},
        "queue": {"url": effective[f"{ENV_PREFIX}QUEUE_URL"], "adapter": settings.queue_adapter()},
        "redelivery_horizon": _horizon_document(settings),
        "consumers": consumers,
        "durability": durability,
        "jobs": list(JOB_NAMES),
    }
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    return EXIT_OK if ok else EXIT_USAGE


def _durability_document(references: list[str], settings: Settings) -> dict[str, Any]:
    """check-config --tier: the database's durability tier, read from the primary
    (harness/durability.py), what it means, and per consumer what it needs and whether the worker would start."""
    import psycopg

    from harness.durability import needs_of, read_tier
    from harness.errors import describe_error
    from harness.pg import connect
    from harness.queue.adapters import url_scheme
    from maintenance.consumers import load_consumer

    try:
        with connect(settings.conninfo(), autocommit=True, primary_only=True, connect_timeout=10) as conn:
            tier = read_tier(conn)
    except psycopg.Error as exc:  # ServerInRecovery among them: the worker would not start either
        return {"ok": False, "tier": f"unknown ({describe_error(exc)})", "meaning": "", "fields": None, "consumers": []}
    broker = url_scheme(settings.queue_url_value()) is not None
    barrier = settings.worker_await_standby is not None
    accepting = settings.worker_accept_asynchronous_replication
    consumers = []
    for reference in references:
        needs = needs_of(load_consumer(reference), broker=broker)
        shortfall = tier.shortfall(needs, barrier=barrier)
        consumers.append(
            {
                "consumer": reference,
                "needs": needs.describe(),
                "ok": shortfall is None or accepting,
                "accepted": shortfall is not None and accepting,
                "shortfall": shortfall,
            }
        )
    return {
        "ok": all(c["ok"] for c in consumers),
        "tier": tier.describe(),
        "meaning": tier.meaning(),
        "fields": tier.fields(),
        "barrier": barrier,
        "consumers": consumers,
    }


def _horizon_document(settings: Settings) -> dict[str, Any]:
    """The TTL guard's broker horizon for check-config --json: the one used, the setting, the adapter's and its source."""
    from maintenance.settings import format_duration

    horizon = settings.redelivery_horizon()
    adapter = horizon.adapter
    return {
        "value": format_duration(horizon.value),
        "setting": format_duration(horizon.setting),
        "adapter": None
        if adapter is None
        else {"name": adapter.adapter, "horizon": format_duration(adapter.horizon), "source": adapter.source},
        "explanation": horizon.explain(),
    }


def _queue_shown(settings: Settings) -> str:
    """The adapter CORE_JOBS_QUEUE_URL selects (harness/queue/adapters.py), and why."""
    from harness.queue.adapters import url_scheme
    from maintenance.settings import ENV_PREFIX

    scheme = url_scheme(settings.queue_url_value())
    why = (
        f"{ENV_PREFIX}QUEUE_URL unset: the reference queue, core.queue_messages in the {ENV_PREFIX}DATABASE_URL database"
        if scheme is None
        else f"selected by the scheme {scheme}"
    )
    return f"{settings.queue_adapter()} ({why})"


def _check_consumers(references: list[str], label: str, settings: Settings, out: Any) -> bool:
    """check-config --consumer: each consumer's own window (a durable one's execution window,
    harness/durable/window.py) and its TTL guard, worded as the settings' guard; False if any is short."""
    if not references:
        return True
    from harness.durable.window import max_execution_window, max_takes  # the harness's consumer model: psycopg
    from maintenance.consumers import consumer_ttl_guard, load_consumer
    from maintenance.settings import format_duration

    ok = True
    out.write("\nConsumers (J-B7; a durable consumer's window counts its actions' retries and take-overs):\n")
    for reference in references:
        consumer = load_consumer(reference, label)
        queue_policy = settings.retry_policy(consumer.queue)
        window = max_execution_window(consumer, queue_policy, settings.worker_lease)
        if consumer.durable:
            actions = ", ".join(f"{a.name} {a.effect.value} {a.policy.max_attempts} attempts" for a in consumer.actions)
            takes = max_takes(consumer, queue_policy)
            shape = (
                f"durable, actions {actions}; final write {consumer.policy(queue_policy).max_attempts} attempts;"
                f" at most {takes} takes x lease {format_duration(settings.worker_lease)};"
                f" execution window {format_duration(window)}"
            )
        else:
            shape = f"no actions; retry window {format_duration(window)}"
        guard = consumer_ttl_guard(settings, consumer)
        ok = ok and guard.ok
        out.write(f"  {consumer.name} ({reference}): {shape}\n    TTL guard: {guard.explain()}\n")
    return ok


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``check-config`` on the ``core-jobs`` parser."""
    p = sub.add_parser("check-config", help="print the effective settings and the TTL/retry-window guard")
    p.add_argument(
        "--consumer",
        dest="consumers",
        action="append",
        metavar="MODULE:OBJECT",
        help="also check this consumer's own window against the TTL (repeatable), e.g. harness.examples.points:consumer",
    )
    p.add_argument(
        "--tier",
        action="store_true",
        help="also read the database's durability tier from the primary, and check each --consumer's needs against it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document (settings, guards, jobs) instead")
    p.set_defaults(handler=cmd_check_config)
