"""Alert identity: every installation's own id, which scopes the alert feed's keys and lookups.

* ``core.installation`` — exactly one row, written here: a random ``id`` (UUID) made once per
  database. The feed puts it into every alert key and into each incident's metadata
  (``core_jobs_installation``), and a lookup adopts an incident only when both match, so two
  databases sharing one Better Stack team (staging and prod) never take each other's incidents
  even with the same dead-letter ids. The database refuses a second row, any UPDATE, DELETE or
  TRUNCATE. Downgrading this revision drops it; upgrading again makes a new identity, so the
  incidents of the database's earlier life are never adopted (nor are those of a
  ``downgrade base`` + ``migrate``, whose ids restart at 1).

* ``core.dead_letter_alerts.resolution`` — how a ``resolved`` alert ended: ``resolved`` (Better
  Stack has it resolved: by the feed, or already by hand, a 409) or ``gone`` (the incident was
  deleted at Better Stack: the resolve answered 404 and the incident list no longer has it).
  Present exactly when the state is ``resolved``; alerts resolved before this revision get
  ``resolved``. A resolved alert is final: the database refuses any change to it.

* ``core.dead_letter_alerts`` lifecycle ``pending -> open -> resolved`` gains
  ``pending -> cancelled``: an intent that never reached Better Stack and is moot —
  ``cancel_reason`` ``handled`` (all its dead letters were handled before it was posted) or
  ``superseded`` (a ``new`` intent one of whose pending dead letters turned stale: the
  escalation pages them). ``cancelled_at`` and ``cancel_reason`` exactly when cancelled; no
  ``incident_id``; final, like ``resolved``.
* ``core.dead_letter_alert_coverage`` stays append-only, except that the coverage rows of a
  *cancelled* alert may be deleted: a cancelled intent paged nothing, so it releases its dead
  letters still pending review, and the next scan plans them again (one page each, none left
  out). Downgrading deletes the cancelled intents (the old lifecycle has no such state) with
  the coverage they still hold, which is only of handled dead letters.

A database copied from another (``CREATE DATABASE … TEMPLATE``, a restored backup) carries the
identity of its origin: it is stored data, like the rest.

Revision ID: 0006_alert_identity
Revises: 0005_purge
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006_alert_identity"
down_revision = "0005_purge"
branch_labels = None
depends_on = None

CREATE_INSTALLATION = """
CREATE TABLE core.installation (
    id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Always true and unique: the table can hold one row only.
    singleton  boolean     NOT NULL DEFAULT true,
    CONSTRAINT installation_pkey PRIMARY KEY (id),
    CONSTRAINT installation_single_row UNIQUE (singleton),
    CONSTRAINT installation_singleton_true CHECK (singleton)
);
COMMENT ON TABLE core.installation IS
    'This installation''s identity (one row, never changed): scopes the alert keys and Better Stack lookups (issue 9).';

CREATE FUNCTION core.installation_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.installation is written once, by its migration, and never changed (% refused)', TG_OP
        USING ERRCODE = 'check_violation',
              HINT = 'another identity would stop the alert feed from finding its own incidents';
END $$;

CREATE TRIGGER installation_immutable BEFORE UPDATE OR DELETE ON core.installation
    FOR EACH ROW EXECUTE FUNCTION core.installation_immutable();
CREATE TRIGGER installation_no_truncate BEFORE TRUNCATE ON core.installation
    FOR EACH STATEMENT EXECUTE FUNCTION core.installation_immutable();

INSERT INTO core.installation DEFAULT VALUES;
"""

ADD_RESOLUTION = """
ALTER TABLE core.dead_letter_alerts ADD COLUMN resolution text;
-- Every alert resolved before this revision was resolved at Better Stack (by the feed, or a 409).
UPDATE core.dead_letter_alerts SET resolution = 'resolved' WHERE state = 'resolved';
ALTER TABLE core.dead_letter_alerts
    ADD CONSTRAINT dead_letter_alerts_resolution_valid CHECK (resolution IN ('resolved', 'gone')),
    ADD CONSTRAINT dead_letter_alerts_resolved_has_resolution CHECK ((state = 'resolved') = (resolution IS NOT NULL));
