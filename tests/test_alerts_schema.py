"""The alert state's invariants live in the database (migrations 0002_alerts and 0006_alert_identity)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from factories import add_dead_letters

from maintenance.runtime import migrate

INSERT_ALERT = """
INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, name, summary, description, num_dead_letters)
VALUES (%s, 'new', 'points.credit', 'n', 's', 'd', 1) RETURNING id
"""


@pytest.fixture
def alert_id(conn) -> int:
    return conn.execute(INSERT_ALERT, ("k-1",)).fetchone()[0]


def open_alert(conn, alert_id: int, incident_id: str = "9") -> None:
    conn.execute(
        "UPDATE core.dead_letter_alerts SET state = 'open', incident_id = %s WHERE id = %s", (incident_id, alert_id)
    )


def cancel(conn, alert_id: int, reason: str = "handled") -> None:
    conn.execute(
        "UPDATE core.dead_letter_alerts SET state = 'cancelled', cancelled_at = now(), cancel_reason = %s"
        " WHERE id = %s",
        (reason, alert_id),
    )


def test_an_alert_is_open_only_with_a_confirmed_incident_id(conn, alert_id):
    """Moving to open without Better Stack's id is refused."""
    with pytest.raises(psycopg.errors.CheckViolation, match="confirmed_has_incident"):
        conn.execute("UPDATE core.dead_letter_alerts SET state = 'open' WHERE id = %s", (alert_id,))


def test_an_intent_cannot_jump_to_resolved(conn, alert_id):
    """pending -> resolved is refused: the only transitions are pending -> open -> resolved."""
    with pytest.raises(psycopg.errors.CheckViolation, match="only transitions"):
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now(), incident_id = '9'"
            " WHERE id = %s",
            (alert_id,),
        )


def test_a_confirmed_incident_id_never_changes(conn, alert_id):
    """Once open with an incident id, another id cannot be written over it."""
    open_alert(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot change"):
        conn.execute("UPDATE core.dead_letter_alerts SET incident_id = '10' WHERE id = %s", (alert_id,))


def test_what_an_alert_says_is_immutable(conn, alert_id):
    """The name (like the key, kind, queue and text) cannot be rewritten."""
    with pytest.raises(psycopg.errors.CheckViolation, match="only its state"):
        conn.execute("UPDATE core.dead_letter_alerts SET name = 'other' WHERE id = %s", (alert_id,))


def test_a_resolved_alert_says_how_it_ended(conn, alert_id):
    """Resolved needs a resolution, 'resolved' or 'gone'; one that is neither is refused."""
    open_alert(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="resolved_has_resolution"):
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now() WHERE id = %s", (alert_id,)
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="resolution_valid"):
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now(), resolution = 'lost'"
            " WHERE id = %s",
            (alert_id,),
        )
    conn.execute(
        "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now(), resolution = 'gone' WHERE id = %s",
        (alert_id,),
    )


def test_a_resolved_alert_is_final(conn, alert_id):
    """Once resolved, not even its resolution can be rewritten."""
    open_alert(conn, alert_id)
    conn.execute(
        "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now(), resolution = 'gone' WHERE id = %s",
        (alert_id,),
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="final"):
        conn.execute("UPDATE core.dead_letter_alerts SET resolution = 'resolved' WHERE id = %s", (alert_id,))


