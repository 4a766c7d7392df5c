"""The purge job (issue 3): which fences it deletes, which it keeps, and how it batches.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The rules of
what is deleted hold for both access paths (``index`` and ``sweep``); tests of one path's
mechanics say which.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from support.factories import CONSUMER, TENANT, add_dead_letter, add_dead_letters, add_execution, add_fence
from support.harness_support import backdate_replay
from support.logcapture import LoggedEvents, events_in
from support.round_trips import protocol_trace

from harness.dead_letters import mark_replay_handled
from maintenance.cli import EXIT_CONFIG, EXIT_OK, main
from maintenance.jobs.purge.config import HASHED_PENDING_LIMIT, PurgeConfig
from maintenance.jobs.purge.job import LOCK_NAME, Purger, on_the_batch_clock
from maintenance.jobs.purge.paths import BlockSweep, Estimates, IndexWalk, choose, fetch_limited, sample_percent
from maintenance.jobs.purge.sql import (
    DELETE_EXPIRED_IDEMPOTENCY_KEYS,
    DELETE_FAILED_EXECUTIONS,
    INDEX_BATCH,
    INDEX_BATCH_END,
    INDEX_TIED_BATCH,
    SET_BATCH_LIMITS,
    SET_ROW_BATCH_LIMITS,
    SWEEP_BATCH,
)
from maintenance.settings import ConfigError, TtlGuard, load_settings

WINDOW = timedelta(minutes=10)
# TTL 7 days, margin 2 x a 10-minute retry window: fences processed in the last 20 minutes stay.
GUARD = TtlGuard(ttl=timedelta(days=7), window=WINDOW, margin=2.0)
PROTECTED = 2 * WINDOW
SECOND = timedelta(seconds=1)
# A target batch duration no test batch reaches, so the batch size only grows (up to the largest)
# and a loaded machine cannot change how many batches a test sees. Tests of the steering itself
# inject the batch durations instead.
UNHURRIED = timedelta(hours=1)


def add_old_expired_fences(conn: psycopg.Connection, now: datetime, count: int) -> list[uuid.UUID]:
    """Fences processed 10 days ago that expired 3 days ago, one second apart in expiry order."""
    return [
        add_fence(
            conn, processed_at=now - timedelta(days=10) + i * SECOND, expires_at=now - timedelta(days=3) + i * SECOND
        )
        for i in range(count)
    ]


def handled_at(conn: psycopg.Connection, job_id: uuid.UUID) -> datetime:
    """When the database stamped the handling of the replayed delivery of ``job_id``'s dead letter."""
    return conn.execute(
        "SELECT replay_handled_at FROM core.dead_letters WHERE job_id = %s AND status = 'replayed'", (job_id,)
    ).fetchone()[0]


def remaining(conn: psycopg.Connection) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("SELECT job_id FROM core.processed_jobs")}


def purger(db, **overrides) -> Purger:
    """A purge with the test guard; the index path unless ``strategy`` says otherwise; batches never too slow."""
    return Purger(PurgeConfig(guard=GUARD, **{"strategy": "index", "target_batch_duration": UNHURRIED} | overrides), db)


# The rules of what is deleted hold for both access paths.
BOTH_PATHS = pytest.mark.parametrize("strategy", ["index", "sweep"])


@pytest.fixture
def now(db) -> datetime:
    return db.server_now()


@pytest.fixture
def events(logs: LoggedEvents) -> LoggedEvents:
    """The log events of this test, debug included (the purge logs each batch at debug)."""
    return logs.at_level("DEBUG")


def test_defaults(clean_env):
    """With nothing set: batches aiming at 10 ms from 1 000 up to 50 000 rows (floor 100, halved after 2 timeouts), PT5S timeout, no pause, PT5M budget."""
    config = PurgeConfig.from_settings(load_settings())
    expected = {
        "batch_size": 50_000,
        "min_batch_size": 100,
        "target_batch_duration": timedelta(milliseconds=10),
        "slow_start_batch_size": 1000,
        "timeouts_before_shrink": 2,
        "statement_timeout": timedelta(seconds=5),
        "batch_pause": timedelta(0),
        "max_runtime": timedelta(minutes=5),
    }
    assert {name: getattr(config, name) for name in expected} == expected
    assert {name: getattr(PurgeConfig(guard=GUARD), name) for name in expected} == expected
    assert config.guard == load_settings().ttl_guard()


@BOTH_PATHS
def test_deletes_only_expired_fences(db, conn, now, strategy):
    """A fence one second past expires_at is deleted; one expiring a second from now is kept."""
    old = now - timedelta(days=8)
    expired = add_fence(conn, processed_at=old, expires_at=now - SECOND)
    not_yet = add_fence(conn, processed_at=old, expires_at=now + SECOND)
    result = purger(db, strategy=strategy).run_once(now)
    assert remaining(conn) == {not_yet}
    assert expired not in remaining(conn)
    assert (result.num_deleted, result.rows_left, result.ok) == (1, 0, True)
    assert result.used_sweep == (strategy == "sweep")


@BOTH_PATHS
def test_keeps_fences_inside_retry_window(db, conn, now, strategy):
    """An expired fence processed less than margin x window ago survives; one processed just before is deleted."""
    # Both written with a too-short TTL by a misconfigured consumer: expired a minute after processing.
    outside = add_fence(conn, processed_at=now - PROTECTED - SECOND, expires_at=now - PROTECTED + timedelta(minutes=1))
    inside = add_fence(conn, processed_at=now - PROTECTED + SECOND, expires_at=now - PROTECTED + timedelta(minutes=1))
    result = purger(db, strategy=strategy).run_once(now)
    assert remaining(conn) == {inside}
    assert outside not in remaining(conn)
    assert result.num_deleted == 1


# Both spellings of the replay guard: a hash of the pending job_ids, or an index probe per row.
REPLAY_GUARDS = pytest.mark.parametrize("hashed_pending_limit", [HASHED_PENDING_LIMIT, 0], ids=["hashed", "probed"])


@BOTH_PATHS
@REPLAY_GUARDS
def test_keeps_fences_with_a_pending_dead_letter_and_deletes_handled_ones(
    db, conn, now, hashed_pending_limit, strategy
):
    """A pending dead letter holds its fence; discarded ones, and replays handled more than margin x window ago, do not."""
    pending, replayed, discarded, replayed_then_pending, alone = add_old_expired_fences(conn, now, 5)
    add_dead_letter(conn, job_id=pending)
    add_dead_letter(conn, job_id=replayed, status="replayed", handled="duplicate")
    add_dead_letter(conn, job_id=discarded, status="discarded")
    add_dead_letter(conn, job_id=replayed_then_pending, status="replayed", handled="dead_lettered")
    add_dead_letter(conn, job_id=replayed_then_pending)  # failed again after the replay: pending once more
    later = handled_at(conn, replayed_then_pending) + PROTECTED + SECOND  # the replayed deliveries are long over
    result = purger(db, hashed_pending_limit=hashed_pending_limit, strategy=strategy).run_once(later)
    assert remaining(conn) == {pending, replayed_then_pending}
    assert result.num_deleted == 3
    assert alone not in remaining(conn)


@BOTH_PATHS
@REPLAY_GUARDS
def test_keeps_a_fence_while_its_replay_is_outstanding_and_a_window_after_it_is_handled(
    db, conn, now, hashed_pending_limit, strategy
):
    """A replay not yet handled holds its fence however long ago it was made; once handled, margin x window more, then not."""
    (fence,) = add_old_expired_fences(conn, now, 1)
    letter = add_dead_letter(conn, job_id=fence, status="replayed")
    backdate_replay(conn, fence, now - timedelta(days=30))  # replayed a month ago; its message still waits
    run = purger(db, hashed_pending_limit=hashed_pending_limit, strategy=strategy)
    assert run.run_once(now + timedelta(days=30)).num_deleted == 0
    assert remaining(conn) == {fence}
    assert mark_replay_handled(conn, letter, "duplicate")  # the harness handled the replayed delivery
    handled = handled_at(conn, fence)
    assert run.run_once(handled + PROTECTED - SECOND).num_deleted == 0  # a lost ack may still bring it back
    assert remaining(conn) == {fence}
    assert run.run_once(handled + PROTECTED + SECOND).num_deleted == 1
    assert remaining(conn) == set()


