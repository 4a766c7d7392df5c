"""The purge job (issue 3): which fences it deletes, which it keeps, and how it batches.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock.
"""

from __future__ import annotations

import io
import itertools
import json
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest

from maintenance.cli import EXIT_CONFIG, EXIT_OK, main
from maintenance.logs import configure_logging
from maintenance.purge import HASHED_PENDING_LIMIT, LOCK_NAME, PurgeConfig, Purger
from maintenance.settings import ConfigError, TtlGuard, load_settings

WINDOW = timedelta(minutes=10)
# TTL 7 days, margin 2 x a 10-minute retry window: fences processed in the last 20 minutes stay.
GUARD = TtlGuard(ttl=timedelta(days=7), window=WINDOW, margin=2.0)
PROTECTED = 2 * WINDOW
SECOND = timedelta(seconds=1)


def add_fence(conn: psycopg.Connection, *, processed_at: datetime, expires_at: datetime) -> uuid.UUID:
    job_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)"
        " VALUES (%s, 'points.credit', %s, %s, %s)",
        (job_id, uuid.uuid4(), processed_at, expires_at),
    )
    return job_id


def add_old_expired_fences(conn: psycopg.Connection, now: datetime, count: int) -> list[uuid.UUID]:
    """Fences processed 10 days ago that expired 3 days ago, one second apart in expiry order."""
    return [
        add_fence(conn, processed_at=now - timedelta(days=10) + i * SECOND, expires_at=now - timedelta(days=3) + i * SECOND)
        for i in range(count)
    ]


def add_dead_letter(conn: psycopg.Connection, job_id: uuid.UUID, status: str = "pending_review") -> None:
    row = conn.execute(
        "INSERT INTO core.dead_letters (job_id, queue, payload, attempts, last_error)"
        " VALUES (%s, 'points.credit', '{}', 5, 'ProviderUnavailable: HTTP 503') RETURNING id",
        (job_id,),
    ).fetchone()
    if status != "pending_review":
        conn.execute(
            "UPDATE core.dead_letters SET status = %s, discard_reason = %s WHERE id = %s",
            (status, "duplicate, ticket OPS-1" if status == "discarded" else None, row[0]),
        )


def remaining(conn: psycopg.Connection) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("SELECT job_id FROM core.processed_jobs")}


def purger(db, **overrides) -> Purger:
    return Purger(PurgeConfig(guard=GUARD, **overrides), db)


@pytest.fixture
def now(db) -> datetime:
    return db.server_now()


