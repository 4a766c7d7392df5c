"""Replays tracked until their delivery is handled: the purge holds a replayed job's fence until then.

A replayed dead letter is *outstanding* until the harness handles the republished delivery with a
final outcome. Until this revision the purge held the fence for a fixed
``TTL_MARGIN x`` retry window after the replay (22 min 24 s with the defaults), and a replay
waiting longer in a backlog was applied twice.

* ``core.dead_letters.replay_outcome`` — NULL while the letter is pending or discarded, and while
  it is replayed and its delivery not yet handled (*outstanding*). Then, set once: ``processed``,
  ``duplicate`` or ``dead_lettered`` (by the harness, in the transaction of that outcome),
  ``released`` (by an operator, with a reason: ``core-jobs dead-letters release``), or
  ``untracked`` (replayed before this revision, see below).
  ``replay_handled_at`` is stamped by the database when the outcome is set.
* ``core.queue_messages.replay_of`` — the dead letter a message replays; a replay publishes it
  and the harness reads it back from the delivery (``Envelope.replay_of``).
* ``dead_letters_replay_hold_idx`` on ``(replay_handled_at, job_id)`` of replayed letters: the
  purge reads the outstanding replays (``IS NULL``) and those handled within margin x window
  from its tail. It replaces ``dead_letters_replayed_at_idx`` (0005), which only the purge used.
* The database enforces: an outcome only on a replayed letter, set once and never changed, the
  stamp with it, and a reason for ``released`` (``core_jobs.reason``); a release is audited in
  ``core.dead_letter_actions`` (action ``released``).

Dead letters already replayed at upgrade time: one whose republished message still waits in
``core.queue_messages`` (same job and queue, published in the replay's own transaction, so
``enqueued_at = status_changed_at``) stays outstanding and its message is tagged with it. Any
other — its message was handled already, or it lives in a broker this database cannot see — is
``untracked`` with ``replay_handled_at = status_changed_at``: it keeps exactly the protection it
had before (margin x window after the replay), no less and no more.

On a large live ``core.dead_letters`` build the index first with CREATE INDEX CONCURRENTLY (same
definition); IF NOT EXISTS then skips it here.

Revision ID: 0007_replay_outstanding
Revises: 0006_alert_identity
Create Date: 2026-12-01
"""

from alembic import op

revision = "0007_replay_outstanding"
down_revision = "0006_alert_identity"
branch_labels = None
depends_on = None

ADD_COLUMNS = """
ALTER TABLE core.dead_letters
    ADD COLUMN replay_outcome    text,
    ADD COLUMN replay_handled_at timestamptz,
    ADD CONSTRAINT dead_letters_replay_outcome_valid
        CHECK (replay_outcome IN ('processed', 'duplicate', 'dead_lettered', 'released', 'untracked')),
    ADD CONSTRAINT dead_letters_replay_outcome_only_when_replayed
        CHECK (replay_outcome IS NULL OR status = 'replayed'),
    ADD CONSTRAINT dead_letters_replay_handled_stamped
        CHECK ((replay_outcome IS NULL) = (replay_handled_at IS NULL));
COMMENT ON COLUMN core.dead_letters.replay_outcome IS
    'NULL while pending, discarded, or replayed and its delivery not yet handled (outstanding: the purge holds the job''s fences); then processed | duplicate | dead_lettered | released | untracked.';

ALTER TABLE core.queue_messages ADD COLUMN replay_of bigint;
COMMENT ON COLUMN core.queue_messages.replay_of IS
    'The core.dead_letters id this message replays; the harness marks that replay handled with the delivery''s final outcome.';
-- The release command checks that no replayed message still waits; only replays are indexed.
CREATE INDEX queue_messages_replay_of_idx ON core.queue_messages (replay_of) WHERE replay_of IS NOT NULL;
"""

# Replays made before this revision (see the module docstring). The guard trigger is set aside
# for the backfill: it would stamp now() instead of the replay's own time.
BACKFILL = """
WITH letters AS (
    SELECT id, job_id, queue, status_changed_at,
           row_number() OVER (PARTITION BY job_id, queue, status_changed_at ORDER BY id) AS n
      FROM core.dead_letters
     WHERE status = 'replayed'
), messages AS (
    SELECT id, job_id, queue, enqueued_at,
           row_number() OVER (PARTITION BY job_id, queue, enqueued_at ORDER BY id) AS n
      FROM core.queue_messages
)
UPDATE core.queue_messages AS m
   SET replay_of = l.id
  FROM messages AS w
  JOIN letters AS l
    ON l.job_id = w.job_id AND l.queue = w.queue AND l.status_changed_at = w.enqueued_at AND l.n = w.n
 WHERE m.id = w.id;

ALTER TABLE core.dead_letters DISABLE TRIGGER dead_letters_guard_update;
UPDATE core.dead_letters AS d
   SET replay_outcome = 'untracked', replay_handled_at = coalesce(d.status_changed_at, d.created_at)
 WHERE d.status = 'replayed'
   AND NOT EXISTS (SELECT 1 FROM core.queue_messages AS m WHERE m.replay_of = d.id);
ALTER TABLE core.dead_letters ENABLE TRIGGER dead_letters_guard_update;
"""