def test_deletes_in_batches_and_a_short_batch_ends_the_run(db, conn, now, events):
    """Index path, batch size 10 and 11 deletable rows: a full batch, then a short one of 1 that ends the run; longest_batch_ms is the longer one."""
    add_old_expired_fences(conn, now, 11)
    kept = add_fence(conn, processed_at=now - timedelta(days=1), expires_at=now + timedelta(days=6))
    purge = Purger(purger(db, batch_size=10).config, db, batch_clock=batch_clock(7, 3), timed_by=on_the_batch_clock)
    result = purge.run_once(now)
    assert (result.num_deleted, result.num_batches, result.stopped_on_budget) == (11, 2, 0)
    assert [e["num_deleted"] for e in events.named("maintenance.purge.batch_deleted")] == [10, 1]
    assert remaining(conn) == {kept}
    assert result.longest_batch_ms == 7.0  # the first, longer batch, as the batch clock timed it (not the last)


def batch_clock(*durations_ms: float):
    """A batch clock under which the n-th batch takes ``durations_ms[n]`` ms (the last repeats)."""
    durations = itertools.chain(durations_ms, itertools.repeat(durations_ms[-1]))
    readings = itertools.chain.from_iterable((0.0, ms / 1000) for ms in durations)  # start, end of each batch
    return lambda: next(readings)


def steered(db, clock, **overrides) -> Purger:
    """An index-path purge aiming at 20 ms per batch, timed by ``clock``."""
    config = PurgeConfig(
        guard=GUARD, **{"strategy": "index", "target_batch_duration": timedelta(milliseconds=20)} | overrides
    )
    return Purger(config, db, batch_clock=clock, timed_by=on_the_batch_clock)


def test_steers_on_the_transaction_time_the_server_measured_not_the_round_trip(db, conn, now, events):
    """Batches whose round trips take 5 s (a starved client) but whose transactions take well under half the 2 s target still double; longest_batch_ms is the server's figure."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    config = PurgeConfig(
        guard=GUARD,
        strategy="index",
        target_batch_duration=timedelta(seconds=2),
        batch_size=400,
        min_batch_size=10,
        slow_start_batch_size=50,
    )
    result = Purger(config, db, batch_clock=batch_clock(5000)).run_once(now)
    assert batch_sizes(events) == [(50, 50), (100, 100), (200, 200), (400, 400), (400, 400), (400, 350)]
    logged = [e["transaction_ms"] for e in events.named("maintenance.purge.batch_deleted")]
    assert result.longest_batch_ms == max(logged) < 1000


def batch_sizes(events: LoggedEvents) -> list[tuple[int, int]]:
    """(batch size, rows deleted) of each batch, in order."""
    return [(e["batch_size"], e["num_deleted"]) for e in events.named("maintenance.purge.batch_deleted")]


def test_starts_slow_and_doubles_up_to_the_largest_batch_while_batches_are_fast(db, conn, now, events):
    """Batches well under the target double from the slow start up to CORE_JOBS_PURGE_BATCH_SIZE, and stay there."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    result = steered(db, batch_clock(1), batch_size=400, min_batch_size=10, slow_start_batch_size=50).run_once(now)
    assert batch_sizes(events) == [(50, 50), (100, 100), (200, 200), (400, 400), (400, 400), (400, 350)]
    assert (result.num_deleted, result.batch_size, result.rows_left) == (1500, 400, 0)
    assert remaining(conn) == set()