class LoggedEvents:
    """The structured events logged since it was created (debug included)."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        configure_logging(fmt="json", level="DEBUG", stream=self.stream)

    def named(self, name: str) -> list[dict]:
        parsed = (json.loads(line) for line in self.stream.getvalue().splitlines())
        return [event for event in parsed if event["event"] == name]


@pytest.fixture
def events() -> LoggedEvents:
    return LoggedEvents()


def test_defaults(clean_env):
    """With nothing set: batches of 10 000 (floor 100, halved after 2 timeouts), PT5S timeout, no pause, PT5M budget."""
    config = PurgeConfig.from_settings(load_settings())
    expected = {
        "batch_size": 10_000,
        "min_batch_size": 100,
        "timeouts_before_shrink": 2,
        "statement_timeout": timedelta(seconds=5),
        "batch_pause": timedelta(0),
        "max_runtime": timedelta(minutes=5),
    }
    assert {name: getattr(config, name) for name in expected} == expected
    assert {name: getattr(PurgeConfig(guard=GUARD), name) for name in expected} == expected
    assert config.guard == load_settings().ttl_guard()


def test_deletes_only_expired_fences(db, conn, now):
    """A fence one second past expires_at is deleted; one expiring a second from now is kept."""
    old = now - timedelta(days=8)
    expired = add_fence(conn, processed_at=old, expires_at=now - SECOND)
    not_yet = add_fence(conn, processed_at=old, expires_at=now + SECOND)
    result = purger(db).run_once(now)
    assert remaining(conn) == {not_yet}
    assert expired not in remaining(conn)
    assert (result.num_deleted, result.rows_left, result.ok) == (1, 0, True)


def test_keeps_fences_inside_retry_window(db, conn, now):
    """An expired fence processed less than margin x window ago survives; one processed just before is deleted."""
    # Both written with a too-short TTL by a misconfigured consumer: expired a minute after processing.
    outside = add_fence(conn, processed_at=now - PROTECTED - SECOND, expires_at=now - PROTECTED + timedelta(minutes=1))
    inside = add_fence(conn, processed_at=now - PROTECTED + SECOND, expires_at=now - PROTECTED + timedelta(minutes=1))
    result = purger(db).run_once(now)
    assert remaining(conn) == {inside}
    assert outside not in remaining(conn)
    assert result.num_deleted == 1


# Both spellings of the replay guard: a hash of the pending job_ids, or an index probe per row.
REPLAY_GUARDS = pytest.mark.parametrize("hashed_pending_limit", [HASHED_PENDING_LIMIT, 0], ids=["hashed", "probed"])


@REPLAY_GUARDS
def test_keeps_fences_with_a_pending_dead_letter_and_deletes_handled_ones(db, conn, now, hashed_pending_limit):
    """A pending dead letter holds its fence; replayed or discarded ones do not."""
    pending, replayed, discarded, replayed_then_pending, alone = add_old_expired_fences(conn, now, 5)
    add_dead_letter(conn, pending)
    add_dead_letter(conn, replayed, "replayed")
    add_dead_letter(conn, discarded, "discarded")
    add_dead_letter(conn, replayed_then_pending, "replayed")
    add_dead_letter(conn, replayed_then_pending)  # failed again after the replay: pending once more
    result = purger(db, hashed_pending_limit=hashed_pending_limit).run_once(now)
    assert remaining(conn) == {pending, replayed_then_pending}
    assert result.num_deleted == 3
    assert alone not in remaining(conn)


def test_deletes_in_batches_and_a_short_batch_ends_the_run(db, conn, now, events):
    """Batch size 10 and 11 deletable rows: a full batch, then a short one of 1 that ends the run."""
    add_old_expired_fences(conn, now, 11)
    kept = add_fence(conn, processed_at=now - timedelta(days=1), expires_at=now + timedelta(days=6))
    result = purger(db, batch_size=10).run_once(now)
    assert (result.num_deleted, result.num_batches, result.stopped_on_budget) == (11, 2, 0)
    assert [e["num_deleted"] for e in events.named("maintenance.purge.batch_deleted")] == [10, 1]
    assert remaining(conn) == {kept}
    assert 0 < result.longest_batch_ms < 5000


@REPLAY_GUARDS
def test_guarded_rows_do_not_end_the_run_early(db, conn, now, hashed_pending_limit):
    """Guarded rows interleaved in expiry order are skipped over, not counted as a short batch."""
    ids = add_old_expired_fences(conn, now, 30)
    held = ids[::3]  # every third fence has a pending dead letter
    for job_id in held:
        add_dead_letter(conn, job_id)
    result = purger(db, batch_size=5, min_batch_size=1, hashed_pending_limit=hashed_pending_limit).run_once(now)
    assert remaining(conn) == set(held)
    assert (result.num_deleted, result.num_batches) == (20, 5)


def test_pauses_between_batches(db, now, conn):
    """CORE_JOBS_PURGE_BATCH_PAUSE is waited between batches, not after the last."""
    add_old_expired_fences(conn, now, 25)
    pauses: list[float] = []
    config = PurgeConfig(guard=GUARD, batch_size=10, batch_pause=timedelta(milliseconds=250))
    result = Purger(config, db, sleep=pauses.append).run_once(now)
    assert result.num_batches == 3
    assert pauses == [0.25, 0.25]


def test_stops_on_the_time_budget_and_a_second_run_finishes(db, conn, now):
    """Past its budget no batch starts; the run reports rows_left, and the next run deletes them."""
    add_old_expired_fences(conn, now, 25)
    ticks = itertools.count()  # a clock that advances one second per reading
    config = PurgeConfig(guard=GUARD, batch_size=10, max_runtime=timedelta(seconds=2))
    # Readings: 0 sets the deadline at 2; 1 lets the first batch start; 2 is the budget's end.
    first = Purger(config, db, monotonic=lambda: float(next(ticks))).run_once(now)
    assert (first.num_deleted, first.num_batches, first.stopped_on_budget, first.rows_left) == (10, 1, 1, 15)
    assert len(remaining(conn)) == 15
    second = Purger(config, db).run_once(now)
    assert (second.num_deleted, second.stopped_on_budget, second.rows_left) == (15, 0, 0)
    assert remaining(conn) == set()


def test_concurrent_second_run_is_skipped(db, conn, now, events, database_url):
    """While another session holds the purge lock, a run deletes nothing, logs skipped and is ok."""
    add_old_expired_fences(conn, now, 3)
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", (LOCK_NAME,))
        result = purger(db).run_once(now)
    assert (result.skipped, result.num_deleted, result.ok) == (1, 0, True)
    assert len(remaining(conn)) == 3
    assert len(events.named("maintenance.purge.skipped")) == 1
    assert purger(db).run_once(now).num_deleted == 3  # the lock died with the other session


def test_guard_refusal_deletes_nothing(db, conn, now):
    """A TTL shorter than margin x window is refused when the job is built, naming TTL, window and margin."""
    add_old_expired_fences(conn, now, 3)
    short = TtlGuard(ttl=timedelta(minutes=15), window=WINDOW, margin=2.0)
    with pytest.raises(ConfigError) as refused:
        Purger(PurgeConfig(guard=short), db)
    message = str(refused.value)
    assert "CORE_JOBS_PROCESSED_JOBS_TTL=PT15M" in message and "PT10M" in message and "TOO SHORT" in message
    assert len(remaining(conn)) == 3


def test_run_once_purge_exits_2_and_deletes_nothing_when_the_guard_fails(clean_env, database_url, conn, now, capsys):
    """`core-jobs run-once purge` with a TTL below margin x window exits 2, explains, and deletes nothing."""
    add_old_expired_fences(conn, now, 3)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT10M")
    assert main(["run-once", "purge"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "CORE_JOBS_PROCESSED_JOBS_TTL=PT10M" in err and "raise CORE_JOBS_PROCESSED_JOBS_TTL" in err
    assert len(remaining(conn)) == 3


def test_run_once_purge_command_emits_the_fixed_result_fields(clean_env, database_url, conn, now, capsys):
    """`core-jobs run-once purge` exits 0 and its stop event carries every result key."""
    add_old_expired_fences(conn, now, 4)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    assert main(["run-once", "purge"]) == EXIT_OK
    stop = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "maintenance.purge.stop" in line]
    assert len(stop) == 1
    assert {k: stop[0][k] for k in ("num_deleted", "num_batches", "rows_left", "stopped_on_budget", "skipped")} == {
        "num_deleted": 4, "num_batches": 1, "rows_left": 0, "stopped_on_budget": 0, "skipped": 0,
    }
    assert {"longest_batch_ms", "batch_size", "num_timeouts", "gave_up"} <= stop[0].keys()


def test_statement_timeout_shrinks_the_batch(db, conn, now, database_url, events):
    """Repeated statement timeouts halve the batch; at the floor they stop the run with ok=false."""
    ids = add_old_expired_fences(conn, now, 10)
    config = PurgeConfig(
        guard=GUARD, batch_size=10, min_batch_size=2, timeouts_before_shrink=2,
        statement_timeout=timedelta(milliseconds=50),
    )
    with psycopg.connect(database_url) as other:  # holds a row lock on the 8th fence in expiry order
        other.execute("SELECT 1 FROM core.processed_jobs WHERE job_id = %s FOR UPDATE", (ids[7],))
        result = Purger(config, db).run_once(now)
        other.rollback()
    # 10 -> 2 timeouts -> 5: fences 1-5 go; 6-10 time out twice -> 2: 6-7 go; 8-9 time out at the floor.
    assert (result.num_deleted, result.num_timeouts, result.batch_size, result.gave_up, result.ok) == (7, 6, 2, 1, False)
    assert result.rows_left == 3  # a plain count is not blocked by the row lock
    assert remaining(conn) == set(ids[7:])
    assert [e["batch_size"] for e in events.named("maintenance.purge.batch_shrunk")] == [5, 2]
    assert len(events.named("maintenance.purge.gave_up")) == 1
    after = Purger(config, db).run_once(now)  # the lock is gone: the next run starts afresh and finishes
    assert (after.num_deleted, after.batch_size, after.ok) == (3, 10, True)


def test_rows_left_is_minus_one_when_even_counting_times_out(db, conn, now, database_url):
    """With the table locked by another session, the run gives up and says it could not count what is left."""
    add_old_expired_fences(conn, now, 3)
    config = PurgeConfig(guard=GUARD, batch_size=10, min_batch_size=10, statement_timeout=timedelta(milliseconds=50))
    with psycopg.connect(database_url) as other:
        other.execute("LOCK TABLE core.processed_jobs IN ACCESS EXCLUSIVE MODE")
        result = Purger(config, db).run_once(now)
        other.rollback()
    assert (result.num_deleted, result.num_timeouts, result.gave_up, result.rows_left) == (0, 2, 1, -1)
    assert len(remaining(conn)) == 3


def test_can_run_repeatedly(db, conn, now):
    """A second run over the same state deletes nothing and still succeeds; the kept rows stay."""
    add_old_expired_fences(conn, now, 5)
    fresh = add_fence(conn, processed_at=now - SECOND, expires_at=now + timedelta(days=7))
    first = purger(db).run_once(now)
    second = purger(db).run_once(now)
    third = purger(db).run_once(db.server_now())
    assert (first.num_deleted, second.num_deleted, third.num_deleted) == (5, 0, 0)
    assert second.ok and third.ok and second.num_batches == 1
    assert remaining(conn) == {fresh}


def test_demo_explains_what_was_deleted_and_kept(clean_env, pg_server_url, capsys):
    """The demo's purge lines count the deleted fences and those kept by each rule."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", pg_server_url)
    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "deleted 240 fences in 1 batch(es)" in out
    assert "kept 8 expired fences still inside the retry window" in out
    assert "kept 4 expired fences whose job has a dead letter pending review" in out
    assert "kept 60 fences not expired yet" in out
    assert "core.processed_jobs: 312 -> 72" in out


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("CORE_JOBS_PURGE_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("CORE_JOBS_PURGE_STATEMENT_TIMEOUT", "PT0S", "must be positive"),
        ("CORE_JOBS_PURGE_MAX_RUNTIME", "-PT1M", "must be positive"),
        ("CORE_JOBS_PURGE_BATCH_PAUSE", "-1", "must not be negative"),
    ],
)
def test_bad_purge_settings_are_named(clean_env, name, value, problem):
    """An invalid purge setting is a configuration error naming it."""
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}: .*{problem}"):
        load_settings()


def test_config_built_in_code_is_validated_too(db):
    """A PurgeConfig with a zero batch size is refused with the setting's name."""
    with pytest.raises(ConfigError, match="CORE_JOBS_PURGE_BATCH_SIZE must be at least 1"):
        Purger(PurgeConfig(guard=GUARD, batch_size=0), db)
