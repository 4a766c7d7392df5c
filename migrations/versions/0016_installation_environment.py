"""The alert identity is bound to the deployment's declared environment too.

0015 binds ``core.installation`` to the cluster's ``system_identifier`` and the database's oid.
A *physical* copy — a base backup, a disk or RDS/Cloud SQL snapshot restored elsewhere — keeps
both, so staging restored from production's snapshot still alerted as production. What differs
between them is only what each deployment says it is: ``CORE_JOBS_ALERTS_ENVIRONMENT``
(production, staging-eu…; the Helm chart sets it from its required ``environment`` value).

* ``core.installation.environment`` — the environment the identity is bound to (NULL: none
  declared yet); never blank nor padded. ``core.installation_history`` records it with each
  binding.
* ``bound_how`` gains ``declared``: the first environment given to an installation that had none
  is recorded by itself (the upgrade of an existing production must neither page again nor stop
  alerting) — the same id, the same place, from NULL only. Any other change of the environment is
  an ``adopted`` or ``renewed`` binding, which the feed's operator decides
  (``core-jobs alerts identity adopt|renew``); the rest of 0015's checks are unchanged.

Downgrading records a ``declared`` row as ``adopted`` (0015 knows no ``declared``), drops the
column (and the history's) and restores 0015's two functions.

Revision ID: 0016_installation_environment
Revises: 0015_installation_copies
Create Date: 2026-12-02
"""

from importlib import import_module

from alembic import op

revision = "0016_installation_environment"
down_revision = "0015_installation_copies"
branch_labels = None
depends_on = None

ADD_ENVIRONMENT = """
ALTER TABLE core.installation
    ADD COLUMN environment text,
    ADD CONSTRAINT installation_environment_not_blank
        CHECK (environment IS NULL OR (environment <> '' AND btrim(environment) = environment)),
    DROP CONSTRAINT installation_bound_how_valid,
    ADD CONSTRAINT installation_bound_how_valid CHECK (bound_how IN ('migrated', 'adopted', 'renewed', 'declared'));
COMMENT ON COLUMN core.installation.environment IS
    'The deployment the identity is bound to (CORE_JOBS_ALERTS_ENVIRONMENT); NULL: none declared yet (issue 17).';
ALTER TABLE core.installation_history ADD COLUMN environment text;
"""

# 0015's guard, plus the environment: a rebind (adopted, renewed) records any; a declaration
# ('declared') only the first one, keeping the id and the place.
GUARD = """
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
       OR NEW.bound_how NOT IN ('adopted', 'renewed', 'declared')
       OR NEW.bound_at IS DISTINCT FROM now()
       OR (NEW.system_identifier, NEW.database_oid, NEW.database_name)
          IS DISTINCT FROM (here.system_identifier, here.database_oid, here.database_name) THEN
        RAISE EXCEPTION 'core.installation changes only by a rebind to where this database is now (cluster %, database % oid %), stamped now(), adopted, renewed or declared',
              here.system_identifier, here.database_name, here.database_oid
            USING ERRCODE = 'check_violation',
                  HINT = 'core-jobs alerts identity adopt | renew (docs/runbook.md)';
    END IF;
    IF NEW.bound_how = 'declared'
       AND (NEW.id <> OLD.id OR OLD.environment IS NOT NULL OR NEW.environment IS NULL
            OR (OLD.system_identifier, OLD.database_oid) IS DISTINCT FROM (here.system_identifier, here.database_oid)) THEN
        RAISE EXCEPTION 'declared records the first environment of an installation bound here (it has %): another one is an adopt or a renew',
              coalesce(OLD.environment, 'none')
            USING ERRCODE = 'check_violation',
                  HINT = 'core-jobs alerts identity adopt | renew (docs/runbook.md)';
    END IF;
    IF (NEW.bound_how = 'renewed') = (NEW.id = OLD.id) THEN
        RAISE EXCEPTION 'an adopt keeps the identity %, as a declaration does; a renew takes another one', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.bound_how = 'renewed'
       AND EXISTS (SELECT 1 FROM core.dead_letter_alerts WHERE state IN ('pending', 'open')) THEN
        RAISE EXCEPTION 'a new identity inherits no unfinished alert: finish the pending and open ones first (inherited)'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION core.installation_record_binding() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.installation_history
           (installation_id, previous_id, system_identifier, database_oid, database_name,
            bound_at, bound_how, bound_by, bound_reason, environment)
    VALUES (NEW.id, OLD.id, NEW.system_identifier, NEW.database_oid, NEW.database_name,
            NEW.bound_at, NEW.bound_how, NEW.bound_by, NEW.bound_reason, NEW.environment);
    RETURN NULL;
END $$;
"""

DROP_ENVIRONMENT = """
ALTER TABLE core.installation DISABLE TRIGGER installation_immutable;
ALTER TABLE core.installation DISABLE TRIGGER installation_record_binding;
UPDATE core.installation SET bound_how = 'adopted' WHERE bound_how = 'declared';
ALTER TABLE core.installation ENABLE TRIGGER installation_immutable;
ALTER TABLE core.installation ENABLE TRIGGER installation_record_binding;
ALTER TABLE core.installation
    DROP CONSTRAINT installation_bound_how_valid,
    ADD CONSTRAINT installation_bound_how_valid CHECK (bound_how IN ('migrated', 'adopted', 'renewed')),
    DROP CONSTRAINT installation_environment_not_blank,
    DROP COLUMN environment;
ALTER TABLE core.installation_history DROP COLUMN environment;
"""


def functions_of_0015() -> str:
    """0015's two functions, as CREATE OR REPLACE (the downgrade restores them exactly)."""
    guard = import_module("migrations.versions.0015_installation_copies").REBIND_GUARD
    texts = []
    for name in ("core.installation_immutable()", "core.installation_record_binding()"):
        start = guard.index(f"FUNCTION {name}") - len("CREATE OR REPLACE ")
        start = guard.rindex("CREATE", 0, start + len("CREATE OR REPLACE "))
        end = guard.index("END $$;", start) + len("END $$;")
        texts.append(guard[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    return "\n".join(texts)


def upgrade() -> None:
    op.execute(ADD_ENVIRONMENT)
    op.execute(GUARD)


def downgrade() -> None:
    op.execute(DROP_ENVIRONMENT)
    op.execute(functions_of_0015())
