"""The API role's publish guard finds a RESUME's execution by the job's id, whatever the statistics.

``core.queue_messages_api_role_guard`` (0014, with 0017's trace context) lets the API role
publish a job only as the re-queue of a RESUME recorded in the same transaction (or the replay
of a letter it marks replayed). Its RESUME test reads the job's execution and the resolution
that carries its token. Spelled ``e.job_id = m.job_id AND e.status = 'PENDING'``, the planner
could start from ``executions_status_idx`` for ``status = 'PENDING'`` — estimated at one row
whenever the last ANALYZE saw none, which is the usual state: a PENDING execution lives until a
worker takes it — and filter by job: every RESUME then walked every PENDING execution (and,
after a bulk change, the dead index entries behind them: 220-290 ms once), and the cost grew
with each RESUME not yet taken. Measured (bench/resolution.py, 3 000 RESUMEs while the worker
is stopped): 2 999 rows read and 2.2 ms per guard check at the end, the guard's INSERT the
statement PostgreSQL spent the most CPU on, and 8 operators' RESUMEs barely faster in
aggregate than one operator's.

Now the status is a filter only (``(e.status = 'PENDING') IS TRUE``: never an index
condition), so the execution is found by ``executions_job_consumer_key`` (its leading column
is the job id, which the message carries), and the resolution by its unique ``fencing_token``.
The rule is unchanged, word for word otherwise; the downgrade restores 0017's text.

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

PENDING_0014 = "WHERE e.job_id = m.job_id AND e.status = 'PENDING' AND e.queue = m.queue"
PENDING = "WHERE e.job_id = m.job_id AND (e.status = 'PENDING') IS TRUE AND e.queue = m.queue"


def guard_of_0017() -> str:
    """0017's ``core.queue_messages_api_role_guard``, as CREATE OR REPLACE."""
    return import_module("migrations.versions.0017_trace_context").guard()


def guard() -> str:
    """0017's guard, with the execution of a RESUME found by its job id."""
    of_0017 = guard_of_0017()
    assert of_0017.count(PENDING_0014) == 1, "0017's guard reads the PENDING execution once"
    return of_0017.replace(PENDING_0014, PENDING)


def upgrade() -> None:
    op.execute(guard())


def downgrade() -> None:
    op.execute(guard_of_0017())
