"""Execution alerts: the alert feed pages RECONCILIATION_REQUIRED executions too.

* ``core.dead_letter_alerts`` gains two kinds, with every rule of 0002_alerts and
  0006_alert_identity unchanged (the lifecycle ``pending -> open -> resolved | pending ->
  cancelled``, the confirmed incident id, what an alert says never changes, a finished alert is
  final): ``reconciliation`` (new RECONCILIATION_REQUIRED executions of one consumer) and
  ``reconciliation_stale`` (their escalation, when left unresolved past the feed's
  ``stale_after``). For these, ``queue`` holds the consumer and ``num_dead_letters`` the number
  of executions covered (the columns keep their names: the feed's one table of alerts).
* ``core.execution_alert_coverage`` — which executions an alert covers, once per **episode**
  and kind. An episode is one stay in RECONCILIATION_REQUIRED, named by the execution and the
  moment it entered that state (``entered_at`` = its ``status_changed_at`` then): an execution
  that is resolved, resumed and becomes uncertain again is a new episode and pages again, once.
  Kinds ``reconciliation`` (the first page; an escalation also covers, as ``reconciliation``,
  those it pages first) and ``reconciliation_stale`` (the escalation). The primary key makes
  "once per episode and kind" hold even if two runners raced. No foreign key to the execution
  on purpose: a resolved execution may later succeed and be deleted, its coverage stays the
  record of what was paged. Append-only, as the dead-letter coverage: only a *cancelled*
  alert's rows may be deleted (it paged nothing, so it releases them). The database refuses a
  coverage row whose kind does not belong to its alert's kind, in both coverage tables.

Downgrading deletes the execution alerts with their coverage (the old kinds cannot hold them);
upgrading again pages the executions still uncertain once more.

Revision ID: 0011_execution_alerts
Revises: 0010_durable_actions
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011_execution_alerts"
down_revision = "0010_durable_actions"
branch_labels = None
depends_on = None

ADD_KINDS = """
ALTER TABLE core.dead_letter_alerts
    DROP CONSTRAINT dead_letter_alerts_kind_valid,
    ADD CONSTRAINT dead_letter_alerts_kind_valid
        CHECK (kind IN ('new', 'stale', 'reconciliation', 'reconciliation_stale'));
COMMENT ON TABLE core.dead_letter_alerts IS
    'Better Stack incidents of the alert feed: dead letters (new, stale) and RECONCILIATION_REQUIRED executions '
    '(reconciliation, reconciliation_stale). pending (intent) -> open (confirmed) -> resolved | pending -> cancelled.';
"""

CREATE_COVERAGE = """
CREATE TABLE core.execution_alert_coverage (
    execution_id bigint      NOT NULL,
    -- The execution's status_changed_at when it entered RECONCILIATION_REQUIRED: the episode.
    entered_at   timestamptz NOT NULL,
    kind         text        NOT NULL,
    alert_id     bigint      NOT NULL REFERENCES core.dead_letter_alerts (id),
    CONSTRAINT execution_alert_coverage_pkey PRIMARY KEY (execution_id, entered_at, kind),
    CONSTRAINT execution_alert_coverage_kind_valid CHECK (kind IN ('reconciliation', 'reconciliation_stale'))
);
COMMENT ON TABLE core.execution_alert_coverage IS
    'Which RECONCILIATION_REQUIRED episodes (execution, entered_at) each alert covers: once per episode and kind.';

-- Auto-resolve walks an alert's executions.
CREATE INDEX execution_alert_coverage_alert_idx ON core.execution_alert_coverage (alert_id);
"""

# Append-only except a cancelled alert's release; and a coverage row's kind must fit its alert:
# a first page covers as its own kind, an escalation as its kind and as the first page.
CREATE_GUARDS = """
CREATE FUNCTION core.execution_alert_coverage_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    alert_kind text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT kind INTO alert_kind FROM core.dead_letter_alerts WHERE id = NEW.alert_id;
        IF NOT (alert_kind = NEW.kind OR (alert_kind = 'reconciliation_stale' AND NEW.kind = 'reconciliation')) THEN
            RAISE EXCEPTION 'execution % cannot be covered as % by alert % of kind %',
                NEW.execution_id, NEW.kind, NEW.alert_id, alert_kind USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE'
       AND EXISTS (SELECT 1 FROM core.dead_letter_alerts WHERE id = OLD.alert_id AND state = 'cancelled') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'core.execution_alert_coverage is append-only, except the release of a cancelled alert''s coverage (% refused)', TG_OP
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER execution_alert_coverage_guard BEFORE INSERT OR UPDATE OR DELETE ON core.execution_alert_coverage
    FOR EACH ROW EXECUTE FUNCTION core.execution_alert_coverage_guard();

CREATE FUNCTION core.dead_letter_alert_coverage_guard_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM core.dead_letter_alerts
                WHERE id = NEW.alert_id AND kind NOT IN ('new', 'stale')) THEN
        RAISE EXCEPTION 'dead letter % cannot be covered by alert %: it is an execution alert',
            NEW.dead_letter_id, NEW.alert_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER dead_letter_alert_coverage_guard_insert BEFORE INSERT ON core.dead_letter_alert_coverage
    FOR EACH ROW EXECUTE FUNCTION core.dead_letter_alert_coverage_guard_insert();
"""

# Execution alerts cannot exist under the old kinds: they go with their coverage (the guard is
# dropped with its table first), then the kinds go back to 0002_alerts'.
DROP_ALL = """
DROP TRIGGER IF EXISTS dead_letter_alert_coverage_guard_insert ON core.dead_letter_alert_coverage;
DROP FUNCTION IF EXISTS core.dead_letter_alert_coverage_guard_insert();
DROP TABLE IF EXISTS core.execution_alert_coverage;
DROP FUNCTION IF EXISTS core.execution_alert_coverage_guard();
DELETE FROM core.dead_letter_alerts WHERE kind IN ('reconciliation', 'reconciliation_stale');
ALTER TABLE core.dead_letter_alerts
    DROP CONSTRAINT dead_letter_alerts_kind_valid,
    ADD CONSTRAINT dead_letter_alerts_kind_valid CHECK (kind IN ('new', 'stale'));
COMMENT ON TABLE core.dead_letter_alerts IS
    'Better Stack incidents of the dead-letter feed (issue 4): pending (intent) -> open (confirmed) -> resolved.';
"""


def upgrade() -> None:
    op.execute(ADD_KINDS)
    op.execute(CREATE_COVERAGE)
    op.execute(CREATE_GUARDS)


def downgrade() -> None:
    op.execute(DROP_ALL)
