"""The API's admin mode (``CORE_JOBS_ADMIN_ENABLED``): what it needs before it may start (R-5).

With admin mode on, ``core-jobs api`` serves ``POST /v1/core/executions/{id}/resolve``. At start
it loads, or refuses to run with a configuration error (exit 2) naming the problem:

- the **published definitions**: every ``CORE_JOBS_ADMIN_CONSUMERS`` entry (``module:attribute``)
  imported, each a durable consumer (one that declares actions) with a business scope, no two
  with one name;
- the **business scopes** it serves (``CORE_JOBS_ADMIN_BUSINESS_SCOPES``);
- the **restricted database runtime**: one connection, set up exactly as the pool's are (``SET
  ROLE``), must run as ``core_jobs_api`` itself (``current_user``: what the database's API-role
  guards bind), and the **login** (``session_user``) must hold no more than that role: a
  session can ``RESET ROLE`` (or ``SET ROLE`` to any role it may) at will, so what the login
  holds is what the session holds. The login must not be a superuser, nor have ``CREATEROLE``,
  ``CREATEDB``, ``BYPASSRLS`` or ``REPLICATION``; it may be a member of ``core_jobs_api`` and of
  no other role (directly or through another, inherited or only by ``SET ROLE``: any membership
  lends what that role holds, and ``pg_database_owner`` is the database's owner); it may hold no
  privilege on schema ``core`` or its tables, columns and sequences that ``core_jobs_api`` does
  not; and it may own no table of ``core``. A resolution writes the executions' state: only the
  role whose grants migration ``0012_execution_resolution`` limits to that may do it. The
  database must therefore answer at start in admin mode (without it the API starts and
  ``/readyz`` waits). Create the login as ``CREATE ROLE core_jobs_api_login LOGIN PASSWORD '…'
  IN ROLE core_jobs_api`` and grant it nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from maintenance.errors import ConfigError

if TYPE_CHECKING:
    from harness.consumer.consumer import Consumer
    from maintenance.settings import Settings

API_ROLE = "core_jobs_api"

# Who the API's session really is once set up: the role it runs as, and everything its login
# (session_user) holds — what RESET ROLE or SET ROLE would give it — beyond the API role's grants.
SESSION_ROLE = """
SELECT session_user, current_user, l.rolsuper,
       array_remove(ARRAY[CASE WHEN l.rolcreaterole THEN 'CREATEROLE' END, CASE WHEN l.rolcreatedb THEN 'CREATEDB' END,
                          CASE WHEN l.rolbypassrls THEN 'BYPASSRLS' END,
                          CASE WHEN l.rolreplication THEN 'REPLICATION' END], NULL),
       -- Every role the login is a member of (any path, inherited or SET ROLE only), but the API role.
       ARRAY(SELECT r.rolname FROM pg_roles AS r
              WHERE r.rolname NOT IN (session_user, %(role)s) AND pg_has_role(session_user, r.oid, 'MEMBER')
              ORDER BY r.rolname),
       -- What the login may do in schema core that the API role may not.
       ARRAY(SELECT p.privilege || ' on core.' || c.relname
               FROM pg_class AS c
               JOIN pg_namespace AS n ON n.oid = c.relnamespace
              CROSS JOIN unnest(ARRAY['DELETE', 'TRUNCATE', 'TRIGGER']) AS p(privilege)
              WHERE n.nspname = 'core' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
                AND has_table_privilege(session_user, c.oid, p.privilege)
                AND NOT has_table_privilege(%(role)s, c.oid, p.privilege)
             UNION ALL
             SELECT p.privilege || ' (' || a.attname || ') on core.' || c.relname
               FROM pg_class AS c
               JOIN pg_namespace AS n ON n.oid = c.relnamespace
               JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
              CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p(privilege)
              WHERE n.nspname = 'core' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
                AND has_column_privilege(session_user, c.oid, a.attnum, p.privilege)
                AND NOT has_column_privilege(%(role)s, c.oid, a.attnum, p.privilege)
             UNION ALL
             SELECT p.privilege || ' on sequence core.' || c.relname
               FROM pg_class AS c
               JOIN pg_namespace AS n ON n.oid = c.relnamespace
              CROSS JOIN unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p(privilege)
              WHERE n.nspname = 'core' AND c.relkind = 'S'
                AND has_sequence_privilege(session_user, c.oid, p.privilege)
                AND NOT has_sequence_privilege(%(role)s, c.oid, p.privilege)
             UNION ALL
             SELECT 'CREATE on schema core'
              WHERE has_schema_privilege(session_user, 'core', 'CREATE')
                AND NOT has_schema_privilege(%(role)s, 'core', 'CREATE')),
       EXISTS (SELECT 1
                 FROM pg_class AS c
                 JOIN pg_namespace AS n ON n.oid = c.relnamespace
                WHERE n.nspname = 'core'
                  AND (pg_has_role(session_user, c.relowner, 'MEMBER') OR pg_has_role(current_user, c.relowner, 'MEMBER')))
  FROM pg_roles AS l
 WHERE l.rolname = session_user"""

# At most this many of the login's extra privileges are named (a role granted a whole schema has hundreds).
NAMED_PRIVILEGES = 5


@dataclass(frozen=True)
class AdminConfig:
    """What the resolve route needs: the published definitions by consumer name, and the served scopes."""

    consumers: Mapping[str, Consumer]
    business_scopes: frozenset[str]


def load_definitions(references: list[str]) -> dict[str, Consumer]:
    """The consumers ``references`` name, by name; ConfigError naming the entry that is wrong."""
    from maintenance.consumers import load_consumer

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
    """ConfigError unless ``conn`` (set up as the pool's) runs as the API role and its login holds no more."""
    row = conn.execute(SESSION_ROLE, {"role": API_ROLE}).fetchone()
    assert row is not None
    login, user, superuser, attributes, memberships, extra, owner = row
    problems = []
    if superuser:
        problems.append("is a superuser")
    else:
        if attributes:
            problems.append(f"may {', '.join(attributes)}")
        if memberships:
            problems.append(f"is a member of {', '.join(memberships)} (grant it {API_ROLE} only)")
        if extra:
            more = f" and {len(extra) - NAMED_PRIVILEGES} more" if len(extra) > NAMED_PRIVILEGES else ""
            problems.append(f"holds {', '.join(extra[:NAMED_PRIVILEGES])}{more}, which {API_ROLE} does not")
        if owner:
            problems.append("owns tables of schema core")
        if user != API_ROLE:
            problems.append(f"runs as {user}, not as {API_ROLE} itself (SET ROLE)")
    if problems:
        raise ConfigError(
            f"CORE_JOBS_ADMIN_ENABLED: the API's login {login} {'; '.join(problems)}; admin mode runs only as the "
            f"restricted role {API_ROLE}, from a login granted {API_ROLE} and nothing more (a session may RESET ROLE "
            f"at will): set CORE_JOBS_API_DATABASE_ROLE and log in as such a login (docs/api.md)"
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
