"""A message that becomes ready now says so: ``NOTIFY core_jobs_queue_ready, '<queue>'``.

An idle worker of the reference queue polls (harness/worker.py): a job published while it waits
is picked up up to ``poll_interval`` late. With these triggers the worker listens
(harness/queue/wakeup.py) and claims as soon as the publishing transaction commits; polling stays
as the fallback. The **channel** is ``core_jobs_queue_ready``, the **payload** the queue's name
(a queue whose name is 8 000 bytes or longer — NOTIFY's limit — is not announced: its workers poll).
NOTIFY is delivered at commit, nothing if the transaction rolls back, and PostgreSQL sends one
notification per distinct (channel, payload) of a transaction however many rows it made ready.

In the database, not in the harness, so that every writer is covered: ``publish`` (INSERT),
``publish_many`` (COPY, which fires statement triggers as an INSERT does), the operations layer's
replays and RESUMEs, a retry whose delay is 0 and a release (UPDATE), and any SQL an operator runs.

One function, ``core.queue_messages_notify_ready()``, behind two triggers:

* ``queue_messages_notify_inserted`` — AFTER INSERT, once per statement, over its transition table:
  one ``pg_notify`` per distinct queue with a row due now (a bulk replay of 10 000 rows: one call).
* ``queue_messages_notify_ready`` — AFTER UPDATE, per row, only ``WHEN`` the row has just become
  ready (no lease and due, and before it was leased or not yet due): a retry with no delay, a
  release. Per row with a WHEN rather than per statement with transition tables: the hot UPDATE is
  the claim, which never makes a row ready; the WHEN is evaluated without calling any function, so
  a claim pays nothing, where a statement trigger would capture and scan every claimed row.

A message that becomes ready by time passing (a delayed publish or retry falling due, a lease
expiring) is not announced: the worker's polling finds it, as before.
"""

from alembic import op

revision = "0024_queue_ready_notify"
down_revision = "0023_demo_table_is_the_demos"
branch_labels = None
depends_on = None

CHANNEL = "core_jobs_queue_ready"  # harness/queue/wakeup.py listens on it

UPGRADE = f"""
CREATE FUNCTION core.queue_messages_notify_ready() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN  -- an INSERT or a COPY: its rows in the transition table
        PERFORM pg_notify('{CHANNEL}', q.queue)
           FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now() AND octet_length(queue) < 8000) AS q;
    ELSIF octet_length(NEW.queue) < 8000 THEN  -- an UPDATE that made this row ready (the trigger's WHEN)
        PERFORM pg_notify('{CHANNEL}', NEW.queue);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION core.queue_messages_notify_ready() IS
    'NOTIFY {CHANNEL}, <queue> for each queue a statement made a message ready now in: an INSERT or COPY, a retry '
    'with no delay, a release (0024).';

CREATE TRIGGER queue_messages_notify_inserted AFTER INSERT ON core.queue_messages
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION core.queue_messages_notify_ready();

CREATE TRIGGER queue_messages_notify_ready AFTER UPDATE ON core.queue_messages
    FOR EACH ROW
    WHEN (NEW.lease_expires_at IS NULL AND NEW.run_at <= now()
          AND (OLD.lease_expires_at IS NOT NULL OR OLD.run_at > now()))
    EXECUTE FUNCTION core.queue_messages_notify_ready();
"""

DOWNGRADE = """
DROP TRIGGER IF EXISTS queue_messages_notify_ready ON core.queue_messages;
DROP TRIGGER IF EXISTS queue_messages_notify_inserted ON core.queue_messages;
DROP FUNCTION IF EXISTS core.queue_messages_notify_ready();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
