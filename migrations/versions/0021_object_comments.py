"""The catalog's comments say what each object is, not which ticket or seed document asked for it.

Eleven ``COMMENT ON`` texts of the shipped migrations (0001, 0003, 0006, 0009, 0010, 0012, 0015,
0016) named the ticket or the seed document that asked for the object, or a requirement id:
words that tell a DBA reading ``\\d+`` nothing about the object. They are rewritten here to
describe it; the old migrations stay as shipped. The downgrade restores the old texts, read from
those migrations (not restated here). tests/schema/test_object_comments.py keeps every comment of
schema ``core`` free of such references.

Revision ID: 0021_object_comments
Revises: 0020_worker_relay_roles
Create Date: 2026-12-06
"""

import re
from pathlib import Path

from alembic import op

revision = "0021_object_comments"
down_revision = "0020_worker_relay_roles"
branch_labels = None
depends_on = None

# The object, the migration that wrote its comment before this revision, and its comment from now on.
COMMENTS: tuple[tuple[str, str, str], ...] = (
    (
        "TABLE core.processed_jobs",
        "0001_foundation",
        "Idempotency fences: one row per processed (job_id, consumer), written in the transaction of the job's work;"
        " purged after expires_at.",
    ),
    (
        "TABLE core.dead_letters",
        "0001_foundation",
        "Failed jobs for review, one row per failure. Append-only except status: pending_review -> replayed | discarded.",
    ),
    (
        "TABLE core.dead_letter_actions",
        "0003_harness",
        "Append-only audit ledger of operator actions on dead letters: replays, discards and releases, with the operator.",
    ),
    (
        "TABLE core.installation",
        "0006_alert_identity",
        "This installation's identity (one row, never changed): scopes the alert keys and Better Stack lookups.",
    ),
    (
        "TABLE core.api_idempotency_keys",
        "0009_operations_api",
        "Idempotency ledger of the operations API: the first response to each Idempotency-Key, replayed to a retry.",
    ),
    (
        "TABLE core.executions",
        "0010_durable_actions",
        "Durable-action executions not yet finished: state, fencing token, business data. Successes are deleted.",
    ),
    (
        "TABLE core.execution_checkpoints",
        "0010_durable_actions",
        "Per-action checkpoints of an execution: a SUCCEEDED action is never run again.",
    ),
    (
        "TABLE core.execution_resolutions",
        "0012_execution_resolution",
        "Append-only ledger of operator resolutions (RESUME, CLOSE_WITHOUT_TRANSITION) of RECONCILIATION_REQUIRED"
        " executions.",
    ),
    (
        "FUNCTION core.installation_location()",
        "0015_installation_copies",
        "Where this database lives: its cluster's system identifier, its oid and name; core.installation is bound"
        " to it.",
    ),
    (
        "TABLE core.installation_history",
        "0015_installation_copies",
        "Every binding of core.installation (migrated, adopted, renewed), append-only.",
    ),
    (
        "COLUMN core.installation.environment",
        "0016_installation_environment",
        "The deployment the identity is bound to (CORE_JOBS_ALERTS_ENVIRONMENT); NULL: none declared yet.",
    ),
)


def comment(target: str, text: str) -> str:
    """``COMMENT ON target IS 'text'``, the text quoted."""
    return f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'"


def comment_of(target: str, migration: str) -> str:
    """The ``COMMENT ON target IS '…'`` statement ``migration`` wrote, as written (its literal already quoted)."""
    source = (Path(__file__).parent / f"{migration}.py").read_text(encoding="utf-8")
    found = re.findall(rf"COMMENT ON {re.escape(target)} IS\s*('(?:[^']|'')*')", source)
    assert len(found) == 1, f"{migration} comments {target} once"
    return f"COMMENT ON {target} IS {found[0]}"


def upgrade() -> None:
    for target, _before, text in COMMENTS:
        op.execute(comment(target, text))


def downgrade() -> None:
    for target, before, _text in COMMENTS:
        op.execute(comment_of(target, before))
