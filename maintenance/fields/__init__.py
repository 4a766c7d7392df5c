"""What a setting is made of: the field types and checks every ``CORE_JOBS_*`` declaration uses.

Durations (``durations.py``), URLs and their secrets (``urls.py``), crontabs (``crontab.py``),
the environment's rules and error messages (``environment.py``), per-queue retry overrides and
the TTL guard (``retry.py``), the broker's redelivery horizon the guard adds (``horizon.py``). A job declares its settings with these beside its config
(``maintenance/jobs/<job>/settings.py``); :class:`maintenance.settings.Settings` composes the
declarations. This package imports neither the settings nor the jobs, so both can import it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def default_of(fields: type[BaseModel], name: str) -> Any:
    """The default a settings mixin declares for ``name``: the one place it is written."""
    return fields.model_fields[name].get_default(call_default_factory=True)
