"""Operator resolution of uncertain executions (R-5, R-6).

* ``core.execution_resolutions`` — the resolution ledger, **append-only** (UPDATE, DELETE and
  TRUNCATE are refused by triggers, as for ``core.dead_letter_actions``): one row per resolution
  an operator applied to an execution in ``RECONCILIATION_REQUIRED`` — who (the verified token's
  ``sub``), the command (``RESUME`` / ``CLOSE_WITHOUT_TRANSITION``) in canonical form and its
  fingerprint, the evidence (kind, reference, reason: a statement the service audits, it does not
  verify it), the checkpoints as they were before, the new fencing token the resolution drew and
  the response sent. No foreign key to the execution: a resumed execution is deleted when it
  succeeds, its resolution stays. ``UNIQUE (execution_id, idempotency_key)``: idempotency is per
  execution and key, written in the same transaction as the resolution, so a replay of a
  completed one still finds its original response.
* ``core.executions_guard`` (0010) is replaced: ``RECONCILIATION_REQUIRED → PENDING | FAILED``
  is now allowed, **only** when a ledger row of this execution carries the execution's new
  ``fencing_token`` (the resolution inserts it first, in the same transaction). The database
  itself guarantees there is no other way out of that state: no resolution, no release.
* ``core.execution_events`` accepts ``EXECUTION_RESOLVED``; a trigger on the ledger writes it
  with every resolution (as the owner: the API role cannot insert events).
* The API role ``core_jobs_api`` gets exactly what a resolution writes: the execution's state
  columns, the checkpoints' result columns and their delete (a CLOSE removes them, snapshotted in
  the ledger), the ledger (read and append) and the fencing sequence — and
  ``core.execution_api_role_guard`` holds it to a resolution: as that role an execution changes
  only from ``RECONCILIATION_REQUIRED`` with a ledger row of the new token, a checkpoint only
  while its execution awaits that resolution, and checkpoints are deleted only of an execution a
  resolution has just closed. (A column grant cannot say "only from this state".)

Revision ID: 0012_execution_resolution
Revises: 0011_execution_alerts
Create Date: 2026-12-01
"""

from importlib import import_module

from alembic import op

from migrations import api_role

revision = "0012_execution_resolution"
down_revision = "0011_execution_alerts"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"
MAX_REFERENCE_CHARS = 200
MAX_REASON_CHARS = 2000

CREATE_LEDGER = f"""
CREATE TABLE core.execution_resolutions (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No foreign key: a resumed execution is deleted when it succeeds; its resolution stays.
    execution_id        bigint      NOT NULL,
    job_id              uuid        NOT NULL,
    consumer            text        NOT NULL,
    business_scope      text        NOT NULL,
    idempotency_key     text        NOT NULL,
    -- The verified token's sub, never a request field.
    operator            text        NOT NULL,
    command             text        NOT NULL,
    -- The command as validated, keys sorted (what a replay must match), and its sha256.
    command_body        jsonb       NOT NULL,
    command_fingerprint text        NOT NULL,
    evidence_kind       text        NOT NULL,
    evidence_reference  text        NOT NULL,
    evidence_reason     text        NOT NULL,
    -- The execution's checkpoints before the resolution (a CLOSE removes them).
    checkpoints_before  jsonb       NOT NULL,
    -- The token the resolution drew: the execution carries it after (the guard checks this row).
    fencing_token       bigint      NOT NULL,
    -- Status after the resolution: PENDING (RESUME) or FAILED (CLOSE_WITHOUT_TRANSITION).
    status_after        text        NOT NULL,
    response_status     integer     NOT NULL,
    response_body       json        NOT NULL,  -- json, not jsonb: replayed byte for byte
    resolved_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT execution_resolutions_key_per_execution UNIQUE (execution_id, idempotency_key),
    CONSTRAINT execution_resolutions_token_key UNIQUE (fencing_token),
    CONSTRAINT execution_resolutions_key_shape CHECK (idempotency_key ~ '^[\\x21-\\x7e]{{1,255}}$'),
    CONSTRAINT execution_resolutions_operator_not_blank CHECK (btrim(operator) <> ''),
    CONSTRAINT execution_resolutions_command_valid CHECK (command IN ('RESUME', 'CLOSE_WITHOUT_TRANSITION')),
    CONSTRAINT execution_resolutions_evidence_fits_command CHECK (
        (command = 'RESUME' AND evidence_kind = 'RESULT_VERIFIED' AND status_after = 'PENDING')
        OR (command = 'CLOSE_WITHOUT_TRANSITION' AND evidence_kind IN ('ABSENT_VERIFIED', 'COMPENSATED_VERIFIED')
            AND status_after = 'FAILED')),
    CONSTRAINT execution_resolutions_reference_bounded CHECK (
        btrim(evidence_reference) <> '' AND length(evidence_reference) <= {MAX_REFERENCE_CHARS}),
    CONSTRAINT execution_resolutions_reason_bounded CHECK (
        btrim(evidence_reason) <> '' AND length(evidence_reason) <= {MAX_REASON_CHARS}),
    CONSTRAINT execution_resolutions_status_valid CHECK (response_status BETWEEN 200 AND 299)
);
COMMENT ON TABLE core.execution_resolutions IS
    'Append-only ledger of operator resolutions of RECONCILIATION_REQUIRED executions (issue 13, R-5, R-6).';
CREATE INDEX execution_resolutions_resolved_idx ON core.execution_resolutions (resolved_at, id);

CREATE FUNCTION core.execution_resolutions_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.execution_resolutions is append-only: % refused', TG_OP
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER execution_resolutions_append_only BEFORE UPDATE OR DELETE ON core.execution_resolutions
    FOR EACH ROW EXECUTE FUNCTION core.execution_resolutions_append_only();
CREATE TRIGGER execution_resolutions_forbid_truncate BEFORE TRUNCATE ON core.execution_resolutions
    FOR EACH STATEMENT EXECUTE FUNCTION core.execution_resolutions_append_only();

ALTER TABLE core.execution_events DROP CONSTRAINT execution_events_kind_valid;
ALTER TABLE core.execution_events ADD CONSTRAINT execution_events_kind_valid CHECK (
    kind IN ('RETRY_SCHEDULED', 'FAILED', 'RECONCILIATION_REQUIRED', 'TAKEN_OVER', 'EXECUTION_RESOLVED'));
"""

