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

# The guard of 0002_alerts, plus: a resolved alert is final.
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
    IF NEW.state IS DISTINCT FROM OLD.state
       AND NOT (OLD.state, NEW.state) IN (('pending', 'open'), ('open', 'resolved')) THEN
        RAISE EXCEPTION 'alert % cannot move from % to %: the only transitions are pending -> open -> resolved',
              OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.state = 'resolved' AND NEW IS DISTINCT FROM OLD THEN
        RAISE EXCEPTION 'alert % is resolved (%): a finished alert is final', OLD.id, OLD.resolution
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
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
    op.execute(GUARD_UPDATE)


def downgrade() -> None:
    op.execute(RESTORE_GUARD_UPDATE)
    op.execute(DROP_RESOLUTION)
    op.execute(DROP_INSTALLATION)
