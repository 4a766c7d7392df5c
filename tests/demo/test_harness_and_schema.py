"""The harness in the demo, and its migration going down cleanly (issue 6, points 4, 6 and 7)."""

from __future__ import annotations

import psycopg

from maintenance.runtime import migrate


def test_demo_walks_through_the_example_consumer(demo_output):
    """The demo credits once despite a duplicate, dead-letters poison at once and an outage after 5 attempts, then replays and discards."""
    out = demo_output
    assert "num_processed=2, num_duplicates=1; balances: m-ana=50, m-ben=20" in out
    assert "m-down: attempt 4 failed, retry scheduled" in out
    assert "m-eve, 1 attempt(s), PoisonMessage: payload failed schema validation" in out
    assert "m-down, 5 attempt(s), TransientError: loyalty ledger did not answer in 10 s" in out
    assert "balances: m-ana=50, m-ben=20, m-down=15, m-flaky=10" in out
    assert "audit ledger: demo-operator discarded" in out
    assert "messages left in the queue: 0" in out


def test_downgrade_removes_the_queue_the_ledger_and_the_example_schema(empty_database_url):
    """Down to the foundation, nothing of the harness migration is left: tables, sequence, functions, trigger, schema."""
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "0001_foundation")
    with psycopg.connect(empty_database_url) as conn:
        leftovers = conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'core' AND c.relname IN ('queue_messages', 'dead_letter_actions', 'queue_lease_token_seq')
               UNION ALL SELECT proname FROM pg_proc WHERE proname IN ('dead_letters_audit_status', 'dead_letter_actions_forbid_change')
               UNION ALL SELECT tgname FROM pg_trigger WHERE tgname = 'dead_letters_audit_status'
               UNION ALL SELECT nspname FROM pg_namespace WHERE nspname = 'example'"""
        ).fetchall()
        assert leftovers == []
        assert conn.execute("SELECT to_regclass('core.dead_letters') IS NOT NULL").fetchone()[0]


def test_migrate_leaves_no_demo_table_in_the_schema(empty_database_url):
    """A migrated database has no example schema: the demo's table is the demo's (harness.examples.points)."""
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regnamespace('example')").fetchone() == (None,)


def test_the_upgrade_keeps_a_demo_table_that_holds_rows(empty_database_url, caplog):
    """Migrated before 0023 and used for real: the table stays, with a warning; an empty one goes."""
    migrate.upgrade(empty_database_url, "0022_dead_letter_traceback")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO example.loyalty_points (tenant_id, member_id, points) VALUES (gen_random_uuid(), 'm', 5)"
        )
    with caplog.at_level("WARNING", logger="alembic.runtime.migration"):
        migrate.upgrade(empty_database_url)
    assert "example.loyalty_points kept: it holds 1 row(s)" in caplog.text
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT sum(points) FROM example.loyalty_points").fetchone() == (5,)
