"""The environment: the ``CORE_JOBS_`` prefix, unknown-variable detection and error messages that name the variable.

Every setting is the variable ``CORE_JOBS_<FIELD NAME IN CAPITALS>``, read case-insensitively
(as pydantic-settings does). Before anything is read, every ``CORE_JOBS_*`` variable must be a
setting or one of :data:`FOREIGN_VARIABLES`; anything else is a :class:`~maintenance.errors.ConfigError`
naming it and the closest valid name, so a typo never silently falls back to a default.
Validation errors are turned into ``CORE_JOBS_NAME: problem`` lines (:func:`describe_error`)
that never echo the value given: it could be a secret.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from maintenance.errors import ConfigError

ENV_PREFIX = "CORE_JOBS_"

# Variables with our prefix that are not settings of the application itself. The loyalty
# ledger's URL is the example durable consumer's (harness/examples/ledger_points.py), which a
# `core-jobs worker --consumer` process reads.
FOREIGN_VARIABLES = frozenset(
    {
        "CORE_JOBS_TEST_DATABASE_URL",
        "CORE_JOBS_TEST_RABBITMQ_URL",
        "CORE_JOBS_REQUIRE_RABBITMQ",
        "CORE_JOBS_REQUIRE_CLUSTERS",
        "CORE_JOBS_BENCH_DATABASE_URL",
        "CORE_JOBS_LOYALTY_LEDGER_URL",
    }
)


def variable_names(fields: Iterable[str]) -> list[str]:
    """The environment variable of each settings field: ``processed_jobs_ttl`` -> ``CORE_JOBS_PROCESSED_JOBS_TTL``."""
    return [ENV_PREFIX + name.upper() for name in fields]


def check_unknown_variables(environ: Mapping[str, str], known: Iterable[str]) -> None:
    """ConfigError naming the first ``CORE_JOBS_*`` variable of ``environ`` that is neither ``known`` nor foreign."""
    known = set(known)
    for key in sorted(environ):
        name = key.upper()  # pydantic-settings reads the variables case-insensitively
        if not name.startswith(ENV_PREFIX) or name in known or name in FOREIGN_VARIABLES:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; see `core-jobs check-config` for the valid names"
        raise ConfigError(f"unknown setting {key}{hint}")


def describe_error(error: Mapping[str, Any]) -> str:
    """One pydantic validation error as ``CORE_JOBS_NAME[key]: problem``, without the value given."""
    loc = [str(part) for part in error.get("loc", ())]
    name = ENV_PREFIX + loc[0].upper() if loc else ENV_PREFIX
    if len(loc) > 1:
        name += "[" + "].[".join(loc[1:]) + "]"
    message = error.get("msg", "invalid")
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error.get("type") == "missing":
        message = "is required"
    return f"{name}: {message}"
