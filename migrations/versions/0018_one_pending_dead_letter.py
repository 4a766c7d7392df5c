"""One dead letter per failure: at most one ``pending_review`` letter per ``(consumer, job_id)``.

A broker adapter commits a delivery's outcome in PostgreSQL, then acks the broker's message; a
crash between the two redelivers a message whose failure is already recorded. The harness
probes for that (harness/handling.py) and the dead-letter writer inserts ``ON CONFLICT DO
NOTHING`` (harness/dead_letters.py), and this index is what both rely on: a second pending
letter of a job for the same consumer cannot exist, whoever writes it, so one failure never
becomes two letters to review (or two replays of one job).

* ``core.dead_letters_one_pending_per_job_idx`` — a partial unique index on
  ``(consumer, job_id) WHERE status = 'pending_review'``. The normal lifecycle already keeps to
  it: a replay marks its letter ``replayed`` before republishing, so the replay's own failure is
  the job's only pending letter. Letters without a consumer (plain SQL, older writers) are not
  constrained: NULLs are distinct.
* **Duplicates already there** would make the index fail to build. The upgrade keeps the newest
  pending letter of each ``(consumer, job_id)`` (``created_at``, then ``id``) and discards the
  others through the operators' own audited path — a status change to ``discarded`` with a
  ``discard_reason`` naming the letter that supersedes it, which the audit trigger (0003) writes
  to ``core.dead_letter_actions`` with the operator ``migration 0018_one_pending_dead_letter``.
  Nothing is lost: a discarded letter keeps its payload and error, and the newest one still
  stands for the job. The table is locked against writes (``SHARE ROW EXCLUSIVE``: readers go
  on) from the clean-up to the index, so no duplicate can slip in between; the migration's lock
  timeout and retries (maintenance/runtime/migrate.py) bound the wait for it.

Downgrading drops the index. The discards stay: the lifecycle only moves forward (0001), and
the ledger is append-only.

Revision ID: 0018_one_pending_dead_letter
Revises: 0017_trace_context
Create Date: 2026-12-04
"""

from alembic import op

revision = "0018_one_pending_dead_letter"
down_revision = "0017_trace_context"
branch_labels = None
depends_on = None

OPERATOR = "migration 0018_one_pending_dead_letter"

# No write between the clean-up and the index; reads go on.
LOCK = "LOCK TABLE core.dead_letters IN SHARE ROW EXCLUSIVE MODE"

# Who the audit trigger records for the discards below (the session's operator, for this transaction only).
SET_OPERATOR = f"SELECT set_config('core_jobs.operator', '{OPERATOR}', true)"
CLEAR_OPERATOR = "SELECT set_config('core_jobs.operator', '', true)"

# Every pending letter but the newest of its (consumer, job_id) discarded, its reason naming the newest.
DISCARD_SUPERSEDED = """
WITH ranked AS (
    SELECT id,
           first_value(id) OVER newest_first AS newest,
           row_number() OVER newest_first AS position
      FROM core.dead_letters
     WHERE status = 'pending_review' AND consumer IS NOT NULL
    WINDOW newest_first AS (PARTITION BY consumer, job_id ORDER BY created_at DESC, id DESC)
)
UPDATE core.dead_letters AS d
   SET status = 'discarded',
       discard_reason = 'superseded by dead letter ' || r.newest
           || ', the newest pending one of the same job and consumer (migration 0018: one pending dead letter per'
           || ' failure)'
  FROM ranked AS r
 WHERE d.id = r.id AND r.position > 1
"""

CREATE_INDEX = """
CREATE UNIQUE INDEX dead_letters_one_pending_per_job_idx ON core.dead_letters (consumer, job_id)
    WHERE status = 'pending_review';
COMMENT ON INDEX core.dead_letters_one_pending_per_job_idx IS
    'One pending dead letter per failure: at most one pending_review letter per (consumer, job_id).';
"""

DROP_INDEX = "DROP INDEX IF EXISTS core.dead_letters_one_pending_per_job_idx"


def upgrade() -> None:
    op.execute(LOCK)
    op.execute(SET_OPERATOR)
    op.execute(DISCARD_SUPERSEDED)
    op.execute(CLEAR_OPERATOR)
    op.execute(CREATE_INDEX)


def downgrade() -> None:
    op.execute(DROP_INDEX)
