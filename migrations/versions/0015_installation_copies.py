"""A copy of a database notices it is a copy: the alert identity is bound to where it lives.

0006's ``core.installation`` is stored data: a database restored from a backup, or made from
another with ``CREATE DATABASE … TEMPLATE``, carried its origin's identity, and its feed posted,
adopted and resolved the origin's Better Stack incidents under the origin's keys (it resolves
an open alert by the incident id in its rows: staging restored from prod resolved prod's
incidents as staging's copies of the dead letters were handled).

* ``core.installation`` gains its **binding**: ``system_identifier`` (the cluster's, from
  ``pg_control_system()``: a new one for every ``initdb``, so for every other cluster, and for
  ``pg_upgrade``), ``database_oid`` (``pg_database.oid``: a ``TEMPLATE`` copy, and a
  ``pg_dump``/restore into a new database, get a new one) and ``database_name`` (informational:
  a rename keeps the oid, so the name is not compared), with ``bound_at``, ``bound_how``
  (``migrated`` | ``adopted`` | ``renewed``), ``bound_by`` and ``bound_reason``. This migration
  binds the row to where it is migrated.
  ``core.installation_location()`` says where the database is now, in the same three columns;
  the feed compares the two at every run (alerts/identity.py).
* The row changes only by a **rebind**, and the database checks each one: to where the
  database is now (never elsewhere), stamped now, with a non-blank ``bound_by``; ``adopted``
  keeps the id (the same installation, moved), ``renewed`` takes another one (a copy) and only
  once no alert of this database is ``pending`` or ``open`` — a new identity inherits no
  unfinished alert of its origin. DELETE and TRUNCATE are still refused.
* ``core.installation_history`` — every binding, append-only: the migration's, then each
  adopt and renew (id, previous id, binding, how, by whom, why, when).
* A renew finishes the origin's alerts in the copy: ``open`` → ``resolved`` with
  ``resolution = 'inherited'`` (the incident is the origin's; nothing is sent to Better
  Stack), ``pending`` → ``cancelled`` with ``cancel_reason = 'inherited'``.

Downgrading maps ``resolution 'inherited'`` to ``'gone'`` (not ours to resolve at Better Stack)
and ``cancel_reason 'inherited'`` to ``'handled'`` (paged nothing), drops the binding, the
history and the location function, and restores 0006's never-changed row; the id stays the one
the row has then.

Revision ID: 0015_installation_copies
Revises: 0014_api_publish_guard
Create Date: 2026-12-01
"""

from importlib import import_module

from alembic import op

revision = "0015_installation_copies"
down_revision = "0014_api_publish_guard"
branch_labels = None
depends_on = None

# Where this database lives now. pg_control_system() is executable by every role by default
# (PostgreSQL ≥ 9.6): the feed's role needs no grant.
CREATE_LOCATION = """
CREATE FUNCTION core.installation_location(
    OUT system_identifier bigint, OUT database_oid oid, OUT database_name text)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT c.system_identifier FROM pg_control_system() AS c), d.oid, d.datname::text
      FROM pg_database AS d
     WHERE d.datname = current_database()
$$;
COMMENT ON FUNCTION core.installation_location() IS
    'Where this database lives: its cluster''s system identifier, its oid and name; core.installation is bound to it (issue 17).';
"""

ADD_BINDING = """
DROP TRIGGER installation_immutable ON core.installation;
ALTER TABLE core.installation
    ADD COLUMN system_identifier bigint,
    ADD COLUMN database_oid      oid,
    ADD COLUMN database_name     text,
    ADD COLUMN bound_at          timestamptz,
    ADD COLUMN bound_how         text,
    ADD COLUMN bound_by          text,
    ADD COLUMN bound_reason      text;
UPDATE core.installation AS i
   SET (system_identifier, database_oid, database_name) = (l.system_identifier, l.database_oid, l.database_name),
       bound_at = now(), bound_how = 'migrated', bound_by = current_user,
       bound_reason = 'bound where migration 0015_installation_copies ran'
  FROM core.installation_location() AS l;
ALTER TABLE core.installation
    ALTER COLUMN system_identifier SET NOT NULL,
    ALTER COLUMN database_oid SET NOT NULL,
    ALTER COLUMN database_name SET NOT NULL,
    ALTER COLUMN bound_at SET NOT NULL,
    ALTER COLUMN bound_how SET NOT NULL,
    ALTER COLUMN bound_by SET NOT NULL,
    ADD CONSTRAINT installation_bound_how_valid CHECK (bound_how IN ('migrated', 'adopted', 'renewed')),
    ADD CONSTRAINT installation_bound_by_not_blank CHECK (btrim(bound_by) <> '');

CREATE TABLE core.installation_history (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    installation_id   uuid        NOT NULL,
    previous_id       uuid,
    system_identifier bigint      NOT NULL,
    database_oid      oid         NOT NULL,
    database_name     text        NOT NULL,
    bound_at          timestamptz NOT NULL,
    bound_how         text        NOT NULL,
    bound_by          text        NOT NULL,
    bound_reason      text
);
COMMENT ON TABLE core.installation_history IS
    'Every binding of core.installation (migrated, adopted, renewed), append-only (issue 17).';
INSERT INTO core.installation_history
       (installation_id, system_identifier, database_oid, database_name, bound_at, bound_how, bound_by, bound_reason)
SELECT id, system_identifier, database_oid, database_name, bound_at, bound_how, bound_by, bound_reason
  FROM core.installation;

CREATE FUNCTION core.installation_history_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.installation_history is append-only (% refused)', TG_OP USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER installation_history_append_only BEFORE UPDATE OR DELETE ON core.installation_history
    FOR EACH ROW EXECUTE FUNCTION core.installation_history_append_only();
CREATE TRIGGER installation_history_no_truncate BEFORE TRUNCATE ON core.installation_history
    FOR EACH STATEMENT EXECUTE FUNCTION core.installation_history_append_only();
"""