# 0010's guard with one change: RECONCILIATION_REQUIRED may move to PENDING or FAILED when, and
# only when, a resolution of this execution with the new fencing token is in the ledger.
GUARD = """
CREATE OR REPLACE FUNCTION core.executions_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    allowed constant text[] := ARRAY[
        'PENDING>RUNNING', 'RETRY_WAIT>RUNNING', 'RUNNING>RUNNING',
        'RUNNING>RETRY_WAIT', 'RUNNING>FAILED', 'RUNNING>RECONCILIATION_REQUIRED',
        'FAILED>PENDING'];
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'PENDING' THEN
            RAISE EXCEPTION 'execution of job % for % must start PENDING, not %', NEW.job_id, NEW.consumer, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF OLD.status NOT IN ('RUNNING', 'FAILED') THEN
            RAISE EXCEPTION 'execution % is %: only a RUNNING execution (its success) or a FAILED one may be deleted',
                OLD.id, OLD.status USING ERRCODE = 'check_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF (NEW.id, NEW.job_id, NEW.consumer, NEW.queue, NEW.tenant_id, NEW.correlation_id, NEW.payload,
        NEW.business_scope, NEW.created_at)
       IS DISTINCT FROM
       (OLD.id, OLD.job_id, OLD.consumer, OLD.queue, OLD.tenant_id, OLD.correlation_id, OLD.payload,
        OLD.business_scope, OLD.created_at) THEN
        RAISE EXCEPTION 'execution %: only its state, lease, schedule and reason may change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.fencing_token < OLD.fencing_token THEN
        RAISE EXCEPTION 'execution %: the fencing token may not go back (% to %)', OLD.id, OLD.fencing_token,
            NEW.fencing_token USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status OR (OLD.status = 'RUNNING' AND NEW.fencing_token <> OLD.fencing_token) THEN
        IF OLD.status = 'RECONCILIATION_REQUIRED' THEN
            IF NEW.status NOT IN ('PENDING', 'FAILED') OR NEW.fencing_token = OLD.fencing_token
               OR NOT EXISTS (SELECT 1 FROM core.execution_resolutions AS r
                               WHERE r.execution_id = OLD.id AND r.fencing_token = NEW.fencing_token
                                 AND r.status_after = NEW.status) THEN
                RAISE EXCEPTION 'execution % is RECONCILIATION_REQUIRED: only an operator''s resolution may release it', OLD.id
                    USING ERRCODE = 'check_violation',
                          HINT = 'POST /v1/core/executions/{id}/resolve (docs/durable-actions.md, Resolution)';
            END IF;
        ELSIF NOT (OLD.status || '>' || NEW.status) = ANY (allowed) THEN
            RAISE EXCEPTION 'execution % cannot move from % to %', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.status = 'RUNNING' AND NEW.fencing_token = OLD.fencing_token THEN
            RAISE EXCEPTION 'execution %: a take must draw a new fencing token', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.status_changed_at := now();
    END IF;
    RETURN NEW;
END $$;
"""

