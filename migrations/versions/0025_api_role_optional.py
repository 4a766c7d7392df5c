"""The API role may be absent: ``core.acts_as_api_role()`` answers false instead of failing every publish.

``CORE_JOBS_MIGRATE_API_ROLE=false`` (migrations/api_role.py) lets a deployment that does not run the
operations API migrate without creating the cluster-wide role ``core_jobs_api``. The guards on
``core.queue_messages``, ``core.executions`` and ``core.execution_checkpoints`` ask
``core.acts_as_api_role()`` (0014, 0019) whether the session acts as that role, with
``pg_has_role(current_user, 'core_jobs_api', 'USAGE')`` — which raises ``role "core_jobs_api" does not exist``
when there is no such role: every publish, every claim's trigger, would fail. Now the function looks the role up
first (``to_regrole``) and answers false without it: no session can act as a role that does not exist. With the
role present it answers exactly as before (the same test, the same plpgsql plan cache).

The downgrade restores 0019's function.

Revision ID: 0025_api_role_optional
Revises: 0024_queue_ready_notify
Create Date: 2026-12-07
"""

from importlib import import_module

from alembic import op

revision = "0025_api_role_optional"
down_revision = "0024_queue_ready_notify"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"

ACTS_AS_API_ROLE = f"""
CREATE OR REPLACE FUNCTION core.acts_as_api_role() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    api oid := to_regrole('{API_ROLE}');
BEGIN
    -- The grants in effect are the API role's (itself, or inherited by a login granted it), and no superuser's:
    -- what the API-role guards bind. No such role in the cluster (CORE_JOBS_MIGRATE_API_ROLE=false): nobody acts
    -- as it, and pg_has_role is not asked (it raises for a role that does not exist).
    IF api IS NULL THEN
        RETURN false;
    END IF;
    RETURN pg_has_role(current_user, api, 'USAGE')
       AND NOT coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), false);
END $$;
"""


def function_of_0019() -> str:
    """0019's ``core.acts_as_api_role()``, as CREATE OR REPLACE: the first statement of its FUNCTIONS."""
    functions = import_module("migrations.versions.0019_publish_guard_by_job").FUNCTIONS
    start = functions.index("CREATE OR REPLACE FUNCTION core.acts_as_api_role()")
    end = functions.index("END $$;", start) + len("END $$;")
    return functions[start:end]


def upgrade() -> None:
    op.execute(ACTS_AS_API_ROLE)


def downgrade() -> None:
    op.execute(function_of_0019())
