"""The Better Stack heartbeat after job runs, wired to the settings (the ping: ``alerts/heartbeat.py``).

``core-jobs run-once`` pings once after all its jobs; ``core-jobs serve`` after each scheduled
run. Nothing happens without ``CORE_JOBS_BETTERSTACK_HEARTBEAT_URL``; a failed ping is logged
(``alerts.heartbeat.failed``) and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from alerts.heartbeat import send_heartbeat
from maintenance.runtime.logs import get_logger
from maintenance.settings import Settings


def ping_heartbeat(settings: Settings, outcomes: Sequence[Any], *, source: str) -> None:
    """Ping after the runs in ``outcomes`` (runner outcomes: ``name``, ``ok``); ``source`` opens the body."""
    if settings.betterstack_heartbeat_url is None:
        return
    send_heartbeat(
        settings.betterstack_heartbeat_url.get_secret_value(),
        ran_jobs=[o.name for o in outcomes],
        failed_jobs=[o.name for o in outcomes if not o.ok],
        timeout=settings.betterstack_timeout.total_seconds(),
        source=source,
        log=get_logger(),
    )