# UPDATE: only a rebind, checked here. DELETE and TRUNCATE (0006's triggers): refused.
REBIND_GUARD = """
CREATE OR REPLACE FUNCTION core.installation_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    here record;
BEGIN
    IF TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'core.installation is one row, never deleted (% refused)', TG_OP
            USING ERRCODE = 'check_violation',
                  HINT = 'a copy takes a new identity with `core-jobs alerts identity renew`';
    END IF;
    SELECT * INTO here FROM core.installation_location();
    IF NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.bound_how NOT IN ('adopted', 'renewed')
       OR NEW.bound_at IS DISTINCT FROM now()
       OR (NEW.system_identifier, NEW.database_oid, NEW.database_name)
          IS DISTINCT FROM (here.system_identifier, here.database_oid, here.database_name) THEN
        RAISE EXCEPTION 'core.installation changes only by a rebind to where this database is now (cluster %, database % oid %), stamped now(), adopted or renewed',
              here.system_identifier, here.database_name, here.database_oid
            USING ERRCODE = 'check_violation',
                  HINT = 'core-jobs alerts identity adopt | renew (docs/runbook.md)';
    END IF;
    IF (NEW.bound_how = 'adopted') <> (NEW.id = OLD.id) THEN
        RAISE EXCEPTION 'an adopt keeps the identity %, a renew takes another one', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.bound_how = 'renewed'
       AND EXISTS (SELECT 1 FROM core.dead_letter_alerts WHERE state IN ('pending', 'open')) THEN
        RAISE EXCEPTION 'a new identity inherits no unfinished alert: finish the pending and open ones first (inherited)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER installation_immutable BEFORE UPDATE OR DELETE ON core.installation
    FOR EACH ROW EXECUTE FUNCTION core.installation_immutable();

CREATE FUNCTION core.installation_record_binding() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.installation_history
           (installation_id, previous_id, system_identifier, database_oid, database_name,
            bound_at, bound_how, bound_by, bound_reason)
    VALUES (NEW.id, OLD.id, NEW.system_identifier, NEW.database_oid, NEW.database_name,
            NEW.bound_at, NEW.bound_how, NEW.bound_by, NEW.bound_reason);
    RETURN NULL;
END $$;
CREATE TRIGGER installation_record_binding AFTER UPDATE ON core.installation
    FOR EACH ROW EXECUTE FUNCTION core.installation_record_binding();
"""

# A renew finishes the origin's alerts in the copy as 'inherited'.
ALLOW_INHERITED = """
ALTER TABLE core.dead_letter_alerts
    DROP CONSTRAINT dead_letter_alerts_resolution_valid,
    ADD CONSTRAINT dead_letter_alerts_resolution_valid CHECK (resolution IN ('resolved', 'gone', 'inherited')),
    DROP CONSTRAINT dead_letter_alerts_cancel_reason_valid,
    ADD CONSTRAINT dead_letter_alerts_cancel_reason_valid CHECK (cancel_reason IN ('handled', 'superseded', 'inherited'));
"""

DROP_INHERITED = """
ALTER TABLE core.dead_letter_alerts DISABLE TRIGGER dead_letter_alerts_guard_update;
UPDATE core.dead_letter_alerts SET resolution = 'gone' WHERE resolution = 'inherited';
UPDATE core.dead_letter_alerts SET cancel_reason = 'handled' WHERE cancel_reason = 'inherited';
ALTER TABLE core.dead_letter_alerts ENABLE TRIGGER dead_letter_alerts_guard_update;
ALTER TABLE core.dead_letter_alerts
    DROP CONSTRAINT dead_letter_alerts_resolution_valid,
    ADD CONSTRAINT dead_letter_alerts_resolution_valid CHECK (resolution IN ('resolved', 'gone')),
    DROP CONSTRAINT dead_letter_alerts_cancel_reason_valid,
    ADD CONSTRAINT dead_letter_alerts_cancel_reason_valid CHECK (cancel_reason IN ('handled', 'superseded'));
"""

DROP_BINDING = """
DROP TRIGGER installation_record_binding ON core.installation;
DROP FUNCTION core.installation_record_binding();
DROP TRIGGER installation_immutable ON core.installation;
DROP TABLE core.installation_history;
DROP FUNCTION core.installation_history_append_only();
ALTER TABLE core.installation
    DROP COLUMN system_identifier,
    DROP COLUMN database_oid,
    DROP COLUMN database_name,
    DROP COLUMN bound_at,
    DROP COLUMN bound_how,
    DROP COLUMN bound_by,
    DROP COLUMN bound_reason;
DROP FUNCTION core.installation_location();
CREATE TRIGGER installation_immutable BEFORE UPDATE OR DELETE ON core.installation
    FOR EACH ROW EXECUTE FUNCTION core.installation_immutable();
"""


def immutable_of_0006() -> str:
    """0006's ``core.installation_immutable`` text, as CREATE OR REPLACE (the downgrade restores it exactly)."""
    created = import_module("migrations.versions.0006_alert_identity").CREATE_INSTALLATION
    start = created.index("CREATE FUNCTION core.installation_immutable()")
    end = created.index("END $$;", start) + len("END $$;")
    return created[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    op.execute(CREATE_LOCATION)
    op.execute(ADD_BINDING)
    op.execute(REBIND_GUARD)
    op.execute(ALLOW_INHERITED)


def downgrade() -> None:
    op.execute(DROP_INHERITED)
    op.execute(DROP_BINDING)
    op.execute(immutable_of_0006())