"""

ADD_CANCELLED = """
ALTER TABLE core.dead_letter_alerts
    ADD COLUMN cancelled_at  timestamptz,
    ADD COLUMN cancel_reason text,
    DROP CONSTRAINT dead_letter_alerts_state_valid,
    ADD CONSTRAINT dead_letter_alerts_state_valid CHECK (state IN ('pending', 'open', 'resolved', 'cancelled')),
    -- Confirmed by Better Stack (open, resolved) exactly when it has Better Stack's id.
    DROP CONSTRAINT dead_letter_alerts_confirmed_has_incident,
    ADD CONSTRAINT dead_letter_alerts_confirmed_has_incident CHECK ((state IN ('open', 'resolved')) = (incident_id IS NOT NULL)),
    ADD CONSTRAINT dead_letter_alerts_cancelled_has_time CHECK ((state = 'cancelled') = (cancelled_at IS NOT NULL)),
    ADD CONSTRAINT dead_letter_alerts_cancelled_has_reason CHECK ((state = 'cancelled') = (cancel_reason IS NOT NULL)),
    ADD CONSTRAINT dead_letter_alerts_cancel_reason_valid CHECK (cancel_reason IN ('handled', 'superseded'));
-- The feed's work list: intents to deliver and open incidents to resolve; cancelled ones are done too.
DROP INDEX core.dead_letter_alerts_unfinished_idx;
CREATE INDEX dead_letter_alerts_unfinished_idx ON core.dead_letter_alerts (state, id) WHERE state IN ('pending', 'open');
"""

# A cancelled intent releases the coverage it still holds; every other coverage row is a fact.
COVERAGE_GUARD = """
CREATE OR REPLACE FUNCTION core.dead_letter_alert_coverage_forbid_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND EXISTS (SELECT 1 FROM core.dead_letter_alerts WHERE id = OLD.alert_id AND state = 'cancelled') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'core.dead_letter_alert_coverage is append-only, except the release of a cancelled alert''s coverage (% refused)', TG_OP
        USING ERRCODE = 'check_violation';
END $$;
"""

# The guard of 0002_alerts with the lifecycle pending -> open -> resolved | pending -> cancelled,
# and: a finished (resolved or cancelled) alert is final.
GUARD_UPDATE = """
CREATE OR REPLACE FUNCTION core.dead_letter_alerts_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.alert_key, NEW.kind, NEW.queue, NEW.name, NEW.summary, NEW.description, NEW.num_dead_letters, NEW.created_at)
       IS DISTINCT FROM
       (OLD.alert_key, OLD.kind, OLD.queue, OLD.name, OLD.summary, OLD.description, OLD.num_dead_letters, OLD.created_at) THEN
        RAISE EXCEPTION 'alert %: what an alert covers and says cannot change, only its state', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.incident_id IS NOT NULL AND NEW.incident_id IS DISTINCT FROM OLD.incident_id THEN
        RAISE EXCEPTION 'alert %: incident_id % is confirmed by Better Stack and cannot change', OLD.id, OLD.incident_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.state IN ('resolved', 'cancelled') AND NEW IS DISTINCT FROM OLD THEN
        RAISE EXCEPTION 'alert % is % (%): a finished alert is final', OLD.id, OLD.state, coalesce(OLD.resolution, OLD.cancel_reason)
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state
       AND NOT (OLD.state, NEW.state) IN (('pending', 'open'), ('open', 'resolved'), ('pending', 'cancelled')) THEN
        RAISE EXCEPTION 'alert % cannot move from % to %: the only transitions are pending -> open -> resolved and pending -> cancelled',
              OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
