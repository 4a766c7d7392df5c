"""Durable actions (R-1..R-4): executions, checkpoints and their history.

* ``core.executions`` — one row per job handled by a durable consumer (one that declares
  actions, harness/consumer/actions.py) while that job is not finished: ``(job_id, consumer)`` is unique.
  It keeps the job's business data (payload, tenant, correlation id, queue) and its state, which
  the database moves along these transitions only::

      PENDING ──► RUNNING ──► RETRY_WAIT ──► RUNNING …
                     │ └────► RUNNING            (a take-over after the lease expired)
                     ├──────► FAILED ──► PENDING (a replay of its dead letter starts it again)
                     ├──────► RECONCILIATION_REQUIRED
                     └──────► (deleted)          (SUCCEEDED: the final transaction deletes it)

  ``RECONCILIATION_REQUIRED`` is left only by an operator's resolution (0012_execution_resolution replaces
  ``core.executions_guard`` to allow it); no worker, no attempt limit and no migration releases
  it, and the row cannot be deleted. ``SUCCEEDED`` is never stored: the transaction that writes
  the fence deletes the execution with its checkpoints and history, so a success leaves nothing
  but its fence (J-AC8). ``FAILED`` rows stay with their dead letter (a replay resumes from their
  checkpoints: a succeeded write is never repeated, R-3) until the purge removes them.
* **Fencing.** ``fencing_token`` comes from ``core.execution_fencing_seq`` and is new at every
  take by a worker (and at every resolution): every write of a worker matches on its token and
  on an unexpired ``lease_expires_at``, so a stale worker changes nothing. The database refuses a
  token that goes backwards, and a take (PENDING / RETRY_WAIT → RUNNING) that keeps the old token;
  RUNNING → RUNNING with the same token is its holder renewing the lease.
* ``core.execution_checkpoints`` — one row per action that was started: its effect class (fixed
  once written), ``STARTED`` / ``SUCCEEDED`` / ``FAILED`` / ``UNCERTAIN``, attempts, the result
  (only and always when SUCCEEDED) and the last error. A SUCCEEDED checkpoint never changes.
  While its execution is RECONCILIATION_REQUIRED no checkpoint may be deleted.
  **Durable proof of absence**: a write action's STARTED row is committed (synchronously) before
  its request is sent; an action with no STARTED row was never sent (docs/durable-actions.md).
* ``core.execution_events`` — the execution's history: ``RETRY_SCHEDULED`` (committed with the
  failed attempt and the new ``run_at``, R-1), ``FAILED``, ``RECONCILIATION_REQUIRED``,
  ``TAKEN_OVER``. Rows never change; they go with their execution.
* The API role ``core_jobs_api`` (0009) may read all three.

Revision ID: 0010_durable_actions
Revises: 0009_operations_api
Create Date: 2026-12-01
"""

from alembic import op

from migrations import api_role

revision = "0010_durable_actions"
down_revision = "0009_operations_api"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"

CREATE_EXECUTIONS = """
CREATE SEQUENCE core.execution_fencing_seq;

CREATE TABLE core.executions (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            uuid        NOT NULL,
    consumer          text        NOT NULL,
    queue             text        NOT NULL,
    tenant_id         uuid        NOT NULL,
    correlation_id    text,
    payload           jsonb       NOT NULL,
    -- The business scope the consumer declares (R-5: who may resolve it); NULL: none declared.
    business_scope    text,
    status            text        NOT NULL DEFAULT 'PENDING',
    -- New at every take and every resolution; a worker's writes match on it.
    fencing_token     bigint      NOT NULL DEFAULT nextval('core.execution_fencing_seq'),
    -- The take's lease: set while RUNNING, NULL otherwise.
    lease_expires_at  timestamptz,
    leased_by         text,
    -- When a RETRY_WAIT execution may run again (PostgreSQL's clock, R-1).
    run_at            timestamptz NOT NULL DEFAULT now(),
    -- Takes by a worker so far: bounds a job that kills every worker taking it.
    takes             integer     NOT NULL DEFAULT 0,
    -- Why it is FAILED or RECONCILIATION_REQUIRED, and which action it concerns.
    reason            text,
    reason_action     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    status_changed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT executions_job_consumer_key UNIQUE (job_id, consumer),
    CONSTRAINT executions_consumer_not_blank CHECK (btrim(consumer) <> ''),
    CONSTRAINT executions_queue_not_blank CHECK (btrim(queue) <> ''),
    CONSTRAINT executions_business_scope_not_blank CHECK (business_scope IS NULL OR btrim(business_scope) <> ''),
    CONSTRAINT executions_status_valid CHECK (
        status IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'FAILED', 'RECONCILIATION_REQUIRED')),
    CONSTRAINT executions_lease_while_running CHECK ((status = 'RUNNING') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT executions_takes_not_negative CHECK (takes >= 0),
    CONSTRAINT executions_reason_when_settled CHECK (
        status NOT IN ('FAILED', 'RECONCILIATION_REQUIRED') OR btrim(coalesce(reason, '')) <> '')
);
COMMENT ON TABLE core.executions IS
    'Durable-action executions not yet finished (seed 002): state, fencing token, business data. Successes are deleted.';

-- Lists by state, oldest first (the alert feed, the metrics, executions list).
CREATE INDEX executions_status_idx ON core.executions (status, status_changed_at, id);

CREATE TABLE core.execution_checkpoints (
    execution_id   bigint      NOT NULL REFERENCES core.executions (id) ON DELETE CASCADE,
    action         text        NOT NULL,
    position       smallint    NOT NULL,
    effect         text        NOT NULL,
    status         text        NOT NULL,
    attempts       integer     NOT NULL DEFAULT 0,
    result         jsonb,
    last_error     text,
    fencing_token  bigint      NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    CONSTRAINT execution_checkpoints_pkey PRIMARY KEY (execution_id, action),
    CONSTRAINT execution_checkpoints_action_not_blank CHECK (btrim(action) <> ''),
    CONSTRAINT execution_checkpoints_effect_valid CHECK (
        effect IN ('READ_ONLY', 'IDEMPOTENT_WRITE', 'NON_IDEMPOTENT_WRITE')),
    CONSTRAINT execution_checkpoints_status_valid CHECK (
        status IN ('STARTED', 'SUCCEEDED', 'FAILED', 'UNCERTAIN')),
    CONSTRAINT execution_checkpoints_result_iff_succeeded CHECK ((status = 'SUCCEEDED') = (result IS NOT NULL)),
    CONSTRAINT execution_checkpoints_attempts_not_negative CHECK (attempts >= 0),
    CONSTRAINT execution_checkpoints_position_not_negative CHECK (position >= 0)
);
COMMENT ON TABLE core.execution_checkpoints IS
    'Per-action checkpoints of an execution: a SUCCEEDED one is never run again (R-3).';

CREATE TABLE core.execution_events (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id   bigint      NOT NULL REFERENCES core.executions (id) ON DELETE CASCADE,
    kind           text        NOT NULL,
    action         text,
    attempt        integer,
    fencing_token  bigint      NOT NULL,
    -- RETRY_SCHEDULED: when the retry may run.
    run_at         timestamptz,
    detail         text,
    at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT execution_events_kind_valid CHECK (
        kind IN ('RETRY_SCHEDULED', 'FAILED', 'RECONCILIATION_REQUIRED', 'TAKEN_OVER')),
    CONSTRAINT execution_events_retry_has_run_at CHECK ((kind = 'RETRY_SCHEDULED') = (run_at IS NOT NULL))
);
COMMENT ON TABLE core.execution_events IS 'History of an execution (retries scheduled, failures, uncertainty).';
CREATE INDEX execution_events_execution_idx ON core.execution_events (execution_id, id);
"""

