"""The demo's table leaves the platform's schema: ``example.loyalty_points`` is the example's, not production's.

0003 created ``example.loyalty_points`` (the example consumer's balances, harness/examples/points.py)
in every database it migrated: production databases carried a demo table. The example now creates
it itself (``harness.examples.points.create_table``: the demo calls it, and so does the tests'
template database), and this revision removes what 0003 left:

* **dropped only when it is the demo's and holds nothing**: the table empty, then the schema
  ``example`` if nothing else is in it. A table with rows is somebody's data (an adopter who ran
  the example consumer for real, or built on it): it is **kept**, and the migration says so (a
  warning naming the row count and how to drop it by hand), so nothing is lost.
* The downgrade puts the (empty) table back where 0003 had it, if it is missing, so that 0003's
  own downgrade finds what it created.

Revision ID: 0023_demo_table_is_the_demos
Revises: 0022_dead_letter_traceback
Create Date: 2026-12-08
"""

import logging
from importlib import import_module

from alembic import op
from sqlalchemy import text

revision = "0023_demo_table_is_the_demos"
down_revision = "0022_dead_letter_traceback"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

ROWS = "SELECT count(*) FROM example.loyalty_points"
DROP_TABLE = "DROP TABLE example.loyalty_points"
# The schema goes only when nothing else lives in it (no CASCADE: an adopter's own objects stay).
DROP_SCHEMA_IF_EMPTY = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'example')
       AND NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'example')
    THEN
        DROP SCHEMA IF EXISTS example;
    END IF;
END $$;
"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.execute(text("SELECT to_regclass('example.loyalty_points')")).scalar() is None:
        return
    rows = bind.execute(text(ROWS)).scalar()
    if rows:
        log.warning(
            "example.loyalty_points kept: it holds %s row(s), so it is not the demo's empty table; it is no longer part"
            " of the core-jobs schema: drop it by hand (DROP TABLE example.loyalty_points) once it is not needed",
            rows,
        )
        return
    op.execute(DROP_TABLE)
    op.execute(DROP_SCHEMA_IF_EMPTY)


def downgrade() -> None:
    if op.get_bind().execute(text("SELECT to_regclass('example.loyalty_points')")).scalar() is not None:
        return  # kept at the upgrade
    op.execute("CREATE SCHEMA IF NOT EXISTS example")
    op.execute(import_module("migrations.versions.0003_harness").CREATE_EXAMPLE.replace("CREATE SCHEMA example;", ""))
