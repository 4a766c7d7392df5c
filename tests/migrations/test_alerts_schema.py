"""The alert state's invariants live in the database (migrations 0002_alerts, 0006_alert_identity and 0015_installation_copies)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from support.factories import add_dead_letters

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


# A complete row of core.installation, bound where the database is: only the single-row rules refuse it.
SECOND_INSTALLATION = """
INSERT INTO core.installation (singleton, system_identifier, database_oid, database_name, bound_at, bound_how, bound_by)
SELECT %s, l.system_identifier, l.database_oid, l.database_name, now(), 'migrated', 'test'
  FROM core.installation_location() AS l
"""

# A rebind as the CLI does it (alerts.sql.REBIND_INSTALLATION), with each part overridable.
REBIND = """
UPDATE core.installation AS i
   SET id = {id}, system_identifier = {sysid}, database_oid = l.database_oid, database_name = l.database_name,
       bound_at = now(), bound_how = %s, bound_by = 'ops'
  FROM core.installation_location() AS l
"""


def test_the_installation_is_one_row_with_a_random_uuid(conn):
    """The migration writes exactly one identity, a UUID; a second row is refused."""
    rows = conn.execute("SELECT id FROM core.installation").fetchall()
    assert len(rows) == 1 and isinstance(rows[0][0], uuid.UUID)
    with pytest.raises(psycopg.errors.UniqueViolation, match="installation_single_row"):
        conn.execute(SECOND_INSTALLATION, (True,))
    with pytest.raises(psycopg.errors.CheckViolation, match="installation_singleton_true"):
        conn.execute(SECOND_INSTALLATION, (False,))


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.installation SET id = gen_random_uuid()",
        "DELETE FROM core.installation",
        "TRUNCATE core.installation",
    ],
)
def test_the_installation_changes_only_by_a_rebind(conn, statement):
    """A bare UPDATE, a DELETE and a TRUNCATE of the identity are refused, and it keeps its id."""
    before = conn.execute("SELECT id FROM core.installation").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match=r"changes only by a rebind|one row, never deleted"):
        conn.execute(statement)
    assert conn.execute("SELECT id FROM core.installation").fetchone() == before


def test_the_installation_is_bound_only_to_where_the_database_is(conn):
    """A rebind to another cluster's system identifier is refused."""
    with pytest.raises(psycopg.errors.CheckViolation, match="to where this database is now"):
        conn.execute(REBIND.format(id="i.id", sysid="l.system_identifier + 1"), ("adopted",))


@pytest.mark.parametrize(("new_id", "how"), [("gen_random_uuid()", "adopted"), ("i.id", "renewed")])
def test_an_adopt_keeps_the_identity_and_a_renew_takes_another(conn, new_id, how):
    """An adopt that changes the id, and a renew that keeps it, are refused."""
    with pytest.raises(psycopg.errors.CheckViolation, match="an adopt keeps the identity"):
        conn.execute(REBIND.format(id=new_id, sysid="l.system_identifier"), (how,))


@pytest.mark.parametrize("state", ["pending", "open"])
def test_a_new_identity_inherits_no_unfinished_alert(conn, alert_id, state):
    """A renew while an alert is pending or open is refused: the origin's alerts are finished first."""
    if state == "open":
        open_alert(conn, alert_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="inherits no unfinished alert"):
        conn.execute(REBIND.format(id="gen_random_uuid()", sysid="l.system_identifier"), ("renewed",))


def test_every_binding_is_in_the_append_only_history(conn):
    """The migration's binding and each rebind are history rows (with the id before); the history refuses changes."""
    before = conn.execute("SELECT id FROM core.installation").fetchone()[0]
    conn.execute(REBIND.format(id="gen_random_uuid()", sysid="l.system_identifier"), ("renewed",))
    after = conn.execute("SELECT id FROM core.installation").fetchone()[0]
    rows = conn.execute(
        "SELECT installation_id, previous_id, bound_how, bound_by FROM core.installation_history ORDER BY id"
    ).fetchall()
    assert [row[2] for row in rows] == ["migrated", "renewed"]
    assert rows[1][:2] == (after, before) and rows[1][3] == "ops" and rows[0][0] == before
    for statement in ("UPDATE core.installation_history SET bound_by = 'x'", "DELETE FROM core.installation_history"):
        with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
            conn.execute(statement)


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


def test_downgrade_of_the_copies_migration_keeps_inherited_alerts_final(database_url):
    """Down to 0013: an inherited resolved alert becomes 'gone', an inherited cancelled one 'handled', the binding and
    its history go, the identity is kept and never changes again; up again binds it where it is."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        resolved, cancelled = (conn.execute(INSERT_ALERT, (key,)).fetchone()[0] for key in ("k-1", "k-2"))
        open_alert(conn, resolved)
        conn.execute(
            "UPDATE core.dead_letter_alerts SET state = 'resolved', resolved_at = now(), resolution = 'inherited'"
            " WHERE id = %s",
            (resolved,),
        )
        cancel(conn, cancelled, "inherited")
        identity = conn.execute("SELECT id FROM core.installation").fetchone()
        migrate.downgrade(database_url, "0013_uncertain_checkpoints")
        assert conn.execute("SELECT resolution, cancel_reason FROM core.dead_letter_alerts ORDER BY id").fetchall() == [
            ("gone", None),
            (None, "handled"),
        ]
        assert conn.execute("SELECT to_regclass('core.installation_history')").fetchone()[0] is None
        assert conn.execute("SELECT * FROM core.installation").fetchone()[0] == identity[0]
        with pytest.raises(psycopg.errors.CheckViolation, match="written once"):
            conn.execute("UPDATE core.installation SET id = gen_random_uuid()")
        migrate.upgrade(database_url)
        assert conn.execute(
            "SELECT i.id, i.bound_how, i.database_oid = l.database_oid"
            " FROM core.installation AS i, core.installation_location() AS l"
        ).fetchone() == (identity[0], "migrated", True)
