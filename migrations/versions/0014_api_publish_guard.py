"""The API role publishes only what a replay or a RESUME publishes, and binds whoever uses its grants.

0009 granted ``core_jobs_api`` INSERT on ``core.queue_messages`` so that a replay could publish:
with it the role could publish *any* job to any queue — one INSERT with a payload of its choosing,
and the points consumer credits it — and name any dead letter in ``replay_of``. Column grants
cannot say "only the copy of a letter marked replayed here", so a guard does, as
``core.execution_api_role_guard`` (0012) does for executions:

* ``core.queue_messages_api_role_guard`` (AFTER INSERT, once per statement, over its new rows):
  for the API role every message must be either

  - the **replay** of a dead letter marked ``replayed`` in the same transaction (its audit row
    carries this transaction's id, see below): same job id, queue, tenant (``NULL`` as the
    harness's no-tenant UUID), correlation id and payload, ``replay_of`` = that letter; or
  - the **re-queue of a RESUME** recorded in the same transaction: the execution is ``PENDING``
    with that resolution's fencing token, and the message is its job id, queue, tenant,
    correlation id and payload, ``replay_of`` = the replay it held (reconciliation.REQUEUE_JOB's
    rule) or NULL;

  and no letter is replayed by two messages at once (``core.replay_queued_twice``, as the owner:
  the role reads no queue). Anything else is refused (check_violation) naming the job and queue,
  never the payload. The role still cannot read, update, delete or truncate a message (0009's
  grants), and ``run_at`` is free (a replay's own delay). The harness now marks a letter replayed
  *before* publishing it (maintenance/operations/dead_letters.py), so the audit row exists when the guard looks.
* **Same transaction**, exactly: ``xact_id`` (``pg_current_xact_id()``, the top-level
  transaction, savepoints included) on ``core.dead_letter_actions`` — written only by the
  database's audit trigger, as its owner — and on ``core.execution_resolutions``, stamped by a
  BEFORE INSERT trigger whatever the writer gives. Rows written before this revision have NULL.
* **Who is bound**: ``core.acts_as_api_role()`` — the current role (``current_user``: what SET
  ROLE sets, and what the grants in effect belong to) holds core_jobs_api's privileges, itself or
  by inheriting them, and is not a superuser. 0012's guard asked ``current_user =
  'core_jobs_api'``: a login granted the role (``IN ROLE core_jobs_api``, which inherits) used its
  grants without SET ROLE, or after RESET ROLE, and no guard applied. Both guards now use the
  function. ``session_user`` would be wrong: a superuser login that SET ROLE core_jobs_api is the
  API role for what it does, and it is the grants in effect that a guard must bind. A superuser
  (or the owner, who holds the grants itself) is not bound: it can disable a trigger anyway.

No other role of the project writes the queue as a restricted role: the worker, the CLI and the
jobs run as the role the deployment gives them (the schema's owner, usually), which publishes,
claims and acks any message by design.

Revision ID: 0014_api_publish_guard
Revises: 0013_uncertain_checkpoints
Create Date: 2026-12-01
"""

from importlib import import_module

from alembic import op

from migrations import api_role

revision = "0014_api_publish_guard"
down_revision = "0013_uncertain_checkpoints"
branch_labels = None
depends_on = None

API_ROLE = "core_jobs_api"
NO_TENANT = "00000000-0000-0000-0000-000000000000"  # harness.queue.port.NO_TENANT: a letter without tenant

# 0012's binding, replaced in its guard by the function below.
BOUND_0012 = f"IF current_user <> '{API_ROLE}' THEN"
BOUND = "IF NOT core.acts_as_api_role() THEN"