def test_a_slow_batch_shrinks_the_next_in_proportion(db, conn, now, events):
    """A batch 4x over the target makes the next 4x smaller; one just under the target keeps its size."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    # 1 000 rows in 80 ms -> 250; 250 in 40 ms -> 125; then 15 ms, between half the target and the target: kept.
    result = steered(db, batch_clock(80, 40, 15), batch_size=1000).run_once(now)
    # 250 and 125 are full batches for their own limits, though shorter than the largest: the run goes on,
    # and ends with the batch whose range reaches the cutoff (1 500 = 1 000 + 250 + 125 + 125: no empty batch after).
    assert batch_sizes(events) == [(1000, 1000), (250, 250), (125, 125), (125, 125)]
    assert (result.num_deleted, result.batch_size, result.longest_batch_ms) == (1500, 125, 80.0)
    assert remaining(conn) == set()


def test_the_batch_size_stays_between_the_minimum_and_the_largest(db, conn, now, events):
    """A very slow batch shrinks the next only to CORE_JOBS_PURGE_MIN_BATCH_SIZE; fast ones grow it only to the largest."""
    load_fences(conn, now, 1200, 1.0, shuffled=False)
    # 300 rows in 1 s would ask for 6 rows: the floor is 100; then fast: 200, then 400 capped at 300.
    result = steered(db, batch_clock(1000, 1), batch_size=300, min_batch_size=100).run_once(now)
    assert batch_sizes(events) == [(300, 300), (100, 100), (200, 200), (300, 300), (300, 300)]
    assert result.num_deleted == 1200


def test_a_slow_sweep_batch_narrows_the_block_range(db, conn, now, events):
    """Sweep: the steering sizes the block range as it sizes the batch, about batch size / rows per page blocks."""
    load_fences(conn, now, 3000, 1.0, shuffled=True)
    reltuples, relpages = conn.execute(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = 'core.processed_jobs'::regclass"
    ).fetchone()
    rows_per_page = reltuples / relpages
    result = steered(db, batch_clock(40, 15), strategy="sweep", batch_size=800).run_once(now)
    deleted = events.named("maintenance.purge.batch_deleted")
    assert [e["batch_size"] for e in deleted[:3]] == [800, 400, 400]  # 40 ms: halved; then 15 ms: kept
    widths = [e["to_block"] - e["from_block"] for e in deleted[:3]]
    assert widths == [round(800 / rows_per_page), round(400 / rows_per_page), round(400 / rows_per_page)]
    assert (result.num_deleted, result.used_sweep) == (3000, 1)


@REPLAY_GUARDS
def test_guarded_rows_do_not_end_the_run_early(db, conn, now, hashed_pending_limit):
    """Index path: guarded rows interleaved in expiry order are skipped over; the run goes on to the cutoff."""
    ids = add_old_expired_fences(conn, now, 30)
    held = ids[::3]  # every third fence has a pending dead letter
    for job_id in held:
        add_dead_letter(conn, job_id=job_id)
    result = purger(db, batch_size=5, min_batch_size=1, hashed_pending_limit=hashed_pending_limit).run_once(now)
    assert remaining(conn) == set(held)
    # each batch's range holds 5 fences, held ones included: 30 fences are 6 ranges, however many each deletes
    assert (result.num_deleted, result.num_batches) == (20, 30 // 5)


@REPLAY_GUARDS
def test_deletes_a_tie_larger_than_the_batch_in_batches_and_walks_past_it(db, conn, now, events, hashed_pending_limit):
    """Index path, batch 10: 25 fences expiring at one instant (3 held) go 10 at a time, then the fences after it; each batch deletes at most 10."""
    before = add_old_expired_fences(conn, now, 4)
    instant = now - timedelta(days=2)
    tied = [add_fence(conn, processed_at=instant - timedelta(days=7), expires_at=instant) for _ in range(25)]
    for job_id in tied[:3]:
        add_dead_letter(conn, job_id=job_id)
    after = [
        add_fence(conn, processed_at=now - timedelta(days=8), expires_at=instant + i * SECOND) for i in range(1, 8)
    ]
    kept = add_fence(conn, processed_at=now - timedelta(days=1), expires_at=now + timedelta(days=6))
    run = purger(db, batch_size=10, min_batch_size=1, hashed_pending_limit=hashed_pending_limit)
    result = run.run_once(now)
    assert remaining(conn) == {*tied[:3], kept}
    assert result.num_deleted == len(before) + 22 + len(after)
    deleted = [n for _, n in batch_sizes(events)]
    assert max(deleted) <= 10
    # the 4 before the instant (their range stops at it); inside the tie 10, 10; then 12 fences are left from the
    # instant (3 held, 2 tied, 7 after), so a range ends again: the tie's last 2 and 5 after; then the last 2
    assert deleted == [4, 10, 10, 2 + 5, 2]


@REPLAY_GUARDS
def test_walks_past_a_tie_whose_held_fences_outnumber_the_batch(db, conn, now, events, hashed_pending_limit):
    """Index path, batch 10: 25 fences expiring at one instant, 15 of them held: the 10 others go, then the walk passes the instant to the fences after it."""
    instant = now - timedelta(days=2)
    tied = [add_fence(conn, processed_at=instant - timedelta(days=7), expires_at=instant) for _ in range(25)]
    for job_id in tied[:15]:
        add_dead_letter(conn, job_id=job_id)
    after = [
        add_fence(conn, processed_at=now - timedelta(days=8), expires_at=instant + i * SECOND) for i in range(1, 4)
    ]
    result = purger(db, batch_size=10, min_batch_size=1, hashed_pending_limit=hashed_pending_limit).run_once(now)
    assert remaining(conn) == set(tied[:15])
    assert result.num_deleted == 10 + len(after)
    # up to the instant: none; inside the tie: 10, then none (only held ones left at the instant: past it); the 3 after
    assert [n for _, n in batch_sizes(events)] == [0, 10, 0, 3]


def test_a_held_tie_just_before_the_cutoff_ends_the_walk(db, conn, now, events):
    """Index path, batch 2: 3 fences expiring one microsecond before the cutoff, all inside the retry window (kept): the run ends, it does not loop to its budget."""
    instant = now - timedelta(microseconds=1)
    held = {add_fence(conn, processed_at=now - timedelta(minutes=1), expires_at=instant) for _ in range(3)}
    ticks = itertools.count()  # the budget's clock: one second per reading, so a walk that never ends stops at 300
    run = Purger(purger(db, batch_size=2, min_batch_size=1).config, db, monotonic=lambda: float(next(ticks)))
    result = run.run_once(now)
    assert remaining(conn) == held
    assert (result.num_deleted, result.stopped_on_budget, result.num_batches) == (0, 0, 2)


def test_pauses_between_batches(db, now, conn):
    """CORE_JOBS_PURGE_BATCH_PAUSE is waited between batches, not after the last."""
    add_old_expired_fences(conn, now, 25)
    pauses: list[float] = []
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=10,
        batch_pause=timedelta(milliseconds=250),
        strategy="index",
    )
    result = Purger(config, db, sleep=pauses.append).run_once(now)
    assert result.num_batches == 3
    assert pauses == [0.25, 0.25]


def test_stops_on_the_time_budget_and_a_second_run_finishes(db, conn, now):
    """Index path: past its budget no batch starts; the run reports rows_left, and the next run deletes them."""
    add_old_expired_fences(conn, now, 25)
    ticks = itertools.count()  # a clock that advances one second per reading
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=10,
        max_runtime=timedelta(seconds=2),
        strategy="index",
    )
    # Readings: 0 sets the deadline at 2; 1 lets the first batch start; 2 is the budget's end.
    first = Purger(config, db, monotonic=lambda: float(next(ticks))).run_once(now)
    assert (first.num_deleted, first.num_batches, first.stopped_on_budget, first.rows_left) == (10, 1, 1, 15)
    assert len(remaining(conn)) == 15
    second = Purger(config, db).run_once(now)
    assert (second.num_deleted, second.stopped_on_budget, second.rows_left) == (15, 0, 0)
    assert remaining(conn) == set()


def test_a_stop_request_ends_the_run_after_the_batch_in_hand(db, conn, now):
    """A stop event set during a batch lets that batch commit, starts no other, reports rows_left; the next run finishes."""
    add_old_expired_fences(conn, now, 25)
    stop = threading.Event()
    readings = itertools.count()

    def batch_clock() -> float:  # read at each batch's start and end: the SIGTERM comes during the first
        if next(readings) == 1:
            stop.set()
        return 0.0

    config = PurgeConfig(guard=GUARD, target_batch_duration=UNHURRIED, batch_size=10, strategy="index")
    first = Purger(config, db, stop=stop, batch_clock=batch_clock).run_once(now)
    assert (first.num_deleted, first.num_batches, first.stopped_on_signal, first.rows_left) == (10, 1, 1, 15)
    assert first.ok
    second = Purger(config, db).run_once(now)
    assert (second.num_deleted, second.stopped_on_signal, second.rows_left) == (15, 0, 0)


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
    stop = events_in(capsys.readouterr().out, "maintenance.purge.stop")
    assert len(stop) == 1
    assert {k: stop[0][k] for k in ("num_deleted", "num_batches", "rows_left", "stopped_on_budget", "skipped")} == {
        "num_deleted": 4,
        "num_batches": 1,
        "rows_left": 0,
        "stopped_on_budget": 0,
        "skipped": 0,
    }
    assert {"longest_batch_ms", "batch_size", "num_timeouts", "gave_up"} <= stop[0].keys()


def test_statement_timeout_shrinks_the_batch(db, conn, now, database_url, events):
    """Index path: repeated statement timeouts halve the batch, which never grows back that run; at the floor they stop it with ok=false."""
    ids = add_old_expired_fences(conn, now, 10)
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=10,
        min_batch_size=2,
        timeouts_before_shrink=2,
        statement_timeout=timedelta(milliseconds=50),
        strategy="index",
    )
    with psycopg.connect(database_url) as other:  # holds a row lock on the 8th fence in expiry order
        other.execute("SELECT 1 FROM core.processed_jobs WHERE job_id = %s FOR UPDATE", (ids[7],))
        result = Purger(config, db).run_once(now)
        other.rollback()
    # 10 -> 2 timeouts -> 5: fences 1-5 go; 6-10 time out twice -> 2: 6-7 go; 8-9 time out at the floor.
    assert (result.num_deleted, result.num_timeouts, result.batch_size, result.gave_up, result.ok) == (
        7,
        6,
        2,
        1,
        False,
    )
    assert result.rows_left == 3  # a plain count is not blocked by the row lock
    assert remaining(conn) == set(ids[7:])
    assert [e["batch_size"] for e in events.named("maintenance.purge.batch_shrunk")] == [5, 2]
    assert len(events.named("maintenance.purge.gave_up")) == 1
    after = Purger(config, db).run_once(now)  # the lock is gone: the next run starts afresh and finishes
    assert (after.num_deleted, after.batch_size, after.ok) == (3, 10, True)


def test_rows_left_is_minus_one_when_even_counting_times_out(db, conn, now, database_url, events):
    """With the table locked by another session, auto cannot estimate, and the run gives up unable to count."""
    add_old_expired_fences(conn, now, 3)
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=10,
        min_batch_size=10,
        statement_timeout=timedelta(milliseconds=50),
        strategy="auto",
    )
    with psycopg.connect(database_url) as other:
        other.execute("LOCK TABLE core.processed_jobs IN ACCESS EXCLUSIVE MODE")
        result = Purger(config, db).run_once(now)
        other.rollback()
    assert (result.num_deleted, result.num_timeouts, result.gave_up, result.rows_left) == (0, 2, 1, -1)
    assert len(remaining(conn)) == 3
    assert [e["strategy"] for e in events.named("maintenance.purge.estimates_timeout")] == ["index"]


@BOTH_PATHS
def test_can_run_repeatedly(db, conn, now, strategy):
    """A second run over the same state deletes nothing and still succeeds; the kept rows stay."""
    add_old_expired_fences(conn, now, 5)
    fresh = add_fence(conn, processed_at=now - SECOND, expires_at=now + timedelta(days=7))
    first = purger(db, strategy=strategy).run_once(now)
    second = purger(db, strategy=strategy).run_once(now)
    third = purger(db, strategy=strategy).run_once(db.server_now())
    assert (first.num_deleted, second.num_deleted, third.num_deleted) == (5, 0, 0)
    assert second.ok and third.ok and second.num_batches == 1
    assert remaining(conn) == {fresh}


def test_demo_explains_what_was_deleted_and_kept(demo_output):
    """The demo's purge lines count the deleted fences and those kept by each rule."""
    out = demo_output
    assert "deleted 240 fences in 1 batch(es)" in out
    assert "kept 8 expired fences still inside the retry window" in out
    assert "kept 4 expired fences whose job has a dead letter pending review" in out
    assert "kept 60 fences not expired yet" in out
    assert "access path: sweep of the table in block ranges (" in out  # never analyzed, 77 % expired: sampled
    assert "core.processed_jobs: 312 -> 72" in out


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("CORE_JOBS_PURGE_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("CORE_JOBS_PURGE_STATEMENT_TIMEOUT", "PT0S", "must be at least 1 ms"),
        ("CORE_JOBS_PURGE_MAX_RUNTIME", "-PT1M", "must be positive"),
        ("CORE_JOBS_PURGE_BATCH_PAUSE", "-1", "must not be negative"),
        ("CORE_JOBS_PURGE_TARGET_BATCH_DURATION", "PT0S", "must be positive"),
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


# --- the two access paths, and auto's choice ---------------------------------------------------
# Fences loaded in one statement: :rows of them, :expired_share of them processed 10 days ago and
# expired 3 days ago, the rest processed a day ago and expiring in 6 days; in expiry order, or
# in random physical order.
LOAD_FENCES = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(), t.processed_at, t.processed_at + interval '7 days'
  FROM generate_series(1, %(rows)s) AS g
 CROSS JOIN LATERAL (SELECT CASE WHEN g <= %(rows)s * %(expired_share)s
                                 THEN %(now)s - interval '10 days' + g * interval '1 second'
                                 ELSE %(now)s - interval '1 day' + g * interval '1 second' END AS processed_at) AS t
 ORDER BY {layout}"""


def load_fences(conn: psycopg.Connection, now: datetime, rows: int, expired_share: float, *, shuffled: bool) -> None:
    layout = "random()" if shuffled else "t.processed_at"
    conn.execute(LOAD_FENCES.format(layout=layout), {"rows": rows, "expired_share": expired_share, "now": now})
    conn.execute("VACUUM (ANALYZE) core.processed_jobs")


def table_blocks(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT pg_relation_size('core.processed_jobs') / current_setting('block_size')::int"
    ).fetchone()[0]


def add_mixed_fences(conn: psycopg.Connection, now: datetime) -> None:
    """Fences on both sides of every cutoff, in random physical order, over several pages."""
    load_fences(conn, now, 1500, 0.5, shuffled=True)
    cases = []
    for _ in range(20):
        cases += [
            # expires_at one second on either side of the cutoff
            (now - timedelta(days=8), now - SECOND),
            (now - timedelta(days=8), now + SECOND),
            # short-TTL fences processed just outside and just inside margin x window
            (now - PROTECTED - SECOND, now - PROTECTED + timedelta(minutes=1)),
            (now - PROTECTED + SECOND, now - PROTECTED + timedelta(minutes=1)),
        ]
    for processed_at, expires_at in cases:
        add_fence(conn, processed_at=processed_at, expires_at=expires_at)
    held = conn.execute(
        "SELECT job_id FROM core.processed_jobs WHERE expires_at < %s AND processed_at < %s ORDER BY random() LIMIT 60",
        (now, now - PROTECTED),
    ).fetchall()
    for i, (job_id,) in enumerate(held):
        kind = i % 4
        add_dead_letter(
            conn,
            job_id=job_id,
            status=("pending_review", "replayed", "discarded", "replayed")[kind],
            handled="duplicate" if kind == 1 else None,
        )
        if kind == 1:  # replayed deliveries handled a second either side of margin x window before the cutoff
            backdate_replay(
                conn, job_id, now - PROTECTED + (SECOND if (i // 4) % 2 else -SECOND), stamp="replay_handled_at"
            )
        if kind == 3:  # replays a month old whose deliveries are still outstanding
            backdate_replay(conn, job_id, now - timedelta(days=30))


def expected_after_purge(conn: psycopg.Connection, now: datetime) -> set[uuid.UUID]:
    """The fences the rules keep, computed here row by row."""
    pending = {
        r[0]
        for r in conn.execute(
            "SELECT job_id FROM core.dead_letters WHERE status = 'pending_review'"
            " OR (status = 'replayed' AND (replay_handled_at IS NULL OR replay_handled_at >= %s))",
            (now - PROTECTED,),
        )
    }
    rows = conn.execute("SELECT job_id, processed_at, expires_at FROM core.processed_jobs").fetchall()
    return {
        job_id
        for job_id, processed_at, expires_at in rows
        if expires_at >= now or processed_at >= now - PROTECTED or job_id in pending
    }


@REPLAY_GUARDS
@pytest.mark.parametrize("walk", ["index", "sweep"])
def test_a_batch_is_one_transaction_in_one_round_trip_that_keeps_its_limits_to_itself(
    conn, now, walk, hashed_pending_limit
):
    """A batch's transaction is one message (its limits, its DELETE, its time) and one answer — the index walk first
    reads where its range ends, in a message of its own; it deletes, commits, and leaves the session's settings as they were."""
    load_fences(conn, now, 2000, 1.0, shuffled=False)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cutoff": now, "protected_from": now - PROTECTED}
    path = IndexWalk(guard, None) if walk == "index" else BlockSweep(guard, Estimates(table_blocks(conn), 100.0))
    with protocol_trace(conn) as trace:
        batch = path.batch(conn, "5s", params, 100)
    sent = [line.split("\t")[2] for line in trace if line.startswith("F")]
    answers = [line for line in trace if line.startswith("B") and "ReadyForQuery" in line]
    messages = 2 if walk == "index" else 1
    assert (sent, len(answers), conn.info.transaction_status) == (
        ["Query"] * messages,
        messages,
        TransactionStatus.IDLE,
    )
    last_message = trace[max(i for i, line in enumerate(trace) if line.startswith("F")) :]
    assert sum("CommandComplete" in line and "DELETE" in line for line in last_message) == 1
    left = conn.execute("SELECT count(*) FROM core.processed_jobs").fetchone()[0]
    expected = 100 if walk == "index" else 2000 - left  # the index walk: the batch size; the sweep: its blocks' rows
    assert (batch["num_deleted"], left < 2000) == (expected, True)
    assert batch["transaction_ms"] > 0
    settings = conn.execute("SELECT current_setting('statement_timeout'), current_setting('synchronous_commit')")
    assert settings.fetchone() == ("0", "on")


@REPLAY_GUARDS
def test_sweep_deletes_exactly_what_the_index_walk_deletes(db, conn, now, hashed_pending_limit):
    """On the same rows (every cutoff, pending, handled and outstanding dead letters, short TTLs) both paths keep the same set."""
    add_mixed_fences(conn, now)
    conn.execute("CREATE TABLE core.fences_before AS SELECT * FROM core.processed_jobs")
    expected = expected_after_purge(conn, now)
    total = len(remaining(conn))
    kept = {}
    for strategy in ("index", "sweep"):
        conn.execute("TRUNCATE core.processed_jobs")
        conn.execute("INSERT INTO core.processed_jobs SELECT * FROM core.fences_before ORDER BY random()")
        result = purger(db, strategy=strategy, batch_size=100, hashed_pending_limit=hashed_pending_limit).run_once(now)
        kept[strategy] = remaining(conn)
        assert result.num_deleted == total - len(expected)
    conn.execute("DROP TABLE core.fences_before")
    assert kept["index"] == kept["sweep"] == expected
    # not expired (loaded, then one second left), inside the window, pending, replays handled inside the window
    # (7 of 15), outstanding replays
    assert len(expected) == 750 + 20 + 20 + 15 + 7 + 15


def test_sweep_batches_end_when_the_block_cursor_passes_the_end(db, conn, now, events):
    """The sweep reads block ranges of ~batch_size rows from block 0 up to the table's size at the start."""
    load_fences(conn, now, 2000, 0.6, shuffled=True)
    blocks = table_blocks(conn)
    reltuples, relpages = conn.execute(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = 'core.processed_jobs'::regclass"
    ).fetchone()
    per_batch = round(200 / (reltuples / relpages))  # blocks of about 200 rows
    result = purger(db, strategy="sweep", batch_size=200).run_once(now)
    ranges = [(e["from_block"], e["to_block"]) for e in events.named("maintenance.purge.batch_deleted")]
    starts = list(range(0, blocks, per_batch))
    assert ranges == [(start, start + per_batch) for start in starts]
    assert ranges[-1][0] < blocks <= ranges[-1][1]
    assert (result.num_deleted, result.num_batches, result.used_sweep) == (1200, len(starts), 1)
    assert len(remaining(conn)) == 800


def test_sweep_stops_on_the_time_budget_and_a_second_run_finishes(db, conn, now):
    """Sweep: past its budget no batch starts; rows_left counts the blocks not swept; the next run deletes them."""
    load_fences(conn, now, 1000, 1.0, shuffled=True)
    ticks = itertools.count()  # one second per reading: the deadline at 2, one batch, then the budget's end
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=200,
        max_runtime=timedelta(seconds=2),
        strategy="sweep",
    )
    first = Purger(config, db, monotonic=lambda: float(next(ticks))).run_once(now)
    assert (first.num_batches, first.stopped_on_budget, first.used_sweep) == (1, 1, 1)
    assert 0 < first.num_deleted < 1000
    assert first.rows_left == 1000 - first.num_deleted == len(remaining(conn))
    second = Purger(config, db).run_once(now)
    assert (second.num_deleted, second.stopped_on_budget, second.rows_left) == (1000 - first.num_deleted, 0, 0)
    assert remaining(conn) == set()


