"""What a setting is made of: the field types and checks every ``CORE_JOBS_*`` declaration uses.

Durations (``durations.py``), URLs and their secrets (``urls.py``), crontabs (``crontab.py``),
the environment's rules and error messages (``environment.py``), per-queue retry overrides and
the TTL guard (``retry.py``), the broker's redelivery horizon the guard adds (``horizon.py``).
A job declares its settings, which are its configuration, with these (its ``settings.py``);
:class:`maintenance.settings.Settings` composes the declarations. This package imports neither
the settings nor the jobs, so both can import it.
"""

from __future__ import annotations

import json
import re

# A consumer as a setting names it: ``module:attribute`` (maintenance/consumers.py loads it).
CONSUMER_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def listed(value: object) -> object:
    """A list setting's raw value (a ``mode="before"`` validator): ``a,b`` or a JSON list ``["a", "b"]``."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                raise ValueError('not a JSON list: write a,b or ["a", "b"]') from None
        return [part.strip() for part in text.split(",") if part.strip()]
    return value
