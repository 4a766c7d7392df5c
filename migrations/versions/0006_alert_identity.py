"""Alert identity: every installation's own id, which scopes the alert feed's keys and lookups.

* ``core.installation`` — exactly one row, written here: a random ``id`` (UUID) made once per
  database. The feed puts it into every alert key and into each incident's metadata
  (``core_jobs_installation``), and a lookup adopts an incident only when both match, so two
  databases sharing one Better Stack team (staging and prod) never take each other's incidents
  even with the same dead-letter ids. The database refuses a second row, any UPDATE, DELETE or
  TRUNCATE. Downgrading this revision drops it; upgrading again makes a new identity, so the
  incidents of the database's earlier life are never adopted (nor are those of a
  ``downgrade base`` + ``migrate``, whose ids restart at 1).

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

DROP_INSTALLATION = """
DROP TABLE IF EXISTS core.installation;
DROP FUNCTION IF EXISTS core.installation_immutable();
"""


def upgrade() -> None:
    op.execute(CREATE_INSTALLATION)


def downgrade() -> None:
    op.execute(DROP_INSTALLATION)