def test_alerts_resolved_before_the_identity_migration_count_as_resolved(database_url):
    """Upgrading a database with a resolved alert gives it resolution 'resolved'; open ones get none."""
    migrate.downgrade(database_url, "0005_purge")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO core.dead_letter_alerts (alert_key, kind, queue, state, name, summary, description,
                                                               num_dead_letters, incident_id, resolved_at)
                        VALUES ('old-1', 'new', 'q', 'resolved', 'n', 's', 'd', 1, '7', now()),
                               ('old-2', 'new', 'q', 'open', 'n', 's', 'd', 1, '8', NULL)""")
        migrate.upgrade(database_url)
        rows = conn.execute("SELECT alert_key, resolution FROM core.dead_letter_alerts ORDER BY id").fetchall()
    assert rows == [("old-1", "resolved"), ("old-2", None)]


def test_an_intent_is_cancelled_with_a_time_and_a_known_reason(conn, alert_id):
    """pending -> cancelled needs cancelled_at and a cancel_reason, handled or superseded."""
    cancelled = "UPDATE core.dead_letter_alerts SET state = 'cancelled', {} WHERE id = %s"
    with pytest.raises(psycopg.errors.CheckViolation, match="cancelled_has_reason"):
        conn.execute(cancelled.format("cancelled_at = now()"), (alert_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="cancelled_has_time"):
        conn.execute(cancelled.format("cancel_reason = 'handled'"), (alert_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="cancel_reason_valid"):
        conn.execute(cancelled.format("cancelled_at = now(), cancel_reason = 'bored'"), (alert_id,))
    cancel(conn, alert_id, "superseded")
    assert conn.execute("SELECT state, cancel_reason FROM core.dead_letter_alerts").fetchone() == (
        "cancelled",
        "superseded",
    )


def test_an_open_incident_cannot_be_cancelled(conn, alert_id):
    """open -> cancelled is refused: what Better Stack has is resolved, never cancelled."""
    open_alert(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="only transitions"):
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'cancelled', cancelled_at = now(),"
            " cancel_reason = 'handled' WHERE id = %s",
            (alert_id,),
        )


def test_a_cancelled_intent_has_no_incident_and_is_final(conn, alert_id):
    """A cancelled intent carries no incident id and can never be posted afterwards (cancelled -> open)."""
    with pytest.raises(psycopg.errors.CheckViolation, match="confirmed_has_incident"):
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'cancelled', cancelled_at = now(),"
            " cancel_reason = 'handled', incident_id = '9' WHERE id = %s",
            (alert_id,),
        )
    cancel(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="final"):
        conn.execute("UPDATE core.dead_letter_alerts SET state = 'open', incident_id = '9' WHERE id = %s", (alert_id,))


def test_a_dead_letter_is_covered_once_per_kind(conn, alert_id):
    """A second 'new' coverage of one dead letter is refused by the primary key; a 'stale' one is allowed."""
    [dead_letter] = add_dead_letters(conn, "points.credit", 1)
    other = conn.execute(INSERT_ALERT, ("k-2",)).fetchone()[0]
    cover = "INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id) VALUES (%s, %s, %s)"
    conn.execute(cover, (dead_letter, "new", alert_id))
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(cover, (dead_letter, "new", other))
    conn.execute(cover, (dead_letter, "stale", other))


def test_coverage_can_be_neither_rewritten_nor_deleted(conn, alert_id):
    """Coverage is append-only: an UPDATE or DELETE (which would page for the same dead letter again) is refused."""
    [dead_letter] = add_dead_letters(conn, "points.credit", 1)
    conn.execute(
        "INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id) VALUES (%s, 'new', %s)",
        (dead_letter, alert_id),
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
        conn.execute("UPDATE core.dead_letter_alert_coverage SET kind = 'stale'")
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
        conn.execute("DELETE FROM core.dead_letter_alert_coverage")


def test_only_a_cancelled_alert_releases_its_coverage(conn, alert_id):
    """The coverage of a cancelled alert can be deleted (released), not rewritten; another alert's stays append-only."""
    [dead_letter] = add_dead_letters(conn, "points.credit", 1)
    other = conn.execute(INSERT_ALERT, ("k-2",)).fetchone()[0]
    cover = "INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id) VALUES (%s, %s, %s)"
    conn.execute(cover, (dead_letter, "new", alert_id))
    conn.execute(cover, (dead_letter, "stale", other))
    cancel(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
        conn.execute("UPDATE core.dead_letter_alert_coverage SET kind = 'stale' WHERE alert_id = %s", (alert_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
        conn.execute("DELETE FROM core.dead_letter_alert_coverage WHERE alert_id = %s", (other,))
    conn.execute("DELETE FROM core.dead_letter_alert_coverage WHERE alert_id = %s", (alert_id,))
    assert conn.execute("SELECT alert_id FROM core.dead_letter_alert_coverage").fetchall() == [(other,)]


def test_downgrade_removes_everything_the_alerts_migration_created(database_url):
    """Down to the foundation: the alert tables, their functions and the extra index are gone."""
    migrate.downgrade(database_url, "0001_foundation")
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'core' AND c.relname LIKE ANY (ARRAY['dead_letter_alert%%', 'dead_letters_pending_created_idx'])"
        ).fetchone()[0]
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'core' AND p.proname LIKE 'dead_letter_alert%%'"
        ).fetchone()[0]
    assert (left, functions) == (0, 0)


def test_the_installation_is_one_row_with_a_random_uuid(conn):
    """The migration writes exactly one identity, a UUID; a second row is refused."""
    rows = conn.execute("SELECT id FROM core.installation").fetchall()
    assert len(rows) == 1 and isinstance(rows[0][0], uuid.UUID)
    with pytest.raises(psycopg.errors.UniqueViolation, match="installation_single_row"):
        conn.execute("INSERT INTO core.installation DEFAULT VALUES")
    with pytest.raises(psycopg.errors.CheckViolation, match="installation_singleton_true"):
        conn.execute("INSERT INTO core.installation (singleton) VALUES (false)")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.installation SET id = gen_random_uuid()",
        "DELETE FROM core.installation",
        "TRUNCATE core.installation",
    ],
)
def test_the_installation_can_never_change(conn, statement):
    """UPDATE, DELETE and TRUNCATE of the identity are refused, and it keeps its id."""
    before = conn.execute("SELECT id FROM core.installation").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="written once"):
        conn.execute(statement)
    assert conn.execute("SELECT id FROM core.installation").fetchone() == before


def test_downgrade_of_the_identity_migration_restores_the_old_lifecycle(database_url):
    """Down to 0005_purge: the installation is gone, cancelled intents go with their coverage, other alerts stay
    (under the old rules again); up again works."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        [dead_letter] = add_dead_letters(conn, "points.credit", 1)
        cancelled, kept = (conn.execute(INSERT_ALERT, (key,)).fetchone()[0] for key in ("k-1", "k-2"))
        cover = "INSERT INTO core.dead_letter_alert_coverage (dead_letter_id, kind, alert_id) VALUES (%s, %s, %s)"
        conn.execute(cover, (dead_letter, "new", cancelled))
        conn.execute(cover, (dead_letter, "stale", kept))
        cancel(conn, cancelled)
        migrate.downgrade(database_url, "0005_purge")
        assert conn.execute("SELECT to_regclass('core.installation')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'installation_immutable'").fetchone()[0] == 0
        assert conn.execute("SELECT alert_key, state FROM core.dead_letter_alerts").fetchall() == [("k-2", "pending")]
        assert conn.execute("SELECT alert_id, kind FROM core.dead_letter_alert_coverage").fetchall() == [
            (kept, "stale")
        ]
        with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
            conn.execute("DELETE FROM core.dead_letter_alert_coverage")
        migrate.upgrade(database_url)
        assert conn.execute("SELECT count(*) FROM core.installation").fetchone()[0] == 1