CREATE = f"""
CREATE FUNCTION core.acts_as_api_role() RETURNS boolean
LANGUAGE sql STABLE AS $$
    -- The grants in effect are the API role's (itself, or inherited by a login granted it), and
    -- no superuser's: what the API-role guards bind.
    SELECT pg_has_role(current_user, '{API_ROLE}', 'USAGE')
       AND NOT coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), false)
$$;

-- Which transaction wrote the row: the top-level one (pg_current_xact_id() inside a savepoint too).
ALTER TABLE core.dead_letter_actions ADD COLUMN xact_id xid8;
ALTER TABLE core.dead_letter_actions ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();
COMMENT ON COLUMN core.dead_letter_actions.xact_id IS
    'Transaction of the action (0014): a replay''s message is accepted from the API role in this transaction only.';
ALTER TABLE core.execution_resolutions ADD COLUMN xact_id xid8;
COMMENT ON COLUMN core.execution_resolutions.xact_id IS
    'Transaction of the resolution, stamped by the database (0014): its RESUME re-queues the job in it only.';

CREATE FUNCTION core.execution_resolutions_stamp_xact() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.xact_id := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER execution_resolutions_stamp_xact BEFORE INSERT ON core.execution_resolutions
    FOR EACH ROW EXECUTE FUNCTION core.execution_resolutions_stamp_xact();

-- Of these letters, the first one more than one queued message replays (as the owner: the API
-- role reads no message).
CREATE FUNCTION core.replay_queued_twice(letters bigint[]) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT replay_of FROM core.queue_messages
     WHERE replay_of = ANY (letters)
     GROUP BY replay_of HAVING count(*) > 1
     ORDER BY replay_of LIMIT 1
$$;
REVOKE ALL ON FUNCTION core.replay_queued_twice(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION core.replay_queued_twice(bigint[]) TO {API_ROLE};

-- What the API role publishes is only what a replay or a RESUME of this transaction publishes.
CREATE FUNCTION core.queue_messages_api_role_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    forged record;
    twice bigint;
BEGIN
    IF NOT core.acts_as_api_role() THEN
        RETURN NULL;
    END IF;
    SELECT m.job_id, m.queue, m.replay_of INTO forged
      FROM published AS m
     WHERE NOT EXISTS (  -- the replay of a letter marked replayed in this transaction
               SELECT 1
                 FROM core.dead_letters AS d
                 JOIN core.dead_letter_actions AS a
                   ON a.dead_letter_id = d.id AND a.action = 'replayed' AND a.xact_id = pg_current_xact_id()
                WHERE d.id = m.replay_of AND d.status = 'replayed'
                  AND d.job_id = m.job_id AND d.queue = m.queue
                  AND coalesce(d.tenant_id, '{NO_TENANT}'::uuid) = m.tenant_id
                  AND d.correlation_id IS NOT DISTINCT FROM m.correlation_id AND d.payload = m.payload)
       AND NOT EXISTS (  -- the re-queue of a RESUME recorded in this transaction
               SELECT 1
                 FROM core.executions AS e
                 JOIN core.execution_resolutions AS r
                   ON r.execution_id = e.id AND r.fencing_token = e.fencing_token AND r.command = 'RESUME'
                  AND r.xact_id = pg_current_xact_id()
                WHERE e.job_id = m.job_id AND e.status = 'PENDING' AND e.queue = m.queue
                  AND e.tenant_id = m.tenant_id AND e.correlation_id IS NOT DISTINCT FROM m.correlation_id
                  AND e.payload = m.payload
                  AND m.replay_of IS NOT DISTINCT FROM (
                          SELECT max(d.id) FROM core.dead_letters AS d
                           WHERE d.job_id = e.job_id AND (d.consumer IS NULL OR d.consumer = e.consumer)
                             AND d.status = 'replayed' AND d.replay_outcome IS NULL))
     ORDER BY m.id
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '{API_ROLE} publishes only the replay of a dead letter it marks replayed, or the job a RESUME re-queues, in the same transaction: job % on queue % (replay_of %) is neither',
              forged.job_id, forged.queue, coalesce(forged.replay_of::text, 'none')
            USING ERRCODE = 'check_violation',
                  HINT = 'replay with POST /v1/core/dead-letters/{{id}}/replay; a new job is published by its producer';
    END IF;
    twice := core.replay_queued_twice(ARRAY(SELECT replay_of FROM published WHERE replay_of IS NOT NULL));
    IF twice IS NOT NULL THEN
        RAISE EXCEPTION '{API_ROLE} publishes the replay of dead letter % once: another message already replays it', twice
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER queue_messages_api_role_guard AFTER INSERT ON core.queue_messages
    REFERENCING NEW TABLE AS published
    FOR EACH STATEMENT EXECUTE FUNCTION core.queue_messages_api_role_guard();
"""

DROP = """
DROP TRIGGER IF EXISTS queue_messages_api_role_guard ON core.queue_messages;
DROP FUNCTION IF EXISTS core.queue_messages_api_role_guard();
DROP FUNCTION IF EXISTS core.replay_queued_twice(bigint[]);
DROP TRIGGER IF EXISTS execution_resolutions_stamp_xact ON core.execution_resolutions;
DROP FUNCTION IF EXISTS core.execution_resolutions_stamp_xact();
ALTER TABLE core.execution_resolutions DROP COLUMN IF EXISTS xact_id;
ALTER TABLE core.dead_letter_actions DROP COLUMN IF EXISTS xact_id;
"""


def api_role_guard_of_0012() -> str:
    """0012's ``core.execution_api_role_guard`` text, as CREATE OR REPLACE (the downgrade restores it exactly)."""
    text = import_module("migrations.versions.0012_execution_resolution").CREATE_API_ROLE_GUARD
    start = text.index("CREATE FUNCTION core.execution_api_role_guard()")
    end = text.index("END $$;", start) + len("END $$;")
    return text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def api_role_guard() -> str:
    """0012's guard binding whoever acts as the API role (:data:`BOUND`), not only the role itself."""
    of_0012 = api_role_guard_of_0012()
    assert of_0012.count(BOUND_0012) == 1, "0012's API-role guard tests the role once"
    return of_0012.replace(BOUND_0012, BOUND)


# The one statement of CREATE about the role itself: left out when the run leaves the role alone.
GRANT_EXECUTE = f"GRANT EXECUTE ON FUNCTION core.replay_queued_twice(bigint[]) TO {API_ROLE};"


def upgrade() -> None:
    op.execute(CREATE if api_role.wanted() else CREATE.replace(GRANT_EXECUTE, ""))
    op.execute(api_role_guard())


def downgrade() -> None:
    op.execute(api_role_guard_of_0012())
    op.execute(DROP)
    op.execute("DROP FUNCTION IF EXISTS core.acts_as_api_role()")
