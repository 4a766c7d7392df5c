"""The Better Stack heartbeat: a dead-man's switch for the whole maintenance run.

After ``core-jobs run-once`` (one ping after all its jobs) and, under ``core-jobs serve``, after
each scheduled run, when ``CORE_JOBS_BETTERSTACK_HEARTBEAT_URL`` is set, the run POSTs to that
URL when every job succeeded, or to its ``/fail`` form when one failed, with a short plain-text
body naming the failed jobs. Better Stack raises an incident when no ping arrives within the
heartbeat's period (the CronJob stopped running) or when a ``/fail`` ping arrives (it ran and
failed). Nothing happens without the URL.

A failed ping is logged (``alerts.heartbeat.failed``) and changes nothing else: the exit code
stays the jobs' own. One attempt, no retry: the next scheduled run pings again, and a missing
ping is exactly what the heartbeat is there to notice.

The heartbeat URL's path is a token: it is never logged. Events carry ``url`` as
``scheme://host/…`` only (:func:`maintenance.settings.shown_url`). Events (named ``alerts.*``
like the rest of the Better Stack feed): ``alerts.heartbeat.sent`` (``outcome`` ok|fail,
``num_jobs_failed``), ``alerts.heartbeat.failed`` (``outcome``, ``error``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.errors import describe_error
from maintenance.fields.urls import shown_url
from maintenance.runtime.logs import get_logger

BODY_LIMIT = 1000  # characters of the ping's body


def heartbeat_target(url: str, failed_jobs: Sequence[str]) -> str:
    """The URL to ping: the heartbeat itself, or its ``/fail`` form when a job failed."""
    base = url.rstrip("/")
    return f"{base}/fail" if failed_jobs else base


def heartbeat_body(ran_jobs: Sequence[str], failed_jobs: Sequence[str], source: str = "core-jobs run-once") -> str:
    """One short line for Better Stack's heartbeat output; ``source`` says what ran the jobs."""
    if failed_jobs:
        text = f"{source}: {len(failed_jobs)} of {len(ran_jobs)} jobs failed: {', '.join(failed_jobs)}"
    else:
        text = f"{source}: ok ({', '.join(ran_jobs) or 'no jobs'})"
    return text[:BODY_LIMIT]


def send_heartbeat(
    url: str,
    *,
    ran_jobs: Sequence[str],
    failed_jobs: Sequence[str],
    timeout: float = 10.0,
    source: str = "core-jobs run-once",
    log: Any = None,
) -> bool:
    """Ping the heartbeat; True when Better Stack answered 2xx. Never raises for a network problem."""
    log = log or get_logger()
    outcome = "fail" if failed_jobs else "ok"
    target = heartbeat_target(url, failed_jobs)
    shown = shown_url(url)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            response = client.post(
                target,
                content=heartbeat_body(ran_jobs, failed_jobs, source).encode(),
                headers={"Content-Type": "text/plain; charset=utf-8", "User-Agent": "core-jobs-heartbeat"},
            )
    except httpx.HTTPError as exc:
        error = describe_error(exc).replace(target, shown).replace(url, shown)
        log.warning("alerts.heartbeat.failed", url=shown, outcome=outcome, error=error)
        return False
    if not 200 <= response.status_code < 300:
        log.warning("alerts.heartbeat.failed", url=shown, outcome=outcome, error=f"HTTP {response.status_code}")
        return False
    log.info("alerts.heartbeat.sent", url=shown, outcome=outcome, num_jobs_failed=len(failed_jobs))
    return True


@dataclass(frozen=True)
class Heartbeat:
    """The after-run hook that pings the heartbeat after each run (``CORE_JOBS_BETTERSTACK_HEARTBEAT_URL``,
    ``CORE_JOBS_BETTERSTACK_TIMEOUT``); built once by the composition root, only when a URL is set. Its ``repr``
    shows the URL masked: the path is the heartbeat's token."""

    url: str = field(repr=False)
    timeout_s: float = 10.0

    def __call__(self, outcomes: Sequence[Any], source: str) -> None:
        """Ping after the runs in ``outcomes`` (runner outcomes: ``name``, ``ok``); ``source`` opens the body."""
        send_heartbeat(
            self.url,
            ran_jobs=[o.name for o in outcomes],
            failed_jobs=[o.name for o in outcomes if not o.ok],
            timeout=self.timeout_s,
            source=source,
            log=get_logger(),
        )
