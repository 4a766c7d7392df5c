"""Operations API (J-API1..3): list indexes, the idempotency ledger, the least-privilege role.

* **The append-only guard, cheaper**: ``core.dead_letters_guard_update`` (0007's rules,
  unchanged) compares the row without its mutable columns once instead of column by column, so
  a bulk replay's 10 000 status changes are not spent in the trigger.
* **Indexes for keyset pages** of ``GET /v1/core/dead-letters`` (newest first, by
  ``(created_at, id)``): one per filter a page is usually asked by — status alone, queue,
  consumer, tenant — each ending in ``created_at, id`` so that a page is an index range read
  backwards, however deep, with no sort; for pending dead letters (the default list) partial
  ones, alone and by queue, which replace their prefixes from 0001 and 0002 (the alert feed and
  the purge use them the same way); plus ``correlation_id`` (few rows each; ``job_id`` already
  has one).
  On a large live table build them first with ``CREATE INDEX CONCURRENTLY`` (same definitions);
  ``IF NOT EXISTS`` then skips them here.
* ``core.api_idempotency_keys`` — the idempotency ledger: one row per ``Idempotency-Key`` with
  the operator (the token's ``sub``), a fingerprint of the request (method, route, canonical
  body) and the response sent (status and body), written in the same transaction as the
  action. A recorded response never changes (UPDATE is refused); rows may be deleted by the
  owner for retention, never by the API role.
* **The role ``core_jobs_api``** (NOLOGIN) — what the API needs and nothing more: read dead
  letters and their audit history, change only ``status`` and ``discard_reason`` (the
  database's lifecycle triggers still decide which changes are valid), publish a replay to
  ``core.queue_messages`` (insert only, nothing read back), read and append to the idempotency ledger. It cannot
  delete a dead letter, change a payload, or touch ``core.processed_jobs``. The audit trigger
  runs as its owner (SECURITY DEFINER, fixed search_path) so that the role needs no write
  access to the audit ledger and cannot forge a row of it. Grant it to a login:
  ``CREATE ROLE core_jobs_api_login LOGIN PASSWORD '…' IN ROLE core_jobs_api;`` (docs/api.md).

Roles are cluster-wide, databases are not. Every database of a cluster migrated to this
revision shares the one role (its name is fixed, so the docs and grants can name it): the
upgrade creates it only when it does not exist yet (two databases migrating at once: the
second one's CREATE fails as a duplicate and is ignored), and the downgrade revokes what this
database granted it and drops the role only when no other database still grants it anything
(else it keeps it, with a NOTICE). A migrator without CREATEROLE fails with a hint: have a
DBA run ``CREATE ROLE core_jobs_api NOLOGIN`` once per cluster, then migrate again.

Revision ID: 0009_operations_api
Revises: 0008_fence_rule
Create Date: 2026-12-01
"""

from importlib import import_module

from alembic import op

from migrations import api_role

revision = "0009_operations_api"
down_revision = "0008_fence_rule"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"

# 0007's guard with the same rules, made cheap: a bulk replay of 10 000 dead letters spent most
# of its time in it (1.5 of 2.5 s). Downgrade restores 0007's text.
GUARD_UPDATE = """
CREATE OR REPLACE FUNCTION core.dead_letters_guard_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed text;
    mutable constant text[] := ARRAY['status', 'discard_reason', 'status_changed_at', 'replay_outcome',
                                     'replay_handled_at'];
BEGIN
    -- Every column but the review state and the replay's outcome is immutable; checked
    -- generically so that a column added later is protected too. One comparison of the two rows
    -- without those columns decides; the column-by-column search runs only to name a violation
    -- (it cost ~15 jsonb lookups per row, most of a bulk replay's time).
    IF (to_jsonb(OLD) - mutable) IS DISTINCT FROM (to_jsonb(NEW) - mutable) THEN
        SELECT o.key INTO changed
          FROM jsonb_each(to_jsonb(OLD)) AS o
         WHERE o.key <> ALL (mutable)
           AND o.value IS DISTINCT FROM (to_jsonb(NEW) -> o.key)
         ORDER BY o.key
         LIMIT 1;
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

CREATE_LIST_INDEXES = """
-- Keyset pages, newest first: WHERE <filter> AND (created_at, id) < (cursor) ORDER BY created_at DESC, id DESC.
-- Pending ones (the default list): partial indexes that replace 0001's (queue, created_at) and
-- 0002's (created_at), their prefixes, which serve the alert feed and the purge as before. With
-- those the planner read pending pages in created_at order and sorted by id: every row of a
-- created_at shared by thousands (one transaction dead-lettering a batch) read for each page.
CREATE INDEX IF NOT EXISTS dead_letters_pending_page_idx ON core.dead_letters (created_at, id)
    WHERE status = 'pending_review';
