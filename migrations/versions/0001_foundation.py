"""Foundation: core.processed_jobs fences and core.dead_letters with database-enforced invariants.

The invariants live in the database so that no client — ours, a psql session, a future
service — can break them, and each violation names its rule:

* a dead letter is born ``pending_review``;
* the only status transitions are ``pending_review -> replayed | discarded`` (J-B8);
* discarding needs a non-blank ``discard_reason`` (J-AC7);
* every other column is immutable and rows are never deleted or truncated (append-only
  except the status transition, J-D2).

Revision ID: 0001_foundation
Revises:
Create Date: 2026-11-30
"""

from alembic import op

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None

CREATE_PROCESSED_JOBS = """
-- The idempotency fence. One row per (job, consumer), written in the consumer's work
-- transaction (J-B1). Kept until expires_at, then purged in batches by `core-jobs run-once purge`.
CREATE TABLE core.processed_jobs (
    job_id       uuid        NOT NULL,
    consumer     text        NOT NULL,
    tenant_id    uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    CONSTRAINT processed_jobs_pkey PRIMARY KEY (job_id, consumer),
    CONSTRAINT processed_jobs_consumer_not_blank CHECK (btrim(consumer) <> ''),
    CONSTRAINT processed_jobs_expires_after_processed CHECK (expires_at > processed_at)
);
COMMENT ON TABLE core.processed_jobs IS
    'Idempotency fences (seed 000 J-B1): one row per processed (job_id, consumer); purged after expires_at.';

-- The purge walks this index in expiry order.
CREATE INDEX processed_jobs_expires_at_idx ON core.processed_jobs (expires_at);
"""

CREATE_DEAD_LETTERS = """
-- Every failure, persisted for review (J-B4). Append-only except the status transition.
CREATE TABLE core.dead_letters (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            uuid        NOT NULL,
    queue             text        NOT NULL,
    payload           jsonb       NOT NULL,
    attempts          integer     NOT NULL,
    last_error        text        NOT NULL,
    status            text        NOT NULL DEFAULT 'pending_review',
    discard_reason    text,
    correlation_id    text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Extras beyond the seed, all nullable so a plain INSERT of the seed's columns works.
    tenant_id         uuid,
    consumer          text,
    status_changed_at timestamptz,
    CONSTRAINT dead_letters_queue_not_blank CHECK (btrim(queue) <> ''),
    CONSTRAINT dead_letters_attempts_not_negative CHECK (attempts >= 0),
    CONSTRAINT dead_letters_status_valid CHECK (status IN ('pending_review', 'replayed', 'discarded')),
    CONSTRAINT dead_letters_discard_requires_reason
        CHECK (status <> 'discarded' OR btrim(coalesce(discard_reason, '')) <> ''),
    CONSTRAINT dead_letters_reason_only_when_discarded
        CHECK (status = 'discarded' OR discard_reason IS NULL)
);
COMMENT ON TABLE core.dead_letters IS
    'Failed jobs for review (seed 000 J-B4). Append-only except status: pending_review -> replayed | discarded.';

-- Pending dead letters are the working set of the alert feed (by queue and age) and of the
-- purge's replay-safety check (by job_id); handled ones are history and stay out of these.
CREATE INDEX dead_letters_pending_queue_idx ON core.dead_letters (queue, created_at)
    WHERE status = 'pending_review';
CREATE INDEX dead_letters_pending_job_idx ON core.dead_letters (job_id)
    WHERE status = 'pending_review';
CREATE INDEX dead_letters_job_id_idx ON core.dead_letters (job_id);
"""

CREATE_DEAD_LETTER_GUARDS = """
-- A dead letter is born pending_review: the review lifecycle starts at its beginning.
CREATE FUNCTION core.dead_letters_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'pending_review' THEN
        RAISE EXCEPTION 'core.dead_letters: a new dead letter must be pending_review, not %', NEW.status
            USING ERRCODE = 'check_violation',
                  HINT = 'insert it pending_review, then replay or discard it';
    END IF;
    NEW.status_changed_at := NULL;
    RETURN NEW;
END $$;

-- Append-only except the status transition pending_review -> replayed | discarded.
CREATE FUNCTION core.dead_letters_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
BEGIN
    -- Every column but the review state is immutable; checked generically so that a column
    -- added later is protected too.
    SELECT o.key INTO changed
      FROM jsonb_each(to_jsonb(OLD)) AS o
     WHERE o.key NOT IN ('status', 'discard_reason', 'status_changed_at')
       AND o.value IS DISTINCT FROM (to_jsonb(NEW) -> o.key)
     ORDER BY o.key
     LIMIT 1;
    IF changed IS NOT NULL THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: column % of dead letter % cannot be changed', changed, OLD.id
            USING ERRCODE = 'check_violation',
                  HINT = 'only status may change, from pending_review to replayed or discarded';
    END IF;

    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF OLD.status <> 'pending_review' OR NEW.status NOT IN ('replayed', 'discarded') THEN
            RAISE EXCEPTION 'dead letter % cannot move from % to %: the only transitions are pending_review -> replayed | discarded',
                  OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.status = 'discarded' AND btrim(coalesce(NEW.discard_reason, '')) = '' THEN
            RAISE EXCEPTION 'discarding dead letter % requires a non-blank discard_reason (J-AC7)', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.status_changed_at := now();
    ELSIF NEW.discard_reason IS DISTINCT FROM OLD.discard_reason THEN
        RAISE EXCEPTION 'core.dead_letters: discard_reason of dead letter % is set only when it is discarded', OLD.id
            USING ERRCODE = 'check_violation';
    ELSE
        NEW.status_changed_at := OLD.status_changed_at;
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION core.dead_letters_forbid_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.dead_letters is append-only: dead letters are never deleted (% refused)', TG_OP
        USING ERRCODE = 'check_violation',
              HINT = 'discard it with a reason instead';
END $$;

CREATE TRIGGER dead_letters_guard_insert BEFORE INSERT ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_guard_insert();
CREATE TRIGGER dead_letters_guard_update BEFORE UPDATE ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_guard_update();
CREATE TRIGGER dead_letters_forbid_delete BEFORE DELETE ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_forbid_delete();
CREATE TRIGGER dead_letters_forbid_truncate BEFORE TRUNCATE ON core.dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION core.dead_letters_forbid_delete();
"""

DROP_ALL = """
DROP TABLE IF EXISTS core.dead_letters;
DROP FUNCTION IF EXISTS core.dead_letters_guard_insert();
DROP FUNCTION IF EXISTS core.dead_letters_guard_update();
DROP FUNCTION IF EXISTS core.dead_letters_forbid_delete();
DROP TABLE IF EXISTS core.processed_jobs;
"""


def upgrade() -> None:
    op.execute(CREATE_PROCESSED_JOBS)
    op.execute(CREATE_DEAD_LETTERS)
    op.execute(CREATE_DEAD_LETTER_GUARDS)


def downgrade() -> None:
    op.execute(DROP_ALL)
