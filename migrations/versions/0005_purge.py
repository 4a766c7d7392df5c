"""Purge: the index behind its replay guard for replayed dead letters.

A dead letter replayed less than TTL_MARGIN x the max retry window ago still holds its fence:
the republished job may still be delivered (and retried) and the fence must absorb it
(maintenance/jobs/purge/paths.py). Every purge batch reads the job_ids of those recent replays;
this partial index keeps that a short range scan however many dead letters accumulate (they
are never deleted). On a large live table build it first with CREATE INDEX CONCURRENTLY (same
definition); IF NOT EXISTS then skips it here.

Revision ID: 0005_purge
Revises: 0004_metrics
Create Date: 2026-11-30
"""

from alembic import op

revision = "0005_purge"
down_revision = "0004_metrics"
branch_labels = None
depends_on = None

CREATE_REPLAYED_AT_INDEX = """
CREATE INDEX IF NOT EXISTS dead_letters_replayed_at_idx ON core.dead_letters (status_changed_at, job_id)
    WHERE status = 'replayed';
"""

DROP_REPLAYED_AT_INDEX = "DROP INDEX IF EXISTS core.dead_letters_replayed_at_idx;"


def upgrade() -> None:
    op.execute(CREATE_REPLAYED_AT_INDEX)


def downgrade() -> None:
    op.execute(DROP_REPLAYED_AT_INDEX)
