"""Consumer harness: the reference PostgreSQL queue, the dead-letter audit ledger, the example's table.

* ``core.queue_messages`` — the reference queue (harness/queue/pgqueue.py). A message is claimed with
  ``FOR UPDATE SKIP LOCKED`` under a lease (``lease_expires_at``) stamped with a fencing token
  (``lease_token``, from a sequence, new at every claim). Ack, retry and dead-lettering match on
  the token and on an unexpired lease, so a worker whose lease expired changes nothing. An
  acked message is deleted: successes leave no row (J-AC8).
* ``core.dead_letter_actions`` — the append-only audit ledger of operator actions. A trigger on
  ``core.dead_letters`` writes one row for every status change, whoever makes it (the CLI, a
  psql session): who (``core_jobs.operator`` if the session set it, else the database user),
  when, what, and the reason. Rows can be neither updated nor deleted.
* ``example.loyalty_points`` — the balances of the example consumer (harness/examples/points.py).

Revision ID: 0003_harness
Revises: 0002_alerts
Create Date: 2026-11-30
"""

from alembic import op

revision = "0003_harness"
down_revision = "0002_alerts"
branch_labels = None
depends_on = None

CREATE_QUEUE = """
-- One row per message waiting, leased or scheduled for a retry. Acked messages are deleted.
CREATE TABLE core.queue_messages (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL,
    job_id           uuid        NOT NULL,
    tenant_id        uuid        NOT NULL,
    correlation_id   text,
    payload          jsonb       NOT NULL,
    -- Deliveries so far: a claim counts one, so a worker killed mid-job still used an attempt.
    attempts         integer     NOT NULL DEFAULT 0,
    -- When the message may be delivered (next); a retry sets now() + delay on the server's clock.
    run_at           timestamptz NOT NULL DEFAULT now(),
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    -- The lease: set by a claim, cleared by a retry. A fencing token is never reused.
    lease_token      bigint,
    lease_expires_at timestamptz,
    leased_by        text,
    -- The failed attempt a retry recorded.
    last_error       text,
    last_failed_at   timestamptz,
    CONSTRAINT queue_messages_queue_not_blank CHECK (btrim(queue) <> ''),
    CONSTRAINT queue_messages_attempts_not_negative CHECK (attempts >= 0),
    CONSTRAINT queue_messages_lease_complete CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 70);  -- room on each page, so a claim's lease update can stay HOT
COMMENT ON TABLE core.queue_messages IS
    'Reference PostgreSQL queue of the consumer harness: leased with fencing tokens; acked messages are deleted.';

-- The claim walks this index: ready messages of one queue in (run_at, id) order — the id too,
-- so that ORDER BY run_at, id LIMIT n reads n entries instead of sorting every ready message.
CREATE INDEX queue_messages_ready_idx ON core.queue_messages (queue, run_at, id);

CREATE SEQUENCE core.queue_lease_token_seq;
"""

CREATE_LEDGER = """
-- Who did what to which dead letter, when and why. Append-only.
CREATE TABLE core.dead_letter_actions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No foreign key: core.dead_letters rows are never deleted anyway, and a foreign key would
    -- change how TRUNCATE of core.dead_letters is refused (its own trigger names the rule).
    dead_letter_id bigint      NOT NULL,
    action         text        NOT NULL,
    operator       text        NOT NULL,
    reason         text,
    acted_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letter_actions_action_valid CHECK (action IN ('replayed', 'discarded')),
    CONSTRAINT dead_letter_actions_operator_not_blank CHECK (btrim(operator) <> ''),
    CONSTRAINT dead_letter_actions_discard_has_reason
        CHECK (action <> 'discarded' OR btrim(coalesce(reason, '')) <> '')
);
COMMENT ON TABLE core.dead_letter_actions IS
    'Append-only audit ledger of dead-letter replays and discards (seed 000 J-B6, J-B8).';
CREATE INDEX dead_letter_actions_dead_letter_idx ON core.dead_letter_actions (dead_letter_id);

CREATE FUNCTION core.dead_letter_actions_forbid_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.dead_letter_actions is an append-only audit ledger (% refused)', TG_OP
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER dead_letter_actions_forbid_update_delete BEFORE UPDATE OR DELETE ON core.dead_letter_actions
    FOR EACH ROW EXECUTE FUNCTION core.dead_letter_actions_forbid_change();
CREATE TRIGGER dead_letter_actions_forbid_truncate BEFORE TRUNCATE ON core.dead_letter_actions
    FOR EACH STATEMENT EXECUTE FUNCTION core.dead_letter_actions_forbid_change();

-- Every status change of a dead letter is audited, whoever makes it. The operator is the
-- session's core_jobs.operator (set by `core-jobs dead-letters`), else the database user; a
-- replay's reason is core_jobs.reason, a discard's is its discard_reason.
CREATE FUNCTION core.dead_letters_audit_status() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.dead_letter_actions (dead_letter_id, action, operator, reason)
    VALUES (NEW.id, NEW.status,
            coalesce(nullif(btrim(current_setting('core_jobs.operator', true)), ''), session_user),
            coalesce(NEW.discard_reason, nullif(btrim(current_setting('core_jobs.reason', true)), '')));
    RETURN NULL;
END $$;

CREATE TRIGGER dead_letters_audit_status AFTER UPDATE OF status ON core.dead_letters
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION core.dead_letters_audit_status();
"""

CREATE_EXAMPLE = """
-- The example consumer's own table: loyalty points per member. A double credit is visible here.
CREATE SCHEMA example;
CREATE TABLE example.loyalty_points (
    tenant_id  uuid        NOT NULL,
    member_id  text        NOT NULL,
    points     bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT loyalty_points_pkey PRIMARY KEY (tenant_id, member_id)
);
"""

DROP_ALL = """
DROP TABLE IF EXISTS example.loyalty_points;
DROP SCHEMA IF EXISTS example;
DROP TRIGGER IF EXISTS dead_letters_audit_status ON core.dead_letters;
DROP FUNCTION IF EXISTS core.dead_letters_audit_status();
DROP TABLE IF EXISTS core.dead_letter_actions;
DROP FUNCTION IF EXISTS core.dead_letter_actions_forbid_change();
DROP TABLE IF EXISTS core.queue_messages;
DROP SEQUENCE IF EXISTS core.queue_lease_token_seq;
"""


def upgrade() -> None:
    op.execute(CREATE_QUEUE)
    op.execute(CREATE_LEDGER)
    op.execute(CREATE_EXAMPLE)


def downgrade() -> None:
    op.execute(DROP_ALL)
