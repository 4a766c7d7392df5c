"""Alert state of the dead-letter feed: which incidents were intended, posted and resolved.

``core.dead_letters`` stays append-only; the feed keeps its own state here.

* ``core.dead_letter_alerts`` — one row per Better Stack incident the feed intends to post,
  written *before* the POST with a deterministic ``alert_key`` that also goes into the
  incident's metadata. ``state`` is ``pending`` (intent recorded, not confirmed), ``open``
  (Better Stack answered 201 with ``data.id``, kept in ``incident_id``) or ``resolved``. The
  database allows only ``pending -> open -> resolved``, an ``incident_id`` exactly when the row
  is past ``pending``, and no change to what an alert is (key, kind, queue, text).
* ``core.dead_letter_alert_coverage`` — which dead letters an alert covers, once per dead
  letter and kind (``new``: the first incident; ``stale``: the escalation). The primary key is
  what makes "once per dead letter" hold even if two runners ever raced.

Revision ID: 0002_alerts
Revises: 0001_foundation
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002_alerts"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None

CREATE_ALERTS = """
CREATE TABLE core.dead_letter_alerts (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Deterministic (kind + the dead-letter ids covered); also the incident's metadata value,
    -- so an incident posted just before a crash can be found again instead of posted twice.
    alert_key        text        NOT NULL,
    kind             text        NOT NULL,
    queue            text,       -- NULL: the storm summary that folds many queues into one incident
    state            text        NOT NULL DEFAULT 'pending',
    name             text        NOT NULL,
    summary          text        NOT NULL,
    description      text        NOT NULL,
    num_dead_letters integer     NOT NULL,
    incident_id      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    posted_at        timestamptz,
    resolved_at      timestamptz,
    CONSTRAINT dead_letter_alerts_key_unique UNIQUE (alert_key),
    CONSTRAINT dead_letter_alerts_kind_valid CHECK (kind IN ('new', 'stale')),
    CONSTRAINT dead_letter_alerts_state_valid CHECK (state IN ('pending', 'open', 'resolved')),
    CONSTRAINT dead_letter_alerts_counts_positive CHECK (num_dead_letters > 0),
    -- Nothing is alerted unless Better Stack confirmed it: past 'pending' only with its id.
    CONSTRAINT dead_letter_alerts_confirmed_has_incident
        CHECK ((state = 'pending') = (incident_id IS NULL)),
    CONSTRAINT dead_letter_alerts_resolved_has_time CHECK ((state = 'resolved') = (resolved_at IS NOT NULL))
);
COMMENT ON TABLE core.dead_letter_alerts IS
    'Better Stack incidents of the dead-letter feed (issue 4): pending (intent) -> open (confirmed) -> resolved.';

-- The feed's work list: intents to (re)deliver and open incidents to resolve. Small by design.
CREATE INDEX dead_letter_alerts_unfinished_idx ON core.dead_letter_alerts (state, id)
    WHERE state <> 'resolved';

-- dead_letter_id has no foreign key on purpose: dead letters are never deleted (their own
-- triggers refuse it), and a reference would change how TRUNCATE of dead letters is refused.
CREATE TABLE core.dead_letter_alert_coverage (
    dead_letter_id bigint NOT NULL,
    kind           text   NOT NULL,
    alert_id       bigint NOT NULL REFERENCES core.dead_letter_alerts (id),
    CONSTRAINT dead_letter_alert_coverage_pkey PRIMARY KEY (dead_letter_id, kind),
    CONSTRAINT dead_letter_alert_coverage_kind_valid CHECK (kind IN ('new', 'stale'))
);
COMMENT ON TABLE core.dead_letter_alert_coverage IS
    'Which dead letters each alert covers: at most one alert per dead letter and kind (new | stale).';

-- Auto-resolve walks an alert's dead letters.
CREATE INDEX dead_letter_alert_coverage_alert_idx ON core.dead_letter_alert_coverage (alert_id);
-- Escalations are a small part of the coverage: with this index the stale scan's anti-join reads
-- only them, instead of the planner choosing a sequential scan of every 'new' row to find none.
CREATE INDEX dead_letter_alert_coverage_stale_idx ON core.dead_letter_alert_coverage (dead_letter_id)
    WHERE kind = 'stale';
"""

CREATE_GUARDS = """
CREATE FUNCTION core.dead_letter_alerts_guard_update() RETURNS trigger
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

CREATE TRIGGER dead_letter_alerts_guard_update BEFORE UPDATE ON core.dead_letter_alerts
    FOR EACH ROW EXECUTE FUNCTION core.dead_letter_alerts_guard_update();

-- Coverage is a fact ("this alert covered that dead letter"): never rewritten nor deleted
-- (a deleted row would make the next run page for that dead letter again).
CREATE FUNCTION core.dead_letter_alert_coverage_forbid_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core.dead_letter_alert_coverage is append-only (% refused)', TG_OP
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER dead_letter_alert_coverage_forbid_update BEFORE UPDATE OR DELETE ON core.dead_letter_alert_coverage
    FOR EACH ROW EXECUTE FUNCTION core.dead_letter_alert_coverage_forbid_update();

-- The stale scan: pending dead letters by age, whatever their queue.
CREATE INDEX dead_letters_pending_created_idx ON core.dead_letters (created_at)
    WHERE status = 'pending_review';
"""

DROP_ALL = """
DROP INDEX IF EXISTS core.dead_letters_pending_created_idx;
DROP TABLE IF EXISTS core.dead_letter_alert_coverage;
DROP TABLE IF EXISTS core.dead_letter_alerts;
DROP FUNCTION IF EXISTS core.dead_letter_alert_coverage_forbid_update();
DROP FUNCTION IF EXISTS core.dead_letter_alerts_guard_update();
"""


def upgrade() -> None:
    op.execute(CREATE_ALERTS)
    op.execute(CREATE_GUARDS)


def downgrade() -> None:
    op.execute(DROP_ALL)
