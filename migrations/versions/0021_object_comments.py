"""The catalog's comments say what each object is, not which ticket or seed document asked for it.

Eleven ``COMMENT ON`` texts of the shipped migrations (0001, 0003, 0006, 0009, 0010, 0012, 0015,
0016) named an issue or a seed requirement (``issue 17``, ``seed 000 J-B1``, ``R-3``): words
that mean nothing to a DBA reading ``\\d+`` and that the project's documents have since renamed.
They are rewritten here to describe the object; the old migrations stay as shipped. The
downgrade restores the old texts. tests/schema/test_object_comments.py keeps every comment of
schema ``core`` free of such references.

Revision ID: 0021_object_comments
Revises: 0020_worker_relay_roles
Create Date: 2026-12-06
"""

from alembic import op

revision = "0021_object_comments"
down_revision = "0020_worker_relay_roles"
branch_labels = None
depends_on = None

# The object, its comment from this revision on, and the comment it had before.
COMMENTS: tuple[tuple[str, str, str], ...] = (
    (
        "TABLE core.processed_jobs",
        "Idempotency fences: one row per processed (job_id, consumer), written in the transaction of the job's work;"
        " purged after expires_at.",
        "Idempotency fences (seed 000 J-B1): one row per processed (job_id, consumer); purged after expires_at.",
    ),
    (
        "TABLE core.dead_letters",
        "Failed jobs for review, one row per failure. Append-only except status: pending_review -> replayed | discarded.",
        "Failed jobs for review (seed 000 J-B4). Append-only except status: pending_review -> replayed | discarded.",
    ),
    (
        "TABLE core.dead_letter_actions",
        "Append-only audit ledger of operator actions on dead letters: replays, discards and releases, with the operator.",
        "Append-only audit ledger of dead-letter replays and discards (seed 000 J-B6, J-B8).",
    ),
    (
        "TABLE core.installation",
        "This installation's identity (one row, never changed): scopes the alert keys and Better Stack lookups.",
        "This installation's identity (one row, never changed): scopes the alert keys and Better Stack lookups"
        " (issue 9).",
    ),
    (
        "TABLE core.api_idempotency_keys",
        "Idempotency ledger of the operations API: the first response to each Idempotency-Key, replayed to a retry.",
        "Idempotency ledger of the operations API (issue 11): the first response to each key, replayed to a retry.",
    ),
    (
        "TABLE core.executions",
        "Durable-action executions not yet finished: state, fencing token, business data. Successes are deleted.",
        "Durable-action executions not yet finished (seed 002): state, fencing token, business data."
        " Successes are deleted.",
    ),
    (
        "TABLE core.execution_checkpoints",
        "Per-action checkpoints of an execution: a SUCCEEDED action is never run again.",
        "Per-action checkpoints of an execution: a SUCCEEDED one is never run again (R-3).",
    ),
    (
        "TABLE core.execution_resolutions",
        "Append-only ledger of operator resolutions (RESUME, CLOSE_WITHOUT_TRANSITION) of RECONCILIATION_REQUIRED"
        " executions.",
        "Append-only ledger of operator resolutions of RECONCILIATION_REQUIRED executions (issue 13, R-5, R-6).",
    ),
    (
        "FUNCTION core.installation_location()",
        "Where this database lives: its cluster's system identifier, its oid and name; core.installation is bound"
        " to it.",
        "Where this database lives: its cluster's system identifier, its oid and name; core.installation is bound"
        " to it (issue 17).",
    ),
    (
        "TABLE core.installation_history",
        "Every binding of core.installation (migrated, adopted, renewed), append-only.",
        "Every binding of core.installation (migrated, adopted, renewed), append-only (issue 17).",
    ),
    (
        "COLUMN core.installation.environment",
        "The deployment the identity is bound to (CORE_JOBS_ALERTS_ENVIRONMENT); NULL: none declared yet.",
        "The deployment the identity is bound to (CORE_JOBS_ALERTS_ENVIRONMENT); NULL: none declared yet (issue 17).",
    ),
)


def comment(target: str, text: str) -> str:
    return f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'"


def upgrade() -> None:
    for target, new, _old in COMMENTS:
        op.execute(comment(target, new))


def downgrade() -> None:
    for target, _new, old in COMMENTS:
        op.execute(comment(target, old))