# 0001's guard, plus the replay's outcome: set once on a replayed letter, stamped by the database,
# a reason for a release.
GUARD_UPDATE = """
CREATE OR REPLACE FUNCTION core.dead_letters_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
BEGIN
    -- Every column but the review state and the replay's outcome is immutable; checked
    -- generically so that a column added later is protected too.
    SELECT o.key INTO changed
      FROM jsonb_each(to_jsonb(OLD)) AS o
     WHERE o.key NOT IN ('status', 'discard_reason', 'status_changed_at', 'replay_outcome', 'replay_handled_at')
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

    IF NEW.replay_outcome IS DISTINCT FROM OLD.replay_outcome
       OR NEW.replay_handled_at IS DISTINCT FROM OLD.replay_handled_at THEN
        IF OLD.replay_outcome IS NOT NULL THEN
            RAISE EXCEPTION 'the replay of dead letter % was already handled (%): its outcome cannot change',
                  OLD.id, OLD.replay_outcome
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.status <> 'replayed' OR NEW.replay_outcome IS NULL THEN
            RAISE EXCEPTION 'dead letter % is %: only the replay of a replayed dead letter gets an outcome, once',
                  OLD.id, OLD.status
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.replay_outcome = 'released' AND btrim(coalesce(current_setting('core_jobs.reason', true), '')) = '' THEN
            RAISE EXCEPTION 'releasing the replay of dead letter % requires a reason (core_jobs.reason)', OLD.id
                USING ERRCODE = 'check_violation',
                      HINT = 'core-jobs dead-letters release ID --reason TEXT';
        END IF;
        NEW.replay_handled_at := now();
    END IF;
    RETURN NEW;
END $$;
"""

# A release is an operator's decision: audited like a replay or a discard.
AUDIT_RELEASE = """
ALTER TABLE core.dead_letter_actions DROP CONSTRAINT dead_letter_actions_action_valid;
ALTER TABLE core.dead_letter_actions
    ADD CONSTRAINT dead_letter_actions_action_valid CHECK (action IN ('replayed', 'discarded', 'released')),
    ADD CONSTRAINT dead_letter_actions_release_has_reason
        CHECK (action <> 'released' OR btrim(coalesce(reason, '')) <> '');

CREATE FUNCTION core.dead_letters_audit_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.dead_letter_actions (dead_letter_id, action, operator, reason)
    VALUES (NEW.id, 'released',
            coalesce(nullif(btrim(current_setting('core_jobs.operator', true)), ''), session_user),
            nullif(btrim(current_setting('core_jobs.reason', true)), ''));
    RETURN NULL;
END $$;

CREATE TRIGGER dead_letters_audit_release AFTER UPDATE OF replay_outcome ON core.dead_letters
    FOR EACH ROW WHEN (NEW.replay_outcome = 'released' AND OLD.replay_outcome IS NULL)
    EXECUTE FUNCTION core.dead_letters_audit_release();
"""

INDEXES = """
CREATE INDEX IF NOT EXISTS dead_letters_replay_hold_idx ON core.dead_letters (replay_handled_at, job_id)
    WHERE status = 'replayed';
DROP INDEX IF EXISTS core.dead_letters_replayed_at_idx;
"""

# --- downgrade: 0005's schema (a 'released' ledger row stays; the old check is NOT VALID for it) --
# 0001's guard exactly as 0001 wrote it, so that downgrading gives 0006's schema back unchanged.
GUARD_UPDATE_0001 = """
CREATE OR REPLACE FUNCTION core.dead_letters_guard_update() RETURNS trigger
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
"""

DOWNGRADE = """
DROP TRIGGER IF EXISTS dead_letters_audit_release ON core.dead_letters;
DROP FUNCTION IF EXISTS core.dead_letters_audit_release();
ALTER TABLE core.dead_letter_actions DROP CONSTRAINT IF EXISTS dead_letter_actions_release_has_reason;
ALTER TABLE core.dead_letter_actions DROP CONSTRAINT IF EXISTS dead_letter_actions_action_valid;
ALTER TABLE core.dead_letter_actions
    ADD CONSTRAINT dead_letter_actions_action_valid CHECK (action IN ('replayed', 'discarded')) NOT VALID;
CREATE INDEX IF NOT EXISTS dead_letters_replayed_at_idx ON core.dead_letters (status_changed_at, job_id)
    WHERE status = 'replayed';
DROP INDEX IF EXISTS core.dead_letters_replay_hold_idx;
ALTER TABLE core.dead_letters
    DROP CONSTRAINT IF EXISTS dead_letters_replay_handled_stamped,
    DROP CONSTRAINT IF EXISTS dead_letters_replay_outcome_only_when_replayed,
    DROP CONSTRAINT IF EXISTS dead_letters_replay_outcome_valid,
    DROP COLUMN IF EXISTS replay_handled_at,
    DROP COLUMN IF EXISTS replay_outcome;
DROP INDEX IF EXISTS core.queue_messages_replay_of_idx;
ALTER TABLE core.queue_messages DROP COLUMN IF EXISTS replay_of;
"""


def upgrade() -> None:
    op.execute(ADD_COLUMNS)
    op.execute(BACKFILL)
    op.execute(GUARD_UPDATE)
    op.execute(AUDIT_RELEASE)
    op.execute(INDEXES)


def downgrade() -> None:
    op.execute(GUARD_UPDATE_0001)
    op.execute(DOWNGRADE)