def test_sweep_statement_timeouts_shrink_the_block_range(db, conn, now, database_url, events):
    """Sweep: timeouts halve the batch and with it the blocks per batch, down to one block, then it gives up."""
    load_fences(conn, now, 1000, 1.0, shuffled=False)
    locked_block = 3
    config = PurgeConfig(
        guard=GUARD,
        target_batch_duration=UNHURRIED,
        batch_size=400,
        min_batch_size=50,
        timeouts_before_shrink=1,
        statement_timeout=timedelta(milliseconds=50),
        strategy="sweep",
    )
    with psycopg.connect(database_url) as other:  # a row lock in block 3
        other.execute(
            "SELECT 1 FROM core.processed_jobs WHERE ctid >= %s::tid AND ctid < %s::tid LIMIT 1 FOR UPDATE",
            (f"({locked_block},0)", f"({locked_block + 1},0)"),
        )
        result = Purger(config, db).run_once(now)
        other.rollback()
    ranges = [(e["from_block"], e["to_block"]) for e in events.named("maintenance.purge.batch_deleted")]
    # 400 rows ~ 5 blocks [0, 5) holds block 3: 200 ~ 2 blocks [0, 2) goes, [2, 4) times out; 100 ~ 1: [2, 3)
    # goes, [3, 4) times out; 50 rows still round to 1 block and time out at the floor.
    assert ranges == [(0, 2), (2, 3)]
    assert [e["batch_size"] for e in events.named("maintenance.purge.batch_shrunk")] == [200, 100, 50]
    assert (result.gave_up, result.batch_size, result.num_timeouts) == (1, 50, 4)
    blocks_of_left = conn.execute("SELECT min((ctid::text::point)[0]) FROM core.processed_jobs").fetchone()[0]
    assert blocks_of_left == locked_block


