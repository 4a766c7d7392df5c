"""The W3C trace context travels with a message, stays on its dead letter, and a replay carries it.

A trace that starts where a job is published must reach every delivery of it, its dead letter,
the operator's replay and the replay's delivery (docs/harness.md, "Traces"). The queue and the
dead letters are where the job lives between those steps, so the context is kept there:

* ``traceparent`` and ``tracestate`` on ``core.queue_messages`` (what the publisher's span was,
  written by ``PgQueue.publish``, handed back by the claim) and on ``core.dead_letters`` (the
  message's, copied by the dead-letter writer). Nullable: a message published without tracing
  has none, and so do the rows written before this revision. ``traceparent`` is the W3C header,
  version ``00`` (``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, neither id all
  zeros, lower case); ``tracestate`` at most 512 characters (the W3C limit), never blank.
* The API role's publish guard (0014) compares them too: a **replay** carries its dead letter's
  ``traceparent`` and ``tracestate`` (both NULL when the letter has none), so the second attempt
  joins the original trace and the API role cannot attach a replay to a trace of its choosing;
  a **RESUME**'s re-queue carries those of the replay it holds (``replay_of``), none otherwise —
  maintenance/operations/resolution.py's REQUEUE_JOB copies them in SQL.
* The role's column grant on ``core.queue_messages`` gains the two columns (its SELECT on
  ``core.dead_letters`` is the whole table already).

Downgrading restores 0014's guard and grant and drops the columns (the contexts are lost).

Revision ID: 0017_trace_context
Revises: 0016_installation_environment
Create Date: 2026-12-03
"""

from importlib import import_module

from alembic import op

from migrations import api_role

revision = "0017_trace_context"
down_revision = "0016_installation_environment"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"
TABLES = ("queue_messages", "dead_letters")

# 0014's comparison of a replay with its letter, and of a RESUME's re-queue with its execution.
REPLAY_0014 = "AND d.correlation_id IS NOT DISTINCT FROM m.correlation_id AND d.payload = m.payload)"
REPLAY = (
    "AND d.correlation_id IS NOT DISTINCT FROM m.correlation_id AND d.payload = m.payload\n"
    "                  AND d.traceparent IS NOT DISTINCT FROM m.traceparent\n"
    "                  AND d.tracestate IS NOT DISTINCT FROM m.tracestate)"
)
RESUME_0014 = "                  AND e.payload = m.payload\n"
RESUME = (
    "                  AND e.payload = m.payload\n"
    "                  AND m.traceparent IS NOT DISTINCT FROM (\n"
    "                          SELECT d.traceparent FROM core.dead_letters AS d WHERE d.id = m.replay_of)\n"
    "                  AND m.tracestate IS NOT DISTINCT FROM (\n"
    "                          SELECT d.tracestate FROM core.dead_letters AS d WHERE d.id = m.replay_of)\n"
)

COLUMNS = "\n".join(
    f"""
ALTER TABLE core.{table}
    ADD COLUMN traceparent text
        CONSTRAINT {table}_traceparent_w3c CHECK (
            traceparent ~ '^00-[0-9a-f]{{32}}-[0-9a-f]{{16}}-[0-9a-f]{{2}}$'
            AND substr(traceparent, 4, 32) <> repeat('0', 32)
            AND substr(traceparent, 37, 16) <> repeat('0', 16)),
    ADD COLUMN tracestate text
        CONSTRAINT {table}_tracestate_w3c CHECK (length(tracestate) <= 512 AND btrim(tracestate) <> ''),
    ADD CONSTRAINT {table}_tracestate_with_parent CHECK (tracestate IS NULL OR traceparent IS NOT NULL);
COMMENT ON COLUMN core.{table}.traceparent IS
    'W3C traceparent of the span that published the job (0017): its deliveries and replays join that trace.';
COMMENT ON COLUMN core.{table}.tracestate IS 'W3C tracestate that goes with traceparent (0017).';
"""
    for table in TABLES
)

GRANT_0009 = "(queue, job_id, tenant_id, correlation_id, payload, replay_of, run_at)"
GRANT = "(queue, job_id, tenant_id, correlation_id, payload, replay_of, run_at, traceparent, tracestate)"


def guard_of_0014() -> str:
    """0014's ``core.queue_messages_api_role_guard``, as CREATE OR REPLACE (the downgrade restores it exactly)."""
    text = import_module("migrations.versions.0014_api_publish_guard").CREATE
    start = text.index("CREATE FUNCTION core.queue_messages_api_role_guard()")
    end = text.index("END $$;", start) + len("END $$;")
    return text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def guard() -> str:
    """0014's guard, comparing the trace context of a replay and of a RESUME's re-queue too."""
    of_0014 = guard_of_0014()
    assert of_0014.count(REPLAY_0014) == 1 and of_0014.count(RESUME_0014) == 1, "0014's guard compares each once"
    return of_0014.replace(REPLAY_0014, REPLAY).replace(RESUME_0014, RESUME)


def upgrade() -> None:
    op.execute(COLUMNS)
    op.execute(guard())
    api_role.execute(f"GRANT INSERT {GRANT} ON core.queue_messages TO {API_ROLE}")


def downgrade() -> None:
    api_role.execute(f"REVOKE INSERT {GRANT} ON core.queue_messages FROM {API_ROLE}")
    api_role.execute(f"GRANT INSERT {GRANT_0009} ON core.queue_messages TO {API_ROLE}")
    op.execute(guard_of_0014())
    for table in TABLES:
        op.execute(f"ALTER TABLE core.{table} DROP COLUMN IF EXISTS tracestate, DROP COLUMN IF EXISTS traceparent")
