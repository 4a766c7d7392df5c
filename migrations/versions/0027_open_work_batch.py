"""A shared work batch commits only by its worker: a handler's COMMIT of it is refused.

The worker writes a batch's fences in one statement when it opens the batch's transaction
(harness/handling.py), before the jobs' handlers run. A handler that ran ``COMMIT`` itself would
commit the fences of its batch-mates not yet run — each of those jobs then done in the fence's
eyes with no work: lost. So the transaction marks itself open:

* ``core.open_work_batches`` — one row per open batch transaction, keyed by its transaction id
  (``pg_current_xact_id()``), inserted when the batch opens and deleted by the worker's own commit
  just before its ``COMMIT``. UNLOGGED: a row never outlives its transaction.
* ``open_work_batch_refuses_commit`` — a DEFERRABLE INITIALLY DEFERRED constraint trigger on its
  INSERT, run at commit: a row still there is a COMMIT the worker did not send, and it fails —
  the whole transaction (every fence and every job's work) rolls back. A handler that swallows the
  refusal and begins a transaction of its own is found by the worker before the next job runs.
* ``core.unfence_unrun(consumer, job_ids)`` — SECURITY DEFINER: deletes the given fences of the
  consumer only when **this** transaction wrote them (their ``xmin`` is its id), i.e. fences never
  committed: the batch's jobs not yet run when the worker stops, which then commits the rest. The
  worker role deletes no committed fence (that stays the purge's).

Revision ID: 0027_open_work_batch
Revises: 0025_api_role_optional
"""

from alembic import op

revision = "0027_open_work_batch"
down_revision = "0025_api_role_optional"
branch_labels = None
depends_on = None

WORKER_ROLE = "core_jobs_worker"

UPGRADE = f"""
CREATE UNLOGGED TABLE core.open_work_batches (
    xid xid8 PRIMARY KEY DEFAULT pg_current_xact_id()
);

COMMENT ON TABLE core.open_work_batches IS
    'Open shared work batches, one row per transaction: deleted by the worker''s own commit; a COMMIT that finds its '
    'row is refused (0027).';

CREATE FUNCTION core.refuse_open_work_batch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM core.open_work_batches WHERE xid = NEW.xid) THEN
        RAISE EXCEPTION 'a shared work batch commits only by its worker: this COMMIT was not the worker''s'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'a handler must not end its work transaction (COMMIT, ROLLBACK)';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION core.refuse_open_work_batch() IS
    'At commit: fails while the transaction''s row in core.open_work_batches is there (a COMMIT not the worker''s, '
    'which deletes the row first) (0027).';

CREATE CONSTRAINT TRIGGER open_work_batch_refuses_commit AFTER INSERT ON core.open_work_batches
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION core.refuse_open_work_batch();

CREATE FUNCTION core.unfence_unrun(p_consumer text, p_job_ids uuid[]) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (
        DELETE FROM core.processed_jobs
         WHERE consumer = p_consumer AND job_id = ANY(p_job_ids)
           AND xmin::text = (pg_current_xact_id()::text::numeric % 4294967296)::text
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;

COMMENT ON FUNCTION core.unfence_unrun(text, uuid[]) IS
    'Delete fences this very transaction wrote (never committed ones): a stopping worker''s unrun batch jobs (0027).';

REVOKE ALL ON FUNCTION core.unfence_unrun(text, uuid[]) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{WORKER_ROLE}') THEN
        GRANT SELECT, INSERT, DELETE ON core.open_work_batches TO {WORKER_ROLE};
        GRANT EXECUTE ON FUNCTION core.unfence_unrun(text, uuid[]) TO {WORKER_ROLE};
    END IF;
END
$$;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS core.unfence_unrun(text, uuid[]);
DROP TABLE IF EXISTS core.open_work_batches;
DROP FUNCTION IF EXISTS core.refuse_open_work_batch();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
