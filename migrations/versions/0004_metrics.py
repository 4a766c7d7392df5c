"""Metrics: the success-volume watermark, and the processed_at index the success count uses.

``core.metrics_watermark`` holds one row per counter (today only ``success_volume``): how far
the fences have been counted (``counted_until``; NULL before the first run) and the cumulative
totals per consumer (and named tenant). It is the only row the metrics job writes (J-B9:
successes are metrics, not rows). The watermark never moves backwards — a trigger refuses it.

INDEX_CHOICE below is the index on ``core.processed_jobs.processed_at``; see its comment for
the measurement behind it (bench/metrics_index.py, docs/performance.md, "Metrics").

Revision ID: 0004_metrics
Revises: 0003_harness
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004_metrics"
down_revision = "0003_harness"
branch_labels = None
depends_on = None

CREATE_WATERMARK = """
CREATE TABLE core.metrics_watermark (
    name          text        PRIMARY KEY,
    counted_until timestamptz,
    totals        jsonb       NOT NULL DEFAULT '{}',
    updated_at    timestamptz,
    CONSTRAINT metrics_watermark_name_known CHECK (name IN ('success_volume')),
    CONSTRAINT metrics_watermark_totals_object CHECK (jsonb_typeof(totals) = 'object')
);
COMMENT ON TABLE core.metrics_watermark IS
    'Success-volume watermark of `core-jobs run-once metrics`: fences with processed_at < counted_until are counted in totals. Delete the row to restart the counters.';

-- The watermark only moves forward: going back would count fences twice.
CREATE FUNCTION core.metrics_watermark_forward_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.counted_until IS NOT NULL
       AND (NEW.counted_until IS NULL OR NEW.counted_until < OLD.counted_until) THEN
        RAISE EXCEPTION 'core.metrics_watermark: % cannot move back from % to %',
              OLD.name, OLD.counted_until, NEW.counted_until
            USING ERRCODE = 'check_violation',
                  HINT = 'delete the row to restart the counters instead';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER metrics_watermark_forward_only BEFORE UPDATE ON core.metrics_watermark
    FOR EACH ROW EXECUTE FUNCTION core.metrics_watermark_forward_only();

INSERT INTO core.metrics_watermark (name) VALUES ('success_volume');
"""

# INDEX_CHOICE: a BRIN on processed_at, for the metrics job's count of the newest fences.
# Measured by bench/metrics_index.py (1M fences, a week; ratios against no index, same run):
#   WAL records per fence insert: none 3.02, btree 4.02, BRIN 3.02 (deterministic; the fence
#     is in every consumer's work transaction, and BRIN adds nothing to it while the tail
#     range is unsummarized);
#   one fence per committed transaction: btree x1.02, BRIN x1.02 (noise level);
#   bulk insert of 200k: btree x1.24, BRIN x1.26 (five runs: 1.06-1.42 vs 1.02-1.76: noise);
#   count of the newest minute: none 62 ms, btree 0.46 ms, BRIN 1.65 ms; after 7 purge cycles
#     (every fence replaced in reused pages): none 110 ms, btree 0.23 ms, BRIN 2.30 ms;
#   size: btree 42,880 kB, BRIN 24 kB.
# A count once a minute does not need a btree's 1 ms less, and every fence would pay a WAL
# record, an index page and vacuum work for it. Without an index each run scans the whole table.
# IF NOT EXISTS: on a large live table, build it first with CREATE INDEX CONCURRENTLY (same
# definition) so the migration does not hold fence inserts during the build.
INDEX_CHOICE = """
CREATE INDEX IF NOT EXISTS processed_jobs_processed_at_idx ON core.processed_jobs
    USING brin (processed_at) WITH (autosummarize = on);
"""

DROP_ALL = """
DROP INDEX IF EXISTS core.processed_jobs_processed_at_idx;
DROP TABLE IF EXISTS core.metrics_watermark;
DROP FUNCTION IF EXISTS core.metrics_watermark_forward_only();
"""


def upgrade() -> None:
    op.execute(CREATE_WATERMARK)
    op.execute(INDEX_CHOICE)


def downgrade() -> None:
    op.execute(DROP_ALL)
