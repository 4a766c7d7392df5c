"""A dead letter keeps the stack trace of its failure beside its one-line ``last_error``.

``last_error`` (``"KeyError: 'tier'"``) says what failed, not where: the helper two frames down
that raised is only in the traceback. ``core.dead_letters.traceback`` holds it as the harness
renders it (harness/errors.py ``describe_traceback``: frames with their source lines, chained
causes, never a frame's locals; masked by the process's credential detector; at most
``MAX_TRACEBACK_CHARS`` = 8 000 characters, which the CHECK holds too).

* Nullable: a failure that was never raised has none (a poison the harness built from a schema's
  verdict), and neither do the letters written before this revision.
* Immutable like every other column but the review state (0001's generic trigger).
* The API role reads it with no new grant: its SELECT on ``core.dead_letters`` is the whole table
  (0009), and its UPDATE stays (status, discard_reason).
* The CHECK is added NOT VALID, then validated: the scan of existing rows (all NULL) runs without
  blocking the writers.

Downgrading drops the column (the tracebacks are lost; ``last_error`` stays).

Revision ID: 0022_dead_letter_traceback
Revises: 0019_publish_guard_by_job
Create Date: 2026-12-08
"""

from alembic import op

revision = "0022_dead_letter_traceback"
down_revision = "0021_object_comments"
branch_labels = None
depends_on = None

MAX_TRACEBACK_CHARS = 8000  # harness.errors.MAX_TRACEBACK_CHARS (tests/schema checks they agree)

ADD_COLUMN = f"""
ALTER TABLE core.dead_letters ADD COLUMN traceback text;
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_traceback_bounded
    CHECK (char_length(traceback) BETWEEN 1 AND {MAX_TRACEBACK_CHARS}) NOT VALID;
COMMENT ON COLUMN core.dead_letters.traceback IS
    'The failure''s stack trace (frames, chained causes; masked, no locals); NULL when it has none.';
"""
VALIDATE = "ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_traceback_bounded"


def upgrade() -> None:
    op.execute(ADD_COLUMN)
    op.execute(VALIDATE)


def downgrade() -> None:
    op.execute("ALTER TABLE core.dead_letters DROP COLUMN traceback")
