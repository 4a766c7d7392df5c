"""An UNCERTAIN checkpoint leaves that state only by an operator's resolution, and only to SUCCEEDED (R-4, R-5).

0010's ``core.execution_checkpoints_guard`` froze a SUCCEEDED checkpoint but let an ``UNCERTAIN``
one become anything. A write that may or may not have happened must never become one the worker
runs again (``FAILED``, ``STARTED``): that would re-send a NON_IDEMPOTENT_WRITE automatically.
0012's API-role guard only asked for a ledger row of the new token, so the API role — or any
writer — could do exactly that inside a "resolution" that records no verified result (insert a
ledger row, set the checkpoint ``FAILED``, the execution ``PENDING``). The guard is replaced
(0010's with one rule more): an ``UNCERTAIN`` checkpoint may stay ``UNCERTAIN`` (a worker's
reconciliation again), or become ``SUCCEEDED`` — a verified result — only while its execution is
``RECONCILIATION_REQUIRED`` and a ledger row of that execution carries the checkpoint's new
fencing token. Deleting it is still what a CLOSE does (after its execution is ``FAILED``).

Revision ID: 0013_uncertain_checkpoints
Revises: 0012_execution_resolution
Create Date: 2026-12-01
"""

from importlib import import_module

from alembic import op

revision = "0013_uncertain_checkpoints"
down_revision = "0012_execution_resolution"
branch_labels = None
depends_on = None

# The one rule more, placed before 0010's fencing-token check.
UNCERTAIN_RULE = """    IF OLD.status = 'UNCERTAIN' AND NEW.status <> 'UNCERTAIN' AND (
           NEW.status <> 'SUCCEEDED'
           OR NOT EXISTS (SELECT 1 FROM core.executions AS e JOIN core.execution_resolutions AS r
                             ON r.execution_id = e.id AND r.fencing_token = NEW.fencing_token
                          WHERE e.id = OLD.execution_id AND e.status = 'RECONCILIATION_REQUIRED')) THEN
        RAISE EXCEPTION 'checkpoint % of execution % is UNCERTAIN: only an operator''s resolution records its verified result (SUCCEEDED); it is never run again',
            OLD.action, OLD.execution_id USING ERRCODE = 'check_violation',
                  HINT = 'POST /v1/core/executions/{id}/resolve (docs/durable-actions.md, Resolution)';
    END IF;
"""
FENCING_TOKEN_CHECK = "    IF NEW.fencing_token < OLD.fencing_token THEN\n        RAISE EXCEPTION 'checkpoint"


def guard_of_0010() -> str:
    """0010's ``core.execution_checkpoints_guard`` text, as CREATE OR REPLACE (the downgrade restores it exactly)."""
    guards = import_module("migrations.versions.0010_durable_actions").CREATE_GUARDS
    start = guards.index("CREATE FUNCTION core.execution_checkpoints_guard()")
    end = guards.index("END $$;", start) + len("END $$;")
    return guards[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def guard() -> str:
    """0010's guard with :data:`UNCERTAIN_RULE` inserted before its fencing-token check."""
    of_0010 = guard_of_0010()
    assert of_0010.count(FENCING_TOKEN_CHECK) == 1, "0010's checkpoint guard has one fencing-token check"
    return of_0010.replace(FENCING_TOKEN_CHECK, UNCERTAIN_RULE + FENCING_TOKEN_CHECK)


def upgrade() -> None:
    op.execute(guard())


def downgrade() -> None:
    op.execute(guard_of_0010())