def test_auto_sweeps_a_shuffled_mostly_expired_table(db, conn, now, events):
    """Auto: with most rows expired and expires_at uncorrelated with the physical order, it sweeps."""
    load_fences(conn, now, 3000, 0.7, shuffled=True)
    result = purger(db, strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], chosen["setting"], result.used_sweep) == ("sweep", "auto", 1)
    assert abs(chosen["correlation"]) < 0.1
    assert chosen["expired_fraction"] == 0.7  # a small table is sampled whole
    assert chosen["estimated_sweep_s"] < chosen["estimated_index_s"]
    assert result.num_deleted == 2100


@pytest.mark.parametrize(("expired_share", "shuffled"), [(0.3, False), (0.01, True)], ids=["ordered", "mostly-fresh"])
def test_auto_walks_the_index_on_an_ordered_or_mostly_fresh_table(db, conn, now, events, expired_share, shuffled):
    """Auto: rows in expiry order (30 % expired), or few rows expired (1 %, shuffled), take the index walk."""
    load_fences(conn, now, 3000, expired_share, shuffled=shuffled)
    result = purger(db, strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.used_sweep) == ("index", 0)
    assert chosen["reason"].startswith("index estimated cheaper")
    assert chosen["expired_fraction"] == expired_share
    assert result.num_deleted == round(3000 * expired_share)


def test_auto_walks_the_index_on_an_empty_table_never_analyzed(db, conn, now, events):
    """Auto: never analyzed and empty, the sample has no correlation to give: it takes the index walk and deletes nothing."""
    result = purger(db, strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], chosen["correlation"], result.num_deleted) == ("index", None, 0)
    assert (chosen["estimated_index_s"], chosen["estimated_sweep_s"]) == (None, None)
    assert chosen["reason"].startswith("no correlation")


@pytest.mark.parametrize(
    ("shuffled", "expired_share", "strategy"),
    [(True, 0.7, "sweep"), (False, 0.3, "index")],
    ids=["shuffled", "ordered"],
)
def test_auto_chooses_from_the_sample_on_a_table_never_analyzed(
    db, conn, now, events, shuffled, expired_share, strategy
):
    """Auto, never analyzed: the sample's rank correlation of expires_at with the physical order decides as pg_stats would (shuffled 70 % expired: sweep; in order 30 %: index)."""
    conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
    layout = "random()" if shuffled else "t.processed_at"
    conn.execute(LOAD_FENCES.format(layout=layout), {"rows": 3000, "expired_share": expired_share, "now": now})
    result = purger(db, strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.num_deleted) == (strategy, round(3000 * expired_share))
    assert abs(chosen["correlation"]) < 0.1 if shuffled else chosen["correlation"] > 0.9


@pytest.mark.parametrize(
    ("correlation", "expired_fraction", "strategy"),
    [
        (0.0, 0.01, "index"),  # random order, the steady state: index measured 2x faster
        (0.0, 0.05, "sweep"),  # random order: sweep measured 2x faster from 3 %
        (0.0, 0.60, "sweep"),  # measured 4.5x faster
        (0.9, 0.60, "sweep"),  # 10 % of rows out of place: sweep measured 2.1x faster
        (0.75, 0.20, "sweep"),  # 25 % out of place: sweep measured 1.5x faster
        (1.0, 0.01, "index"),  # expiry order: index measured 9x faster
        (1.0, 0.30, "index"),
        (1.0, 0.60, "index"),  # measured even (0.95-1.05x): a tie goes to the index walk
        (-1.0, 0.30, "index"),  # reverse expiry order is as clustered
        (None, 0.60, "index"),  # a sample of fewer than two rows: no correlation to go by
    ],
)
def test_auto_takes_the_path_measured_faster(correlation, expired_fraction, strategy):
    """Auto's estimate picks, for each layout measured with bench/purge.py, the path that was faster there."""
    estimates = Estimates(
        table_blocks=23_000, rows_per_page=86, expired_fraction=expired_fraction, correlation=correlation
    )
    assert choose("auto", estimates)[0] == strategy
    assert choose("index", estimates)[0] == "index" and choose("sweep", estimates)[0] == "sweep"