CREATE INDEX IF NOT EXISTS dead_letters_pending_queue_page_idx ON core.dead_letters (queue, created_at, id)
    WHERE status = 'pending_review';
DROP INDEX IF EXISTS core.dead_letters_pending_created_idx;
DROP INDEX IF EXISTS core.dead_letters_pending_queue_idx;
CREATE INDEX IF NOT EXISTS dead_letters_status_created_idx ON core.dead_letters (status, created_at, id);
CREATE INDEX IF NOT EXISTS dead_letters_queue_status_created_idx ON core.dead_letters (queue, status, created_at, id);
CREATE INDEX IF NOT EXISTS dead_letters_consumer_status_created_idx ON core.dead_letters (consumer, status, created_at, id);
CREATE INDEX IF NOT EXISTS dead_letters_tenant_status_created_idx ON core.dead_letters (tenant_id, status, created_at, id);
CREATE INDEX IF NOT EXISTS dead_letters_correlation_idx ON core.dead_letters (correlation_id);
"""

DROP_LIST_INDEXES = """
CREATE INDEX IF NOT EXISTS dead_letters_pending_queue_idx ON core.dead_letters (queue, created_at)
    WHERE status = 'pending_review';
CREATE INDEX IF NOT EXISTS dead_letters_pending_created_idx ON core.dead_letters (created_at)
    WHERE status = 'pending_review';
DROP INDEX IF EXISTS core.dead_letters_pending_page_idx;
DROP INDEX IF EXISTS core.dead_letters_pending_queue_page_idx;
DROP INDEX IF EXISTS core.dead_letters_status_created_idx;
DROP INDEX IF EXISTS core.dead_letters_queue_status_created_idx;
DROP INDEX IF EXISTS core.dead_letters_consumer_status_created_idx;
DROP INDEX IF EXISTS core.dead_letters_tenant_status_created_idx;
DROP INDEX IF EXISTS core.dead_letters_correlation_idx;
"""

CREATE_IDEMPOTENCY_LEDGER = """
-- One row per Idempotency-Key: who sent it, for which request, and the response it got.
CREATE TABLE core.api_idempotency_keys (
    idempotency_key     text        PRIMARY KEY,
    operator            text        NOT NULL,
    method              text        NOT NULL,
    route               text        NOT NULL,
    -- sha256 of the canonical request (method, route with its parameters, body with sorted keys).
    request_fingerprint text        NOT NULL,
    response_status     integer     NOT NULL,
    response_body       json        NOT NULL,  -- json, not jsonb: the body replayed byte for byte
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT api_idempotency_keys_key_shape CHECK (idempotency_key ~ '^[\\x21-\\x7e]{1,255}$'),
    CONSTRAINT api_idempotency_keys_operator_not_blank CHECK (btrim(operator) <> ''),
    CONSTRAINT api_idempotency_keys_status_valid CHECK (response_status BETWEEN 200 AND 599)
);
COMMENT ON TABLE core.api_idempotency_keys IS
    'Idempotency ledger of the operations API (issue 11): the first response to each key, replayed to a retry.';
CREATE INDEX api_idempotency_keys_created_idx ON core.api_idempotency_keys (created_at);

