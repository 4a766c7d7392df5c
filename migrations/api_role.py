"""Whether this migration run creates the cluster-wide role ``core_jobs_api`` and grants it its privileges.

``CORE_JOBS_MIGRATE_API_ROLE`` (default true), handed to the migrations by ``core-jobs migrate`` as the Alembic
config attribute ``api_role`` (migrations/env.py). A deployment that does not run the operations API sets it
false: then every migration that would create the role (0009), grant it something (0009, 0010, 0012, 0014,
0017), revoke from it or drop it (their downgrades) skips those statements — the role is cluster-wide, and a
database that never uses it has no business creating it. The guards that name it by text (0012's, 0014's and
0019's ``core.acts_as_api_role()``, made safe for an absent role by 0025) stay: they bind only a session acting
as the role, and there is none. docs/deployment.md, "For the DBA".
"""

from __future__ import annotations

from alembic import context, op

API_ROLE = "core_jobs_api"


def wanted() -> bool:
    """True unless this run was told to leave the API role alone (``CORE_JOBS_MIGRATE_API_ROLE=false``)."""
    return bool(context.config.attributes.get("api_role", True))


def execute(statement: str) -> None:
    """``op.execute(statement)`` — a statement about the API role only — when the run creates the role."""
    if wanted():
        op.execute(statement)