@pytest.mark.parametrize(
    ("table_blocks", "sampled_blocks"), [(150, 150), (20_000, 200), (23_000, 230), (100_000_000, 2_000)]
)
def test_auto_samples_one_percent_of_the_pages_within_bounds(table_blocks, sampled_blocks):
    """Auto samples 1 % of the pages, all of a small table, at least 200 and at most 2 000."""
    assert sample_percent(table_blocks) * table_blocks / 100 == pytest.approx(sampled_blocks)


def test_strategy_setting(clean_env):
    """CORE_JOBS_PURGE_STRATEGY defaults to auto, takes index or sweep, and names itself when wrong."""
    assert PurgeConfig.from_settings(load_settings()).strategy == "auto"
    clean_env.setenv("CORE_JOBS_PURGE_STRATEGY", "sweep")
    assert PurgeConfig.from_settings(load_settings()).strategy == "sweep"
    clean_env.setenv("CORE_JOBS_PURGE_STRATEGY", "seqscan")
    with pytest.raises(ConfigError, match="CORE_JOBS_PURGE_STRATEGY"):
        load_settings()


# --- durable executions (issue 12) --------------------------------------------------------------
def executions(conn: psycopg.Connection) -> dict[uuid.UUID, str]:
    return dict(conn.execute("SELECT job_id, status FROM core.executions").fetchall())


@BOTH_PATHS
@REPLAY_GUARDS
def test_keeps_a_fence_while_its_job_and_consumer_has_an_execution_not_failed(
    db, conn, now, hashed_pending_limit, strategy
):
    """PENDING, RUNNING, RETRY_WAIT and RECONCILIATION_REQUIRED executions hold their fence; FAILED, or another consumer's, do not."""
    pending, running, waiting, uncertain, failed, elsewhere = add_old_expired_fences(conn, now, 6)
    for job_id, status in ((pending, "PENDING"), (running, "RUNNING"), (waiting, "RETRY_WAIT")):
        add_execution(conn, job_id=job_id, consumer=CONSUMER, status=status)
    add_execution(conn, job_id=uncertain, consumer=CONSUMER)
    add_execution(conn, job_id=failed, consumer=CONSUMER, status="FAILED")
    add_execution(conn, job_id=elsewhere, consumer="points.other")  # same job, another consumer's execution
    result = purger(db, hashed_pending_limit=hashed_pending_limit, strategy=strategy).run_once(now)
    assert remaining(conn) == {pending, running, waiting, uncertain}
    assert (result.num_deleted, result.rows_left) == (2, 0)


TTL = GUARD.ttl


def test_deletes_failed_executions_nothing_needs_once_a_fence_ttl_old(db, conn, now):
    """FAILED more than the fence TTL ago with no dead letter holding a fence: deleted with its checkpoints; the rest kept."""
    old = f"{TTL.days} days 1 minute"
    ids = {
        name: add_execution(conn, status="FAILED", age=age, consumer=CONSUMER, checkpoints=checkpoints)
        for name, age, checkpoints in (
            ("old", old, (("lookup", "READ_ONLY", "SUCCEEDED", {"m": 1}),)),
            ("young", f"{TTL.days - 1} days 23 hours", ()),
            ("pending_letter", old, ()),
            ("outstanding_replay", old, ()),
            ("discarded_letter", old, ()),
            ("other_consumers_letter", old, ()),
        )
    }
    job = dict(conn.execute("SELECT id, job_id FROM core.executions").fetchall())
    add_dead_letter(conn, job_id=job[ids["pending_letter"]])
    add_dead_letter(conn, job_id=job[ids["outstanding_replay"]], status="replayed")
    add_dead_letter(conn, job_id=job[ids["discarded_letter"]], status="discarded")
    add_dead_letters(conn, "points.other", 1, job_id=job[ids["other_consumers_letter"]], consumer="points.other")
    uncertain = add_execution(conn, age=old)  # RECONCILIATION_REQUIRED: never deleted

    result = purger(db).run_once(now)

    kept = {ids["young"], ids["pending_letter"], ids["outstanding_replay"], uncertain}
    assert {r[0] for r in conn.execute("SELECT id FROM core.executions")} == kept
    assert result.executions_deleted == 3
    assert conn.execute("SELECT count(*) FROM core.execution_checkpoints").fetchone()[0] == 0
    assert purger(db).run_once(now).executions_deleted == 0


def test_failed_executions_are_deleted_in_batches(db, conn, now):
    """Batch size 2 and 5 deletable FAILED executions: three statements, all deleted."""
    for _ in range(5):
        add_execution(conn, status="FAILED", age=f"{TTL.days + 1} days")
    result = purger(db, batch_size=2, min_batch_size=1).run_once(now)
    assert result.executions_deleted == 5 and executions(conn) == {}


def test_the_database_refuses_to_delete_an_execution_awaiting_reconciliation(conn):
    """Whatever the statement, a RECONCILIATION_REQUIRED execution cannot be deleted."""
    uncertain = add_execution(conn, age="400 days")
    with pytest.raises(psycopg.errors.CheckViolation, match="only a RUNNING execution"):
        conn.execute("DELETE FROM core.executions WHERE id = %s", (uncertain,))


def test_a_failed_execution_is_kept_a_window_after_its_replay_was_handled(db, conn, now):
    """Its dead letter's replay handled less than margin x window ago keeps it; a second later than that, it goes."""
    failed = add_execution(conn, status="FAILED", age=f"{TTL.days + 1} days", consumer=CONSUMER)
    (job_id,) = conn.execute("SELECT job_id FROM core.executions WHERE id = %s", (failed,)).fetchone()
    letter = add_dead_letter(conn, job_id=job_id, status="replayed")
    assert mark_replay_handled(conn, letter, "dead_lettered")
    handled = handled_at(conn, job_id)
    assert purger(db).run_once(handled + PROTECTED - SECOND).executions_deleted == 0
    assert purger(db).run_once(handled + PROTECTED + SECOND).executions_deleted == 1
    assert executions(conn) == {}


# --- a table without statistics, or with stale ones (a restore, a bulk load, autovacuum behind) ---
# Fences loaded in one statement with autovacuum kept off the table. Never analyzed: the planner
# has no row count (reltuples -1) and no histogram. Stale: analyzed while it held 2 000 fresh
# fences (processed now, expiring within a week), then the expired ones bulk loaded — the
# histograms say no row is old enough to delete, so an index on the time guards looks free.
LOAD_UNANALYZED = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(),
       %(now)s - interval '10 days' + g * interval '1 ms', %(now)s - interval '3 days' + g * interval '1 ms'
  FROM generate_series(1, %(rows)s) AS g"""
LOAD_FRESH = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(), %(now)s, %(now)s + random() * interval '7 days'
  FROM generate_series(1, 2000)"""
STATISTICS = pytest.mark.parametrize("statistics", ["never", "stale"], ids=["never-analyzed", "stale"])


def planner_statistics(conn: psycopg.Connection, table: str) -> tuple[float, int]:
    """The planner's row count of ``core.<table>`` and how many of its columns pg_stats describes."""
    return conn.execute(
        "SELECT c.reltuples, (SELECT count(*) FROM pg_stats WHERE schemaname = 'core' AND tablename = %(t)s)"
        "  FROM pg_class AS c WHERE c.oid = ('core.' || %(t)s)::regclass",
        {"t": table},
    ).fetchone()


def load_unanalyzed_fences(conn: psycopg.Connection, now: datetime, rows: int, statistics: str = "never") -> None:
    """``rows`` expired fences in expiry order, on a table never analyzed or analyzed before the load (``statistics``)."""
    conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
    if statistics == "stale":
        conn.execute(LOAD_FRESH, {"now": now})
        conn.execute("ANALYZE core.processed_jobs")
    conn.execute(LOAD_UNANALYZED, {"now": now, "rows": rows})
    reltuples, described = planner_statistics(conn, "processed_jobs")
    assert (reltuples, described == 0) == ((-1, True) if statistics == "never" else (2000, False))


