"""The database itself enforces the dead-letter lifecycle and the fence table's shape (issue 2, point 5).

Every illegal write is tried with plain SQL, as a psql session or a future service would.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

INSERT_SEED_COLUMNS = """
    INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, correlation_id)
    VALUES (%s, 'points.credit', '{"member_id": "m-1", "points": 50}', 5, 'ProviderTimeout', 'corr-1')
    RETURNING id"""


@pytest.fixture
def dead_letter_id(conn: psycopg.Connection) -> int:
    return conn.execute(INSERT_SEED_COLUMNS, (uuid.uuid4(),)).fetchone()[0]


def status_of(conn: psycopg.Connection, dead_letter_id: int) -> tuple[str, str | None]:
    return conn.execute(
        "SELECT status, discard_reason FROM core.dead_letters WHERE id = %s", (dead_letter_id,)
    ).fetchone()


def test_plain_insert_of_the_seed_columns_starts_pending_review(conn, dead_letter_id):
    """A dead letter inserted with only the seed's columns gets defaults and status pending_review."""
    row = conn.execute(
        "SELECT status, discard_reason, created_at IS NOT NULL, status_changed_at FROM core.dead_letters WHERE id = %s",
        (dead_letter_id,),
    ).fetchone()
    assert row == ("pending_review", None, True, None)


def test_new_dead_letter_cannot_start_reviewed(conn):
    """Inserting a dead letter already replayed is rejected: review starts at pending_review."""
    with pytest.raises(psycopg.errors.CheckViolation, match="must be pending_review"):
        conn.execute(
            "INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error, status)"
            " VALUES (%s, 'q', '{}', 1, 'x', 'replayed')",
            (uuid.uuid4(),),
        )


@pytest.mark.parametrize("reason", [None, "", "   "])
def test_discarding_without_a_reason_is_rejected(conn, dead_letter_id, reason):
    """J-AC7: a discard with a missing or blank reason fails and leaves the row pending."""
    with pytest.raises(psycopg.errors.CheckViolation, match="requires a non-blank discard_reason"):
        conn.execute(
            "UPDATE core.dead_letters SET status = 'discarded', discard_reason = %s WHERE id = %s",
            (reason, dead_letter_id),
        )
    assert status_of(conn, dead_letter_id) == ("pending_review", None)


def test_discarding_with_a_reason_records_it_and_the_time(conn, dead_letter_id):
    """A discard with a reason moves the row to discarded and stamps status_changed_at."""
    conn.execute(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'duplicate, OPS-1' WHERE id = %s",
        (dead_letter_id,),
    )
    assert status_of(conn, dead_letter_id) == ("discarded", "duplicate, OPS-1")
    stamped = conn.execute(
        "SELECT status_changed_at IS NOT NULL FROM core.dead_letters WHERE id = %s", (dead_letter_id,)
    )
    assert stamped.fetchone()[0] is True


def test_replaying_moves_pending_to_replayed(conn, dead_letter_id):
    """pending_review -> replayed is allowed."""
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (dead_letter_id,))
    assert status_of(conn, dead_letter_id) == ("replayed", None)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("replayed", "pending_review"),
        ("replayed", "discarded"),
        ("discarded", "replayed"),
        ("discarded", "pending_review"),
    ],
)
def test_handled_dead_letters_cannot_change_status_again(conn, dead_letter_id, first, then):
    """Only pending_review -> replayed | discarded exists; a handled dead letter stays handled."""
    conn.execute(
        "UPDATE core.dead_letters SET status = %s, discard_reason = %s WHERE id = %s",
        (first, "reason" if first == "discarded" else None, dead_letter_id),
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="the only transitions are pending_review"):
        conn.execute(
            "UPDATE core.dead_letters SET status = %s, discard_reason = %s WHERE id = %s",
            (then, "reason" if then == "discarded" else None, dead_letter_id),
        )


def test_unknown_status_is_rejected(conn, dead_letter_id):
    """A status outside pending_review | replayed | discarded is refused by the database."""
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE core.dead_letters SET status = 'archived' WHERE id = %s", (dead_letter_id,))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("payload", '{"points": 1}'),
        ("attempts", 9),
        ("last_error", "rewritten"),
        # A fixed value, not uuid4(): a parameter is part of the test's id, which every xdist worker must agree on.
        ("job_id", "00000000-0000-4000-8000-0000000000b7"),
        ("queue", "other.queue"),
        ("correlation_id", "corr-2"),
        ("created_at", "2020-01-01T00:00:00Z"),
    ],
)
def test_every_other_column_is_immutable(conn, dead_letter_id, column, value):
    """Append-only: an UPDATE of any column but the review state fails and names the column."""
    with pytest.raises(psycopg.errors.CheckViolation, match=f"column {column} of dead letter"):
        conn.execute(
            psycopg.sql.SQL("UPDATE core.dead_letters SET {} = %s WHERE id = %s").format(
                psycopg.sql.Identifier(column)
            ),
            (value, dead_letter_id),
        )


