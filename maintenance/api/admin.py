"""The API's admin mode (``CORE_JOBS_ADMIN_ENABLED``): what it needs before it may start (issue 13).

With admin mode on, ``core-jobs api`` serves ``POST /v1/core/executions/{id}/resolve``. At start
it loads, or refuses to run with a configuration error (exit 2) naming the problem:

- the **published definitions**: every ``CORE_JOBS_ADMIN_CONSUMERS`` entry (``module:attribute``)
  imported, each a durable consumer (one that declares actions) with a business scope, no two
  with one name;
- the **business scopes** it serves (``CORE_JOBS_ADMIN_BUSINESS_SCOPES``);
- the **restricted database session**: one connection, set up exactly as the pool's are (``SET
  ROLE``), must run as ``core_jobs_api`` itself (``current_user``: what the database's
  ``core.execution_api_role_guard`` binds to a resolution), not a superuser, owning no table of
  schema ``core``. A resolution writes the executions' state: only the role whose
  grants migration ``0012_execution_resolution`` limits to that may do it. The database must
  therefore answer at start in admin mode (without it the API starts and ``/readyz`` waits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from maintenance.errors import ConfigError

if TYPE_CHECKING:
    from harness.consumer import Consumer
    from maintenance.settings import Settings

API_ROLE = "core_jobs_api"

# Who the API's session really is once set up: superuser? member of the API role? owner of a core table?
SESSION_ROLE = """
SELECT current_user,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
       pg_has_role(current_user, %(role)s, 'MEMBER'),
       EXISTS (SELECT 1
                 FROM pg_class AS c
                 JOIN pg_namespace AS n ON n.oid = c.relnamespace
                WHERE n.nspname = 'core' AND pg_has_role(current_user, c.relowner, 'MEMBER'))"""


@dataclass(frozen=True)
class AdminConfig:
    """What the resolve route needs: the published definitions by consumer name, and the served scopes."""

    consumers: Mapping[str, Consumer]
    business_scopes: frozenset[str]


def load_definitions(references: list[str]) -> dict[str, Consumer]:
    """The consumers ``references`` name, by name; ConfigError naming the entry that is wrong."""
    from maintenance.cli.harness import load_consumer

    label = "CORE_JOBS_ADMIN_CONSUMERS entry"
    published: dict[str, Consumer] = {}
    for reference in references:
        consumer = load_consumer(reference, label=label)
        if not consumer.durable:
            raise ConfigError(f"{label} {reference!r}: {consumer.name} declares no actions; nothing to resolve")
        if consumer.business_scope is None:
            raise ConfigError(f"{label} {reference!r}: {consumer.name} declares no business_scope")
        if consumer.name in published:
            raise ConfigError(f"{label} {reference!r}: a second definition of consumer {consumer.name}")
        published[consumer.name] = consumer
    return published


def check_restricted_session(conn: psycopg.Connection) -> None:
    """ConfigError unless ``conn`` (set up as the pool's) runs as the restricted API role."""
    row = conn.execute(SESSION_ROLE, {"role": API_ROLE}).fetchone()
    assert row is not None
    user, superuser, member, owner = row
    if superuser:
        problem = f"is superuser {user}"
    elif not member or user != API_ROLE:
        problem = f"runs as {user}, not as {API_ROLE} itself (SET ROLE)"
    elif owner:
        problem = f"runs as {user}, which owns tables of schema core"
    else:
        return
    raise ConfigError(
        f"CORE_JOBS_ADMIN_ENABLED: the API's database session {problem}; admin mode runs only as the restricted "
        f"role {API_ROLE} (set CORE_JOBS_API_DATABASE_ROLE, log in as a role granted {API_ROLE})"
    )


def load_admin(settings: Settings, connect) -> AdminConfig:
    """The admin configuration, checked; ``connect()`` opens a session set up as the pool's."""
    published = load_definitions(settings.admin_consumers)
    try:
        with connect() as conn:
            check_restricted_session(conn)
    except psycopg.OperationalError as exc:
        raise ConfigError(
            f"CORE_JOBS_ADMIN_ENABLED: the database must answer at start to check the API's role: {exc}"
        ) from None
    return AdminConfig(consumers=published, business_scopes=frozenset(settings.admin_business_scopes))