def plan_nodes(plan: dict) -> Iterator[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


def rows_read(
    conn: psycopg.Connection, statement: str, params: dict, table: str, limits: str = SET_BATCH_LIMITS
) -> tuple[int, set[str]]:
    """Run ``statement`` as the purge sends it (under ``limits``), under EXPLAIN ANALYZE: the rows its scans of ``table`` read (the TID scan of the DELETE aside), and the node types."""
    (explained,) = fetch_limited(conn, "5s", f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params, limits)
    nodes = list(plan_nodes(explained[0]["Plan"]))
    scans = [n for n in nodes if n.get("Relation Name") == table and n["Node Type"] not in ("Tid Scan", "ModifyTable")]
    return sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans), {n["Node Type"] for n in nodes}


@STATISTICS
@REPLAY_GUARDS
def test_an_index_batch_reads_only_its_rows_without_current_statistics(conn, now, hashed_pending_limit, statistics):
    """Never analyzed, or analyzed before 20 000 expired fences were loaded: a 100-row index batch finds its end
    reading 101 entries of the expires_at index, and its DELETE reads the range's 100 rows, no sort of every expired row."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cursor": "-infinity", "cutoff": now, "protected_from": now - PROTECTED, "batch_size": 100}
    read, node_types = rows_read(conn, INDEX_BATCH_END, params, "processed_jobs")
    assert (read, "Sort" in node_types) == (101, False)
    (end,) = fetch_limited(conn, "5s", INDEX_BATCH_END, params)
    read, node_types = rows_read(conn, INDEX_BATCH[guard], params | {"end": end}, "processed_jobs")
    assert (read, "Sort" in node_types) == (100, False)


@STATISTICS
@REPLAY_GUARDS
def test_an_index_batch_inside_a_tie_reads_only_the_tie_without_current_statistics(
    conn, now, hashed_pending_limit, statistics
):
    """Never analyzed, or stale: a 100-row batch among 20 000 fences sharing one expires_at reads 100 rows of them, no sort."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    tied = {"at": now - timedelta(days=1)}  # the 20 000 loaded ones (not the 2 000 fresh ones of "stale")
    conn.execute("UPDATE core.processed_jobs SET expires_at = %(at)s WHERE processed_at < %(at)s", tied)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cursor": now - timedelta(days=1), "cutoff": now, "protected_from": now - PROTECTED, "batch_size": 100}
    read, node_types = rows_read(conn, INDEX_TIED_BATCH[guard], params, "processed_jobs")
    assert (read, "Sort" in node_types) == (100, False)


@STATISTICS
@REPLAY_GUARDS
def test_a_sweep_batch_reads_only_its_blocks_without_current_statistics(conn, now, hashed_pending_limit, statistics):
    """Never analyzed, or analyzed before 20 000 expired fences were loaded: a sweep batch of blocks [40, 50) (~900 rows) reads only those blocks' rows, by a TID range scan."""
    load_unanalyzed_fences(conn, now, 20_000, statistics)
    guard = "hashed" if hashed_pending_limit else "probed"
    params = {"cutoff": now, "protected_from": now - PROTECTED, "from_block": 40, "to_block": 50}
    in_blocks = conn.execute(
        "SELECT count(*) FROM core.processed_jobs WHERE ctid >= '(40,0)'::tid AND ctid < '(50,0)'::tid"
    ).fetchone()[0]
    read, node_types = rows_read(conn, SWEEP_BATCH[guard], params, "processed_jobs")
    assert (read, "Tid Range Scan" in node_types) == (in_blocks, True)
    assert in_blocks > 100


# Executions in their final state, one tuple each, as a restore or a bulk load leaves them: a table
# with no dead versions, as small as its rows. (add_execution's updates leave three dead versions
# per row, and how many of them pruning reclaims depends on the transactions open on the whole
# server at the time: the table's size, which the planner weighs, varied from run to run.)
LOAD_EXECUTIONS = """
ALTER TABLE core.executions DISABLE TRIGGER executions_guard;
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload, status, lease_expires_at, leased_by, takes,
                             reason, reason_action, created_at, status_changed_at)
SELECT gen_random_uuid(), %(consumer)s, %(consumer)s, %(tenant)s, '{"member_id": "m-1", "points": 10}', %(status)s,
       CASE WHEN %(status)s = 'RUNNING' THEN now() + interval '30 seconds' END,
       CASE WHEN %(status)s = 'RUNNING' THEN 'factory' END, 1,
       CASE WHEN %(status)s = 'FAILED' THEN 'notify: the ledger refused the request' END,
       CASE WHEN %(status)s = 'FAILED' THEN 'notify' END,
       now() - %(age)s::interval, now() - %(age)s::interval + g * interval '1 millisecond'
  FROM generate_series(1, %(rows)s) AS g;
ALTER TABLE core.executions ENABLE TRIGGER executions_guard"""


def load_executions(conn: psycopg.Connection, status: str, rows: int, age: str = "0 seconds") -> None:
    """``rows`` executions in ``status``, entered ``age`` ago, one tuple each (LOAD_EXECUTIONS)."""
    params = {"consumer": CONSUMER, "tenant": TENANT, "status": status, "age": age, "rows": rows}
    for statement in LOAD_EXECUTIONS.split(";"):
        conn.execute(statement, params if "%(" in statement else None)


@STATISTICS
def test_a_failed_executions_batch_reads_only_its_rows_without_current_statistics(conn, now, statistics):
    """Never analyzed, or analyzed while it held only 300 live executions, and as compact as a restore leaves it: a 10-row batch of DELETE_FAILED_EXECUTIONS among 300 old FAILED ones reads 10 of them in order, no sort, no scan of the whole table."""
    conn.execute("ALTER TABLE core.executions SET (autovacuum_enabled = false)")
    if statistics == "stale":
        load_executions(conn, "RUNNING", 300)
        conn.execute("ANALYZE core.executions")
    load_executions(conn, "FAILED", 300, age=f"{TTL.days + 1} days")
    assert (planner_statistics(conn, "executions")[0] == -1) == (statistics == "never")
    params = {"failed_before": now - TTL, "protected_from": now - PROTECTED, "batch_size": 10}
    read, node_types = rows_read(conn, DELETE_FAILED_EXECUTIONS, params, "executions", SET_ROW_BATCH_LIMITS)
    assert (read, "Sort" in node_types, "Seq Scan" in node_types) == (10, False, False)


@STATISTICS
@pytest.mark.parametrize("old_keys", [5000, 300], ids=["5000-old", "300-old"])
def test_an_idempotency_keys_batch_reads_only_its_rows_without_current_statistics(conn, now, statistics, old_keys):
    """Never analyzed, or analyzed while it held only 300 recent keys: a 10-row batch of DELETE_EXPIRED_IDEMPOTENCY_KEYS among 5 000 old keys, or 300 (a table of a few blocks), reads 10 rows, no sort, no scan of the whole table."""
    conn.execute("ALTER TABLE core.api_idempotency_keys SET (autovacuum_enabled = false)")
    add_keys = (
        "INSERT INTO core.api_idempotency_keys (idempotency_key, operator, method, route, request_fingerprint,"
        " response_status, response_body, created_at)"
        " SELECT %(prefix)s || g, 'ops:ana@example.com', 'POST', '/v1/core/dead-letters/{id}/replay', 'f', 200, '{}',"
        "        %(created_at)s + g * interval '1 second' FROM generate_series(1, %(rows)s) AS g"
    )
    if statistics == "stale":
        conn.execute(add_keys, {"prefix": "recent-", "created_at": now - timedelta(days=1), "rows": 300})
        conn.execute("ANALYZE core.api_idempotency_keys")
    conn.execute(add_keys, {"prefix": "old-", "created_at": now - timedelta(days=100), "rows": old_keys})
    assert (planner_statistics(conn, "api_idempotency_keys")[0] == -1) == (statistics == "never")
    params = {"kept_from": now - timedelta(days=30), "batch_size": 10}
    read, node_types = rows_read(
        conn, DELETE_EXPIRED_IDEMPOTENCY_KEYS, params, "api_idempotency_keys", SET_ROW_BATCH_LIMITS
    )
    assert (read, "Sort" in node_types, "Seq Scan" in node_types) == (10, False, False)