# The state machine, the fencing rule and the immutable columns, whoever writes the row.
CREATE_GUARDS = """
CREATE FUNCTION core.executions_guard() RETURNS trigger
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
            RAISE EXCEPTION 'execution % is RECONCILIATION_REQUIRED: only an operator''s resolution may release it', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (OLD.status || '>' || NEW.status) = ANY (allowed) THEN
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

CREATE TRIGGER executions_guard BEFORE INSERT OR UPDATE OR DELETE ON core.executions
    FOR EACH ROW EXECUTE FUNCTION core.executions_guard();

CREATE FUNCTION core.executions_forbid_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% may not be truncated: an unresolved execution would be lost', TG_TABLE_NAME
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER executions_forbid_truncate BEFORE TRUNCATE ON core.executions
    FOR EACH STATEMENT EXECUTE FUNCTION core.executions_forbid_truncate();
CREATE TRIGGER execution_checkpoints_forbid_truncate BEFORE TRUNCATE ON core.execution_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION core.executions_forbid_truncate();

CREATE FUNCTION core.execution_checkpoints_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM core.executions
                    WHERE id = OLD.execution_id AND status = 'RECONCILIATION_REQUIRED') THEN
            RAISE EXCEPTION 'checkpoint % of execution % may not be deleted while it is RECONCILIATION_REQUIRED',
                OLD.action, OLD.execution_id USING ERRCODE = 'check_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF (NEW.execution_id, NEW.action, NEW.position, NEW.effect) IS DISTINCT FROM
       (OLD.execution_id, OLD.action, OLD.position, OLD.effect) THEN
        RAISE EXCEPTION 'checkpoint % of execution %: its action, position and effect never change',
            OLD.action, OLD.execution_id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'SUCCEEDED' AND (NEW.status, NEW.result) IS DISTINCT FROM (OLD.status, OLD.result) THEN
        RAISE EXCEPTION 'checkpoint % of execution % SUCCEEDED: it is never run again nor overwritten (R-3)',
            OLD.action, OLD.execution_id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.fencing_token < OLD.fencing_token THEN
        RAISE EXCEPTION 'checkpoint % of execution %: the fencing token may not go back', OLD.action, OLD.execution_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER execution_checkpoints_guard BEFORE UPDATE OR DELETE ON core.execution_checkpoints
    FOR EACH ROW EXECUTE FUNCTION core.execution_checkpoints_guard();

CREATE FUNCTION core.execution_events_forbid_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.execution_events rows never change (UPDATE refused)' USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER execution_events_forbid_update BEFORE UPDATE ON core.execution_events
    FOR EACH ROW EXECUTE FUNCTION core.execution_events_forbid_update();
"""

GRANT_API_ROLE = f"""
GRANT SELECT ON core.executions, core.execution_checkpoints, core.execution_events TO {API_ROLE};
"""

DROP_ALL = """
DROP TABLE IF EXISTS core.execution_events;
DROP TABLE IF EXISTS core.execution_checkpoints;
DROP TABLE IF EXISTS core.executions;
DROP FUNCTION IF EXISTS core.execution_events_forbid_update();
DROP FUNCTION IF EXISTS core.execution_checkpoints_guard();
DROP FUNCTION IF EXISTS core.executions_forbid_truncate();
DROP FUNCTION IF EXISTS core.executions_guard();
DROP SEQUENCE IF EXISTS core.execution_fencing_seq;
"""


def upgrade() -> None:
    op.execute(CREATE_EXECUTIONS)
    op.execute(CREATE_GUARDS)
    api_role.execute(GRANT_API_ROLE)


def downgrade() -> None:
    op.execute(DROP_ALL)
