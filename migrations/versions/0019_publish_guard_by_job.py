"""The API role's guards at a cost that does not grow: the RESUME's execution found by its job, plans kept per session.

Every resolution and replay through the API fires the API-role guards (0012, 0014, 0017). Profiled
on a RESUME (``perf`` on its PostgreSQL backend, 2 000 resolutions: 1.4 ms of backend CPU each),
two things cost more than the rule needs:

* **The RESUME's execution, found by walking every PENDING one.** The publish guard read it as
  ``e.job_id = m.job_id AND e.status = 'PENDING'``, and the planner could start from
  ``executions_status_idx`` for ``status = 'PENDING'`` — estimated at one row whenever the last
  ANALYZE saw none, the usual state, as a PENDING execution lives until a worker takes it — and
  filter by job: each RESUME then read every PENDING execution not yet taken (and, after a bulk
  change, the dead index entries behind them: 220-290 ms once). 3 000 RESUMEs with the worker
  stopped: 2 999 rows and 2.2 ms per check at the end, growing. Now the status is a filter only
  (``(e.status = 'PENDING') IS TRUE``, never an index condition), so the execution is found by
  ``executions_job_consumer_key`` (its leading column is the job id the message carries) and the
  resolution by its unique ``fencing_token``: 0.02 ms, whatever the statistics.
* **SQL functions planned again on every call.** ``core.acts_as_api_role()`` (each guard's first
  test) and ``core.replay_queued_twice()`` were ``LANGUAGE sql``; neither can be inlined (a
  sub-select; SECURITY DEFINER), so PostgreSQL parsed and planned their bodies at every call —
  a fifth of the backend's CPU for a RESUME (``fmgr_sql``: 20.7 % of the samples, planning
  10.2 %). As ``plpgsql`` their plans are prepared once per session. And a publish that carries no
  replay (a RESUME of an execution holding none) no longer asks whether a replay is queued twice.

The rules are unchanged, word for word otherwise. The downgrade restores 0014's functions and
0017's guard.

Revision ID: 0019_publish_guard_by_job
Revises: 0018_one_pending_dead_letter
Create Date: 2026-12-05
"""

from importlib import import_module

from alembic import op

revision = "0019_publish_guard_by_job"
down_revision = "0018_one_pending_dead_letter"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"

PENDING_0014 = "WHERE e.job_id = m.job_id AND e.status = 'PENDING' AND e.queue = m.queue"
PENDING = "WHERE e.job_id = m.job_id AND (e.status = 'PENDING') IS TRUE AND e.queue = m.queue"

TWICE_0014 = """    twice := core.replay_queued_twice(ARRAY(SELECT replay_of FROM published WHERE replay_of IS NOT NULL));
    IF twice IS NOT NULL THEN"""
TWICE = """    IF EXISTS (SELECT 1 FROM published WHERE replay_of IS NOT NULL) THEN  -- only a replay can be queued twice
        twice := core.replay_queued_twice(ARRAY(SELECT replay_of FROM published WHERE replay_of IS NOT NULL));
    END IF;
    IF twice IS NOT NULL THEN"""

FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION core.acts_as_api_role() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The grants in effect are the API role's (itself, or inherited by a login granted it), and
    -- no superuser's: what the API-role guards bind. plpgsql, so the plan is kept per session (0019).
    RETURN pg_has_role(current_user, '{API_ROLE}', 'USAGE')
       AND NOT coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), false);
END $$;

-- Of these letters, the first one more than one queued message replays (as the owner: the API
-- role reads no message). plpgsql, so the plan is kept per session (0019).
CREATE OR REPLACE FUNCTION core.replay_queued_twice(letters bigint[]) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT replay_of FROM core.queue_messages
             WHERE replay_of = ANY (letters)
             GROUP BY replay_of HAVING count(*) > 1
             ORDER BY replay_of LIMIT 1);
END $$;
"""


def functions_of_0014() -> str:
    """0014's ``core.acts_as_api_role()`` and ``core.replay_queued_twice()``, as CREATE OR REPLACE."""
    text = import_module("migrations.versions.0014_api_publish_guard").CREATE
    found = []
    for name in ("core.acts_as_api_role()", "core.replay_queued_twice("):
        start = text.index(f"CREATE FUNCTION {name}")
        end = text.index("$$;", text.index("AS $$", start) + len("AS $$")) + len("$$;")
        found.append(text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    return "\n\n".join(found)


def guard_of_0017() -> str:
    """0017's ``core.queue_messages_api_role_guard``, as CREATE OR REPLACE."""
    return import_module("migrations.versions.0017_trace_context").guard()


def guard() -> str:
    """0017's guard, with the execution of a RESUME found by its job id, and no duplicate-replay test without a replay."""
    of_0017 = guard_of_0017()
    assert of_0017.count(PENDING_0014) == 1, "0017's guard reads the PENDING execution once"
    assert of_0017.count(TWICE_0014) == 1, "0017's guard tests for a replay queued twice once"
    return of_0017.replace(PENDING_0014, PENDING).replace(TWICE_0014, TWICE)


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute(guard())


def downgrade() -> None:
    op.execute(guard_of_0017())
    op.execute(functions_of_0014())