@pytest.mark.parametrize(
    ("analyzed_shuffled", "expired_share", "strategy"),
    [(True, 0.3, "index"), (False, 0.7, "sweep")],
    ids=["analyzed-shuffled-now-ordered", "analyzed-ordered-now-shuffled"],
)
def test_auto_chooses_from_the_sample_when_the_statistics_are_stale(
    db, conn, now, events, analyzed_shuffled, expired_share, strategy
):
    """Auto, analyzed in one layout then reloaded in the other: the correlation comes from the sample of the rows there now, not from pg_stats (in order 30 % expired: index; shuffled 70 %: sweep)."""
    conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
    analyzed_layout, layout = ("random()", "t.processed_at") if analyzed_shuffled else ("t.processed_at", "random()")
    conn.execute(LOAD_FENCES.format(layout=analyzed_layout), {"rows": 2000, "expired_share": 0.5, "now": now})
    conn.execute("ANALYZE core.processed_jobs")
    conn.execute("DELETE FROM core.processed_jobs")
    conn.execute(LOAD_FENCES.format(layout=layout), {"rows": 3000, "expired_share": expired_share, "now": now})
    stale = conn.execute(
        "SELECT correlation FROM pg_stats WHERE schemaname = 'core' AND tablename = 'processed_jobs'"
        " AND attname = 'expires_at'"
    ).fetchone()[0]
    assert abs(stale) < 0.1 if analyzed_shuffled else stale > 0.9
    result = purger(db, strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.num_deleted) == (strategy, round(3000 * expired_share))
    assert chosen["correlation"] > 0.9 if analyzed_shuffled else abs(chosen["correlation"]) < 0.1


# --- progress of a long run ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["auto", "sweep"])
def test_a_long_run_reports_progress_at_info_every_interval(db, conn, now, logs, strategy):
    """A clock ticking 1 s per reading and a 3 s interval: progress at info with rows deleted, rate and estimate left, not after every batch."""
    load_fences(conn, now, 1000, 0.5, shuffled=False)
    ticks = itertools.count()
    overrides = {"batch_size": 50, "min_batch_size": 50, "progress_interval": timedelta(seconds=3)}
    config = purger(db, strategy=strategy, **overrides).config
    result = Purger(config, db, monotonic=lambda: float(next(ticks))).run_once(now)
    progress = logs.named("maintenance.purge.progress")
    assert 2 <= len(progress) < result.num_batches and result.num_deleted == 500
    assert {e["level"] for e in progress} == {"info"}
    deleted = [e["rows_deleted"] for e in progress]
    assert deleted == sorted(deleted) and deleted[0] > 0
    for event in progress:
        assert event["rate"] == round(event["rows_deleted"] / event["elapsed_s"], 1)
        assert 0 <= event["rows_left_estimate"] <= 1000
        assert event["estimate_left_s"] == round(event["rows_left_estimate"] / event["rate"], 1)


def test_a_short_run_reports_no_progress(db, conn, now, logs):
    """A run that ends within the progress interval logs no progress event (its stop event says it all)."""
    add_old_expired_fences(conn, now, 30)
    purger(db, batch_size=10, min_batch_size=10).run_once(now)
    assert logs.named("maintenance.purge.progress") == []


# --- the operations API's idempotency keys (issue 17) --------------------------------------------
ADD_IDEMPOTENCY_KEY = """
INSERT INTO core.api_idempotency_keys (idempotency_key, operator, method, route, request_fingerprint,
                                       response_status, response_body, created_at)
VALUES (%(key)s, 'ops:ana@example.com', 'POST', '/v1/core/dead-letters/{id}/replay', 'f', 200, '{}', %(created_at)s)"""


RESOLUTION_400_DAYS_AGO = """
INSERT INTO core.execution_resolutions
       (execution_id, job_id, consumer, business_scope, idempotency_key, operator, command, command_body,
        command_fingerprint, evidence_kind, evidence_reference, evidence_reason, checkpoints_before, fencing_token,
        status_after, response_status, response_body, resolved_at)
SELECT id, job_id, consumer, business_scope, 'resolution-key', 'ops:test', 'RESUME', '{}', 'f', 'RESULT_VERIFIED',
       'CASE-1', 'checked', '[]', 1, 'PENDING', 200, '{}', now() - interval '400 days'
  FROM core.executions WHERE id = %(id)s"""


def idempotency_keys(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT idempotency_key FROM core.api_idempotency_keys")}


def test_deletes_idempotency_keys_older_than_the_retention_in_batches(db, conn, now):
    """Keys recorded more than CORE_JOBS_IDEMPOTENCY_KEY_RETENTION before now (a second either side) go, in batches; resolutions stay."""
    retention = timedelta(days=30)
    for i in range(5):
        conn.execute(ADD_IDEMPOTENCY_KEY, {"key": f"old-{i}", "created_at": now - retention - SECOND * (i + 1)})
    conn.execute(ADD_IDEMPOTENCY_KEY, {"key": "young", "created_at": now - retention + SECOND})
    uncertain = add_execution(conn, age="40 days")
    conn.execute(RESOLUTION_400_DAYS_AGO, {"id": uncertain})  # in the append-only ledger: never expires
    result = purger(db, batch_size=2, min_batch_size=1, idempotency_key_retention=retention).run_once(now)
    assert (idempotency_keys(conn), result.idempotency_keys_deleted) == ({"young"}, 5)
    assert conn.execute("SELECT idempotency_key FROM core.execution_resolutions").fetchall() == [("resolution-key",)]


def test_refuses_an_idempotency_key_retention_shorter_than_a_day(clean_env):
    """CORE_JOBS_IDEMPOTENCY_KEY_RETENTION under P1D is refused, naming the setting (a client's retry could run its action twice)."""
    clean_env.setenv("CORE_JOBS_IDEMPOTENCY_KEY_RETENTION", "PT12H")
    with pytest.raises(ConfigError, match="CORE_JOBS_IDEMPOTENCY_KEY_RETENTION"):
        load_settings()
    with pytest.raises(ConfigError, match="CORE_JOBS_IDEMPOTENCY_KEY_RETENTION"):
        Purger(PurgeConfig(guard=GUARD, idempotency_key_retention=timedelta(hours=12)), None)


def test_a_purge_run_exports_one_metric_per_quantity_in_base_units(db, conn, now):
    """A purge of 11 rows in batches of 7 ms and 3 ms sets core_jobs_purge_rows_deleted 11, _batches 2, _longest_batch_seconds 0.007 and _rows_left 0; no core_jobs_job_result is served."""
    from maintenance.jobs.purge.job import SPEC
    from maintenance.service.runner import run_job
    from maintenance.service.telemetry import Telemetry

    add_old_expired_fences(conn, now, 11)
    telemetry = Telemetry()
    purge = Purger(purger(db, batch_size=10).config, db, batch_clock=batch_clock(7, 3), timed_by=on_the_batch_clock)
    run_job(SPEC, purge, db, telemetry)

    value = telemetry.registry.get_sample_value
    labels = {"job_name": "purge"}
    assert value("core_jobs_purge_rows_deleted", labels) == 11
    assert value("core_jobs_purge_batches", labels) == 2
    assert value("core_jobs_purge_longest_batch_seconds", labels) == pytest.approx(0.007)
    assert value("core_jobs_purge_rows_left", labels) == 0
    assert "core_jobs_job_result" not in {family.name for family in telemetry.registry.collect()}