"""

# The old lifecycle has no 'cancelled': cancelled intents (they paged nothing) go, with the
# coverage they still hold (only of handled dead letters, never scanned again), while the
# coverage guard above still allows it; then the state and its columns go.
DROP_CANCELLED = """
DELETE FROM core.dead_letter_alert_coverage
 WHERE alert_id IN (SELECT id FROM core.dead_letter_alerts WHERE state = 'cancelled');
DELETE FROM core.dead_letter_alerts WHERE state = 'cancelled';
DROP INDEX core.dead_letter_alerts_unfinished_idx;
CREATE INDEX dead_letter_alerts_unfinished_idx ON core.dead_letter_alerts (state, id) WHERE state <> 'resolved';
ALTER TABLE core.dead_letter_alerts
    DROP CONSTRAINT dead_letter_alerts_cancel_reason_valid,
    DROP CONSTRAINT dead_letter_alerts_cancelled_has_reason,
    DROP CONSTRAINT dead_letter_alerts_cancelled_has_time,
    DROP CONSTRAINT dead_letter_alerts_confirmed_has_incident,
    ADD CONSTRAINT dead_letter_alerts_confirmed_has_incident CHECK ((state = 'pending') = (incident_id IS NULL)),
    DROP CONSTRAINT dead_letter_alerts_state_valid,
    ADD CONSTRAINT dead_letter_alerts_state_valid CHECK (state IN ('pending', 'open', 'resolved')),
    DROP COLUMN cancel_reason,
    DROP COLUMN cancelled_at;
"""

# 0002_alerts' coverage guard: append-only without exception.
RESTORE_COVERAGE_GUARD = """
CREATE OR REPLACE FUNCTION core.dead_letter_alert_coverage_forbid_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.dead_letter_alert_coverage is append-only (% refused)', TG_OP
        USING ERRCODE = 'check_violation';
END $$;
"""

# Back to 0002_alerts' guard, then the column goes.
RESTORE_GUARD_UPDATE = """
CREATE OR REPLACE FUNCTION core.dead_letter_alerts_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.alert_key, NEW.kind, NEW.queue, NEW.name, NEW.summary, NEW.description, NEW.num_dead_letters, NEW.created_at)
       IS DISTINCT FROM
       (OLD.alert_key, OLD.kind, OLD.queue, OLD.name, OLD.summary, OLD.description, OLD.num_dead_letters, OLD.created_at) THEN
        RAISE EXCEPTION 'alert %: what an alert covers and says cannot change, only its state', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.incident_id IS NOT NULL AND NEW.incident_id IS DISTINCT FROM OLD.incident_id THEN
        RAISE EXCEPTION 'alert %: incident_id % is confirmed by Better Stack and cannot change', OLD.id, OLD.incident_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state
       AND NOT (OLD.state, NEW.state) IN (('pending', 'open'), ('open', 'resolved')) THEN
        RAISE EXCEPTION 'alert % cannot move from % to %: the only transitions are pending -> open -> resolved',
              OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
"""

DROP_RESOLUTION = """
ALTER TABLE core.dead_letter_alerts DROP COLUMN resolution;
"""

DROP_INSTALLATION = """
DROP TABLE IF EXISTS core.installation;
DROP FUNCTION IF EXISTS core.installation_immutable();
"""


def upgrade() -> None:
    op.execute(CREATE_INSTALLATION)
    op.execute(ADD_RESOLUTION)
    op.execute(ADD_CANCELLED)
    op.execute(GUARD_UPDATE)
    op.execute(COVERAGE_GUARD)


def downgrade() -> None:
    op.execute(DROP_CANCELLED)
    op.execute(RESTORE_COVERAGE_GUARD)
    op.execute(RESTORE_GUARD_UPDATE)
    op.execute(DROP_RESOLUTION)
    op.execute(DROP_INSTALLATION)