def test_discard_reason_cannot_be_rewritten_after_the_discard(conn, dead_letter_id):
    """Once discarded, the recorded reason is history and cannot be edited."""
    conn.execute(
        "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'first' WHERE id = %s", (dead_letter_id,)
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="discard_reason"):
        conn.execute("UPDATE core.dead_letters SET discard_reason = 'second' WHERE id = %s", (dead_letter_id,))


def replayed(conn: psycopg.Connection, dead_letter_id: int) -> int:
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (dead_letter_id,))
    return dead_letter_id


def test_a_replays_outcome_is_stamped_by_the_database_and_set_only_once(conn, dead_letter_id):
    """The outcome of a replay's delivery gets the server's time (not the client's) and cannot change afterwards."""
    replayed(conn, dead_letter_id)
    conn.execute(
        "UPDATE core.dead_letters SET replay_outcome = 'duplicate', replay_handled_at = '2000-01-01T00:00:00Z'"
        " WHERE id = %s",
        (dead_letter_id,),
    )
    outcome, stamped_now = conn.execute(
        "SELECT replay_outcome, replay_handled_at > now() - interval '1 minute' FROM core.dead_letters WHERE id = %s",
        (dead_letter_id,),
    ).fetchone()
    assert (outcome, stamped_now) == ("duplicate", True)
    for change in (
        "replay_outcome = 'processed'",
        "replay_outcome = NULL",
        "replay_handled_at = now() - interval '1 day'",
    ):
        with pytest.raises(psycopg.errors.CheckViolation, match="was already handled"):
            conn.execute(f"UPDATE core.dead_letters SET {change} WHERE id = %s", (dead_letter_id,))


@pytest.mark.parametrize("status", ["pending_review", "discarded"])
def test_only_a_replayed_dead_letter_gets_a_replay_outcome(conn, dead_letter_id, status):
    """A pending or discarded dead letter has no replay whose delivery could be handled."""
    if status == "discarded":
        conn.execute(
            "UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'x' WHERE id = %s", (dead_letter_id,)
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="only the replay of a replayed dead letter"):
        conn.execute("UPDATE core.dead_letters SET replay_outcome = 'processed' WHERE id = %s", (dead_letter_id,))


def test_a_replay_outcome_must_be_a_known_one(conn, dead_letter_id):
    """Outcomes are processed | duplicate | dead_lettered | released | untracked; anything else is refused."""
    replayed(conn, dead_letter_id)
    with pytest.raises(psycopg.errors.CheckViolation, match="dead_letters_replay_outcome_valid"):
        conn.execute("UPDATE core.dead_letters SET replay_outcome = 'done' WHERE id = %s", (dead_letter_id,))


@pytest.mark.parametrize("statement", ["DELETE FROM core.dead_letters", "TRUNCATE core.dead_letters"])
def test_dead_letters_are_never_deleted(conn, dead_letter_id, statement):
    """DELETE and TRUNCATE of dead letters are refused and the row survives."""
    with pytest.raises(psycopg.errors.CheckViolation, match="never deleted"):
        conn.execute(statement)
    assert conn.execute("SELECT count(*) FROM core.dead_letters").fetchone()[0] == 1


def test_processed_jobs_primary_key_is_job_and_consumer(conn):
    """The same job_id may be fenced once per consumer, never twice for one consumer."""
    job = uuid.uuid4()
    insert = (
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at)"
        " VALUES (%s, %s, %s, now() + interval '7 days')"
    )
    tenant = uuid.uuid4()
    conn.execute(insert, (job, "points.credit", tenant))
    conn.execute(insert, (job, "notifications.email", tenant))
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(insert, (job, "points.credit", tenant))


@pytest.mark.parametrize("column", ["job_id", "consumer", "tenant_id", "expires_at"])
def test_processed_jobs_columns_are_not_null(conn, column):
    """Every fence column is NOT NULL."""
    values = {"job_id": uuid.uuid4(), "consumer": "c", "tenant_id": uuid.uuid4(), "expires_at": "2999-01-01"}
    values[column] = None
    with pytest.raises(psycopg.errors.NotNullViolation):
        conn.execute(
            "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, expires_at) VALUES (%s, %s, %s, %s)",
            tuple(values.values()),
        )
