"""The fence-hold rule, once: ``core.holds_fence(dead_letter, protected_from)``.

A processed_jobs fence must stay while its job has a dead letter that still needs it (J-B6,
J-AC5; docs/purge.md): one ``pending_review`` (it may be replayed), or one ``replayed`` whose
republished delivery is still outstanding (``replay_handled_at`` NULL) or was handled less than
margin x retry window ago (``replay_handled_at >= protected_from``: a lost ack or a broker
redelivery may still bring it back). Before this revision the rule was spelled out in four
statements of the purge and its demo; now they all call this predicate on a dead letter's row.

The function is a plain SQL expression (no FROM, no sub-query), STABLE, neither STRICT nor
SECURITY DEFINER, with no SET clause, so PostgreSQL inlines it into the calling query and the
plans are those of the rule spelled out: measured with bench/purge_guard.py on 1 M fences
(docs/performance.md), the same or faster in both spellings the purge uses. (A set-returning
function of the holders' job_ids was tried first: the NOT EXISTS spelling over it ran 4-9x
slower, because the planner cannot probe it by job_id.)

Revision ID: 0008_fence_rule
Revises: 0007_replay_outstanding
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008_fence_rule"
down_revision = "0007_replay_outstanding"
branch_labels = None
depends_on = None

CREATE_HOLDS_FENCE = """
CREATE FUNCTION core.holds_fence(d core.dead_letters, protected_from timestamptz) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT d.status = 'pending_review'
        OR (d.status = 'replayed' AND (d.replay_handled_at IS NULL OR d.replay_handled_at >= protected_from))
$$;
COMMENT ON FUNCTION core.holds_fence(core.dead_letters, timestamptz) IS
    'Whether this dead letter keeps its job''s processed_jobs fences: pending review, or replayed and not yet '
    'handled, or handled at/after protected_from (cutoff - margin x retry window). The purge''s rule, once.';
"""

DROP_HOLDS_FENCE = "DROP FUNCTION IF EXISTS core.holds_fence(core.dead_letters, timestamptz);"


def upgrade() -> None:
    op.execute(CREATE_HOLDS_FENCE)


def downgrade() -> None:
    op.execute(DROP_HOLDS_FENCE)
