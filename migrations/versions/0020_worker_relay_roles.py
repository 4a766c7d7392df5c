"""The worker's and the relay's least-privilege roles: ``core_jobs_worker`` and ``core_jobs_relay``.

Until now ``core-jobs worker`` and ``core-jobs relay`` ran as whatever ``CORE_JOBS_DATABASE_URL``
names — the schema's owner, usually — so a handler's bug or an injected statement could delete
dead letters, rewrite fences or read the API's idempotency ledger. Each now has a role (NOLOGIN)
holding what its SQL (harness/) needs and nothing more; both switch to it with ``SET ROLE``
(``CORE_JOBS_WORKER_DATABASE_ROLE``, ``CORE_JOBS_RELAY_DATABASE_ROLE``), as the API does with
``core_jobs_api`` (0009), so the login a deployment gives them must be a member of it.

* **``core_jobs_worker``** — the reference queue: read, claim (attempts, lease), retry (run_at,
  last error), release and ack (DELETE) ``core.queue_messages``, and draw lease tokens; the fences
  (read, insert: ``core.processed_jobs``, never updated nor deleted: that is the purge's); dead
  letters: read, insert, and mark a replay's outcome (``replay_outcome`` only: never ``status``,
  never DELETE — the append-only triggers stand behind it anyway); durable executions: insert,
  take, settle and delete an execution (its columns of state and lease only, never its payload or
  identity), write its checkpoints (and delete the FAILED ones a retry re-runs), append its
  events, read its resolutions, draw fencing tokens. It publishes nothing (a replay is the
  operator's, a RESUME the API's) and reads no alert, installation, API or audit table. The
  example consumer's table (``example.loyalty_points``, 0003) is granted too; **every other
  consumer's work tables are the deployer's to grant** (docs/harness.md).
* **``core_jobs_relay``** — the outbox: read, claim (attempts, lease), release and ack
  ``core.queue_messages``, draw lease tokens; and for a row it cannot publish, the dead letter
  (read, insert) and the replay's outcome it ends (``replay_outcome``). Nothing else.

Roles are cluster-wide, as 0009 says of its own: created only when missing (a concurrent
migration's duplicate is ignored), a migrator without CREATEROLE fails with the DBA's statement
as a hint; the downgrade revokes what this database granted and drops a role only when no other
database still grants it anything.

Revision ID: 0020_worker_relay_roles
Revises: 0019_publish_guard_by_job
Create Date: 2026-12-06
"""

from importlib import import_module

from alembic import op

revision = "0020_worker_relay_roles"
down_revision = "0019_publish_guard_by_job"
branch_labels = None
depends_on = None

WORKER_ROLE = "core_jobs_worker"
RELAY_ROLE = "core_jobs_relay"
ROLES = (WORKER_ROLE, RELAY_ROLE)

GRANT_WORKER = f"""
GRANT USAGE ON SCHEMA core TO {WORKER_ROLE};
-- The reference queue (harness/queue/pgqueue.py): claim, retry, release, ack; it publishes nothing.
GRANT SELECT, DELETE ON core.queue_messages TO {WORKER_ROLE};
GRANT UPDATE (attempts, lease_token, lease_expires_at, leased_by, run_at, last_error, last_failed_at)
    ON core.queue_messages TO {WORKER_ROLE};
GRANT USAGE ON SEQUENCE core.queue_lease_token_seq TO {WORKER_ROLE};
-- The fences (harness/fence.py, harness/handling.py): read and written, never changed or purged.
GRANT SELECT, INSERT ON core.processed_jobs TO {WORKER_ROLE};
-- Dead letters (harness/dead_letters.py): written, read (the redelivery probe, the gauges), a replay's outcome.
GRANT SELECT, INSERT ON core.dead_letters TO {WORKER_ROLE};
GRANT UPDATE (replay_outcome) ON core.dead_letters TO {WORKER_ROLE};
-- Durable executions (harness/durable/sql.py): their state and lease, checkpoints, history.
GRANT SELECT, INSERT, DELETE ON core.executions TO {WORKER_ROLE};
GRANT UPDATE (status, fencing_token, lease_expires_at, leased_by, takes, reason, reason_action, run_at)
    ON core.executions TO {WORKER_ROLE};
GRANT SELECT, INSERT, DELETE ON core.execution_checkpoints TO {WORKER_ROLE};
GRANT UPDATE (status, attempts, result, last_error, fencing_token, started_at, finished_at)
    ON core.execution_checkpoints TO {WORKER_ROLE};
GRANT SELECT, INSERT ON core.execution_events TO {WORKER_ROLE};
GRANT SELECT ON core.execution_resolutions TO {WORKER_ROLE};
GRANT USAGE ON SEQUENCE core.execution_fencing_seq TO {WORKER_ROLE};
-- The example consumer's own table (harness/examples/points.py); any other consumer's: the deployer's.
GRANT USAGE ON SCHEMA example TO {WORKER_ROLE};
GRANT SELECT, INSERT, UPDATE ON example.loyalty_points TO {WORKER_ROLE};
"""

GRANT_RELAY = f"""
GRANT USAGE ON SCHEMA core TO {RELAY_ROLE};
-- The outbox (harness/queue/relay.py through PgQueue): claim, release, ack.
GRANT SELECT, DELETE ON core.queue_messages TO {RELAY_ROLE};
GRANT UPDATE (attempts, lease_token, lease_expires_at, leased_by) ON core.queue_messages TO {RELAY_ROLE};
GRANT USAGE ON SEQUENCE core.queue_lease_token_seq TO {RELAY_ROLE};
-- A row it cannot publish: its dead letter, and the end of the replay it carried.
GRANT SELECT, INSERT ON core.dead_letters TO {RELAY_ROLE};
GRANT UPDATE (replay_outcome) ON core.dead_letters TO {RELAY_ROLE};
"""

REVOKE = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA core FROM {role};
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA core FROM {role};
        REVOKE ALL ON SCHEMA core FROM {role};
        REVOKE ALL ON ALL TABLES IN SCHEMA example FROM {role};
        REVOKE ALL ON SCHEMA example FROM {role};
    END IF;
END $$;
"""


def create_role(role: str) -> str:
    """0009's creation of its role, for ``role``: unless it exists, a concurrent duplicate ignored, CREATEROLE's hint."""
    of_0009 = import_module("migrations.versions.0009_operations_api")
    return of_0009.CREATE_ROLE.replace(of_0009.API_ROLE, role)


def upgrade() -> None:
    for role in ROLES:
        op.execute(create_role(role))
    op.execute(GRANT_WORKER)
    op.execute(GRANT_RELAY)


def downgrade() -> None:
    drop_if_unused = import_module("migrations.versions.0009_operations_api").DROP_ROLE_IF_UNUSED
    for role in ROLES:
        op.execute(REVOKE.format(role=role))
        op.execute(drop_if_unused.format(role=role))