CREATE FUNCTION core.api_idempotency_keys_forbid_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.api_idempotency_keys: the response recorded for key % never changes', OLD.idempotency_key
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER api_idempotency_keys_forbid_update BEFORE UPDATE ON core.api_idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION core.api_idempotency_keys_forbid_update();
"""

DROP_IDEMPOTENCY_LEDGER = """
DROP TABLE IF EXISTS core.api_idempotency_keys;
DROP FUNCTION IF EXISTS core.api_idempotency_keys_forbid_update();
"""

# The role, unless another database of the cluster (or a DBA) created it already.
CREATE_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{API_ROLE}') THEN
        BEGIN
            CREATE ROLE {API_ROLE} NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a migration of another database
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'cannot create role {API_ROLE}: the migrating user lacks CREATEROLE'
                    USING HINT = 'have a DBA run: CREATE ROLE {API_ROLE} NOLOGIN; then migrate again';
        END;
    END IF;
END $$;
"""

GRANT_API_ROLE = f"""
GRANT USAGE ON SCHEMA core TO {API_ROLE};
-- Read dead letters and their audit history.
GRANT SELECT ON core.dead_letters, core.dead_letter_actions TO {API_ROLE};
-- Only the review state may change (the lifecycle triggers decide which changes are valid).
GRANT UPDATE (status, discard_reason) ON core.dead_letters TO {API_ROLE};
-- A replay publishes the job again (harness.queue.pgqueue.PUBLISH_MANY): insert only, nothing read back.
GRANT INSERT (queue, job_id, tenant_id, correlation_id, payload, replay_of, run_at) ON core.queue_messages TO {API_ROLE};
-- The idempotency ledger: look up and append.
GRANT SELECT, INSERT ON core.api_idempotency_keys TO {API_ROLE};
-- The audit trigger writes the ledger as its owner, so the role needs no INSERT on it.
ALTER FUNCTION core.dead_letters_audit_status() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
"""

REVOKE_API_ROLE = f"""
ALTER FUNCTION core.dead_letters_audit_status() SECURITY INVOKER RESET search_path;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{API_ROLE}') THEN
        REVOKE ALL ON core.dead_letters, core.dead_letter_actions, core.queue_messages FROM {API_ROLE};
        REVOKE ALL ON SCHEMA core FROM {API_ROLE};
    END IF;
END $$;
"""

# Drop the role only when no other database of the cluster still grants it anything. Two databases
# downgrading at once may deadlock on the role (each holds a share lock on it from its REVOKE and
# wants the exclusive one): the victim keeps it, and the other drops it once the victim commits. A database dropped
# while DROP ROLE reads the cluster's dependencies makes it fail internally: the role is kept then too.
DROP_ROLE_IF_UNUSED = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        BEGIN
            DROP ROLE {role};
        EXCEPTION
            WHEN dependent_objects_still_exist THEN
                RAISE NOTICE 'role {role} kept: another database of this cluster still grants it privileges';
            WHEN deadlock_detected THEN
                -- Another database's downgrade revoked its grants and drops the role at the same moment
                -- (each holds a share lock on the role from its REVOKE): it drops it once this one ends.
                RAISE NOTICE 'role {role} kept: another database of this cluster is dropping it at the same time';
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'role {role} kept: the migrating user may not drop roles';
            WHEN internal_error THEN
                -- DROP ROLE reads every database's dependencies on the role: one dropped meanwhile is a
                -- "cache lookup failed for database" (XX000). Kept, as if that database still granted it.
                RAISE NOTICE 'role {role} kept: another database of this cluster was dropped while its grants were read';
        END;
    END IF;
END $$;
"""


def upgrade() -> None:
    op.execute(GUARD_UPDATE)
    op.execute(CREATE_LIST_INDEXES)
    op.execute(CREATE_IDEMPOTENCY_LEDGER)
    api_role.execute(CREATE_ROLE)  # both skipped with CORE_JOBS_MIGRATE_API_ROLE=false (migrations/api_role.py)
    api_role.execute(GRANT_API_ROLE)


def downgrade() -> None:
    api_role.execute(REVOKE_API_ROLE)
    op.execute(DROP_IDEMPOTENCY_LEDGER)
    op.execute(DROP_LIST_INDEXES)
    api_role.execute(DROP_ROLE_IF_UNUSED.format(role=API_ROLE))
    op.execute(import_module("migrations.versions.0007_replay_outstanding").GUARD_UPDATE)