# What the API role may write is only what a resolution writes: column grants cannot say "only
# from RECONCILIATION_REQUIRED" or "only with a recorded resolution", so this trigger does. It
# binds the role itself (current_user, which SET ROLE sets); every other writer is left to the
# guards of 0010 and to the one above.
CREATE_API_ROLE_GUARD = f"""
CREATE FUNCTION core.execution_api_role_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    execution_id bigint;
BEGIN
    IF current_user <> '{API_ROLE}' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_TABLE_NAME = 'executions' THEN
        IF OLD.status <> 'RECONCILIATION_REQUIRED' OR NOT EXISTS (
               SELECT 1 FROM core.execution_resolutions AS r
                WHERE r.execution_id = OLD.id AND r.fencing_token = NEW.fencing_token) THEN
            RAISE EXCEPTION '{API_ROLE} changes execution % only by a resolution of it (RECONCILIATION_REQUIRED)', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        -- A verified result, recorded by the resolution whose token it carries, while still uncertain.
        IF NOT EXISTS (SELECT 1 FROM core.executions AS e JOIN core.execution_resolutions AS r
                          ON r.execution_id = e.id AND r.fencing_token = NEW.fencing_token
                        WHERE e.id = OLD.execution_id AND e.status = 'RECONCILIATION_REQUIRED') THEN
            RAISE EXCEPTION '{API_ROLE} changes checkpoint % of execution % only in a resolution of it',
                OLD.action, OLD.execution_id USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- DELETE: only the checkpoints of an execution a resolution has just closed (FAILED, its token).
    IF NOT EXISTS (SELECT 1 FROM core.executions AS e JOIN core.execution_resolutions AS r
                      ON r.execution_id = e.id AND r.fencing_token = e.fencing_token AND r.status_after = 'FAILED'
                    WHERE e.id = OLD.execution_id AND e.status = 'FAILED') THEN
        RAISE EXCEPTION '{API_ROLE} deletes checkpoint % of execution % only when a resolution closes it',
            OLD.action, OLD.execution_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER execution_api_role_guard BEFORE UPDATE ON core.executions
    FOR EACH ROW EXECUTE FUNCTION core.execution_api_role_guard();
CREATE TRIGGER execution_checkpoints_api_role_guard BEFORE UPDATE OR DELETE ON core.execution_checkpoints
    FOR EACH ROW EXECUTE FUNCTION core.execution_api_role_guard();

-- The history's EXECUTION_RESOLVED, written with every ledger row by the database itself (as its
-- owner: the API role cannot insert events, so it cannot forge one).
CREATE FUNCTION core.execution_resolutions_record_event() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO core.execution_events (execution_id, kind, fencing_token, detail)
    VALUES (NEW.execution_id, 'EXECUTION_RESOLVED', NEW.fencing_token,
            NEW.command || ' ' || NEW.evidence_kind || ' by ' || NEW.operator || ': ' || NEW.evidence_reference);
    RETURN NEW;
END $$;

CREATE TRIGGER execution_resolutions_record_event AFTER INSERT ON core.execution_resolutions
    FOR EACH ROW EXECUTE FUNCTION core.execution_resolutions_record_event();
"""

GRANT_API_ROLE = f"""
-- A resolution: the execution's state columns (FOR UPDATE needs UPDATE on a column too) ...
GRANT UPDATE (status, fencing_token, run_at, reason, reason_action, takes) ON core.executions TO {API_ROLE};
-- ... the verified results of its checkpoints, and their removal by a CLOSE ...
GRANT UPDATE (status, result, last_error, fencing_token, finished_at), DELETE
    ON core.execution_checkpoints TO {API_ROLE};
-- ... the ledger (look up and append; its trigger writes the event) and the new fencing token.
GRANT SELECT, INSERT ON core.execution_resolutions TO {API_ROLE};
GRANT USAGE ON SEQUENCE core.execution_fencing_seq TO {API_ROLE};
"""

REVOKE_API_ROLE = f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{API_ROLE}') THEN
        REVOKE UPDATE ON core.executions FROM {API_ROLE};
        REVOKE UPDATE, DELETE ON core.execution_checkpoints FROM {API_ROLE};
        REVOKE USAGE ON SEQUENCE core.execution_fencing_seq FROM {API_ROLE};
    END IF;
END $$;
"""

DROP_LEDGER = """
DELETE FROM core.execution_events WHERE kind = 'EXECUTION_RESOLVED';
ALTER TABLE core.execution_events DROP CONSTRAINT execution_events_kind_valid;
ALTER TABLE core.execution_events ADD CONSTRAINT execution_events_kind_valid CHECK (
    kind IN ('RETRY_SCHEDULED', 'FAILED', 'RECONCILIATION_REQUIRED', 'TAKEN_OVER'));
DROP TRIGGER IF EXISTS execution_api_role_guard ON core.executions;
DROP TRIGGER IF EXISTS execution_checkpoints_api_role_guard ON core.execution_checkpoints;
DROP FUNCTION IF EXISTS core.execution_api_role_guard();
DROP TABLE IF EXISTS core.execution_resolutions;
DROP FUNCTION IF EXISTS core.execution_resolutions_record_event();
DROP FUNCTION IF EXISTS core.execution_resolutions_append_only();
"""


def guard_of_0010() -> str:
    """0010's ``core.executions_guard`` text, as CREATE OR REPLACE (the downgrade restores it exactly)."""
    guards = import_module("migrations.versions.0010_durable_actions").CREATE_GUARDS
    start = guards.index("CREATE FUNCTION core.executions_guard()")
    end = guards.index("END $$;", start) + len("END $$;")
    return guards[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    op.execute(CREATE_LEDGER)
    op.execute(GUARD)
    op.execute(CREATE_API_ROLE_GUARD)
    api_role.execute(GRANT_API_ROLE)


def downgrade() -> None:
    api_role.execute(REVOKE_API_ROLE)
    op.execute(guard_of_0010())
    op.execute(DROP_LEDGER)
