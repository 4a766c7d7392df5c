"""The purge job: which fences it deletes and keeps, how it batches, steers, stops and is configured.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import psycopg
import pytest
from pydantic import ValidationError
from support.factories import add_dead_letter, add_fence, mark_handled
from support.harness_support import backdate_replay
from support.jobs import env
from support.logcapture import events_in
from support.purge_support import (
    BOTH_PATHS,
    PROTECTED,
    REPLAY_GUARDS,
    SECOND,
    UNHURRIED,
    WINDOW,
    add_old_expired_fences,
    batch_clock,
    batch_sizes,
    handled_at,
    load_fences,
    purger,
    remaining,
    steered,
)

from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE
from maintenance.jobs.purge.job import LOCK_NAME, SLOW_START_BATCH_SIZE, SPEC, Purger, on_the_batch_clock
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.service.runner import job_env
from maintenance.settings import ConfigError, TtlGuard, load_settings


def test_defaults(clean_env):
    """With nothing set: batches aiming at 10 ms from 1 000 up to 50 000 rows (floor 100, halved after 2 timeouts), PT5S timeout, no pause, PT5M budget; the job is built with the settings' TTL guard."""
    settings = load_settings()
    expected = {
        "purge_batch_size": 50_000,
        "purge_min_batch_size": 100,
        "purge_target_batch_duration": timedelta(milliseconds=10),
        "purge_timeouts_before_shrink": 2,
        "purge_statement_timeout": timedelta(seconds=5),
        "purge_batch_pause": timedelta(0),
        "purge_max_runtime": timedelta(minutes=5),
    }
    assert {name: getattr(settings, name) for name in expected} == expected
    assert {name: getattr(PurgeFields(), name) for name in expected} == expected
    assert SLOW_START_BATCH_SIZE == 1000
    assert SPEC.build(settings, job_env(settings, db=None)).guard == settings.ttl_guard()  # building connects nothing


@BOTH_PATHS
def test_deletes_only_expired_fences(db, conn, now, strategy):
    """A fence one second past expires_at is deleted; one expiring a second from now is kept."""
    old = now - timedelta(days=8)
    expired = add_fence(conn, processed_at=old, expires_at=now - SECOND)
    not_yet = add_fence(conn, processed_at=old, expires_at=now + SECOND)
    result = purger(db, purge_strategy=strategy).run_once(now)
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
    result = purger(db, purge_strategy=strategy).run_once(now)
    assert remaining(conn) == {inside}
    assert outside not in remaining(conn)
    assert result.num_deleted == 1


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
    result = purger(db, hashed_pending_limit=hashed_pending_limit, purge_strategy=strategy).run_once(later)
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
    run = purger(db, hashed_pending_limit=hashed_pending_limit, purge_strategy=strategy)
    assert run.run_once(now + timedelta(days=30)).num_deleted == 0
    assert remaining(conn) == {fence}
    assert mark_handled(conn, letter, "duplicate")  # the harness handled the replayed delivery
    handled = handled_at(conn, fence)
    assert run.run_once(handled + PROTECTED - SECOND).num_deleted == 0  # a lost ack may still bring it back
    assert remaining(conn) == {fence}
    assert run.run_once(handled + PROTECTED + SECOND).num_deleted == 1
    assert remaining(conn) == set()


def test_deletes_in_batches_and_a_short_batch_ends_the_run(db, conn, now, events):
    """Index path, batch size 10 and 11 deletable rows: a full batch, then a short one of 1 that ends the run; longest_batch_ms is the longer one."""
    add_old_expired_fences(conn, now, 11)
    kept = add_fence(conn, processed_at=now - timedelta(days=1), expires_at=now + timedelta(days=6))
    purge = purger(db, purge_batch_size=10, batch_clock=batch_clock(7, 3), timed_by=on_the_batch_clock)
    result = purge.run_once(now)
    assert (result.num_deleted, result.num_batches, result.stopped_on_budget) == (11, 2, 0)
    assert [e["num_deleted"] for e in events.named("maintenance.purge.batch_deleted")] == [10, 1]
    assert remaining(conn) == {kept}
    assert result.longest_batch_ms == 7.0  # the first, longer batch, as the batch clock timed it (not the last)


def test_steers_on_the_transaction_time_the_server_measured_not_the_round_trip(db, conn, now, events):
    """Batches whose round trips take 5 s (a starved client) but whose transactions take well under half the 2 s target still double; longest_batch_ms is the server's figure."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    config = PurgeFields(
        purge_strategy="index",
        purge_target_batch_duration=timedelta(seconds=2),
        purge_batch_size=400,
        purge_min_batch_size=10,
    )
    result = Purger(config, env(db), batch_clock=batch_clock(5000), slow_start_batch_size=50).run_once(now)
    assert batch_sizes(events) == [(50, 50), (100, 100), (200, 200), (400, 400), (400, 400), (400, 350)]
    logged = [e["transaction_ms"] for e in events.named("maintenance.purge.batch_deleted")]
    assert result.longest_batch_ms == max(logged) < 1000


def test_starts_slow_and_doubles_up_to_the_largest_batch_while_batches_are_fast(db, conn, now, events):
    """Batches well under the target double from the slow start up to CORE_JOBS_PURGE_BATCH_SIZE, and stay there."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    result = steered(
        db, batch_clock(1), purge_batch_size=400, purge_min_batch_size=10, slow_start_batch_size=50
    ).run_once(now)
    assert batch_sizes(events) == [(50, 50), (100, 100), (200, 200), (400, 400), (400, 400), (400, 350)]
    assert (result.num_deleted, result.batch_size, result.rows_left) == (1500, 400, 0)
    assert remaining(conn) == set()


def test_a_slow_batch_shrinks_the_next_in_proportion(db, conn, now, events):
    """A batch 4x over the target makes the next 4x smaller; one just under the target keeps its size."""
    load_fences(conn, now, 1500, 1.0, shuffled=False)
    # 1 000 rows in 80 ms -> 250; 250 in 40 ms -> 125; then 15 ms, between half the target and the target: kept.
    result = steered(db, batch_clock(80, 40, 15), purge_batch_size=1000).run_once(now)
    # 250 and 125 are full batches for their own limits, though shorter than the largest: the run goes on,
    # and ends with the batch whose range reaches the cutoff (1 500 = 1 000 + 250 + 125 + 125: no empty batch after).
    assert batch_sizes(events) == [(1000, 1000), (250, 250), (125, 125), (125, 125)]
    assert (result.num_deleted, result.batch_size, result.longest_batch_ms) == (1500, 125, 80.0)
    assert remaining(conn) == set()


def test_the_batch_size_stays_between_the_minimum_and_the_largest(db, conn, now, events):
    """A very slow batch shrinks the next only to CORE_JOBS_PURGE_MIN_BATCH_SIZE; fast ones grow it only to the largest."""
    load_fences(conn, now, 1200, 1.0, shuffled=False)
    # 300 rows in 1 s would ask for 6 rows: the floor is 100; then fast: 200, then 400 capped at 300.
    result = steered(db, batch_clock(1000, 1), purge_batch_size=300, purge_min_batch_size=100).run_once(now)
    assert batch_sizes(events) == [(300, 300), (100, 100), (200, 200), (300, 300), (300, 300)]
    assert result.num_deleted == 1200


def test_a_slow_sweep_batch_narrows_the_block_range(db, conn, now, events):
    """Sweep: the steering sizes the block range as it sizes the batch, about batch size / rows per page blocks."""
    load_fences(conn, now, 3000, 1.0, shuffled=True)
    reltuples, relpages = conn.execute(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = 'core.processed_jobs'::regclass"
    ).fetchone()
    rows_per_page = reltuples / relpages
    result = steered(db, batch_clock(40, 15), purge_strategy="sweep", purge_batch_size=800).run_once(now)
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
    result = purger(db, purge_batch_size=5, purge_min_batch_size=1, hashed_pending_limit=hashed_pending_limit).run_once(
        now
    )
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
    run = purger(db, purge_batch_size=10, purge_min_batch_size=1, hashed_pending_limit=hashed_pending_limit)
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
    result = purger(
        db, purge_batch_size=10, purge_min_batch_size=1, hashed_pending_limit=hashed_pending_limit
    ).run_once(now)
    assert remaining(conn) == set(tied[:15])
    assert result.num_deleted == 10 + len(after)
    # up to the instant: none; inside the tie: 10, then none (only held ones left at the instant: past it); the 3 after
    assert [n for _, n in batch_sizes(events)] == [0, 10, 0, 3]


def test_a_held_tie_just_before_the_cutoff_ends_the_walk(db, conn, now, events):
    """Index path, batch 2: 3 fences expiring one microsecond before the cutoff, all inside the retry window (kept): the run ends, it does not loop to its budget."""
    instant = now - timedelta(microseconds=1)
    held = {add_fence(conn, processed_at=now - timedelta(minutes=1), expires_at=instant) for _ in range(3)}
    ticks = itertools.count()  # the budget's clock: one second per reading, so a walk that never ends stops at 300
    run = purger(db, purge_batch_size=2, purge_min_batch_size=1, monotonic=lambda: float(next(ticks)))
    result = run.run_once(now)
    assert remaining(conn) == held
    assert (result.num_deleted, result.stopped_on_budget, result.num_batches) == (0, 0, 2)


def test_pauses_between_batches(db, now, conn):
    """CORE_JOBS_PURGE_BATCH_PAUSE is waited between batches, not after the last."""
    add_old_expired_fences(conn, now, 25)
    pauses: list[float] = []
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=10,
        purge_batch_pause=timedelta(milliseconds=250),
        purge_strategy="index",
    )
    result = Purger(config, env(db, sleep=pauses.append)).run_once(now)
    assert result.num_batches == 3
    assert pauses == [0.25, 0.25]


def test_stops_on_the_time_budget_and_a_second_run_finishes(db, conn, now):
    """Index path: past its budget no batch starts; the run reports rows_left, and the next run deletes them."""
    add_old_expired_fences(conn, now, 25)
    ticks = itertools.count()  # a clock that advances one second per reading
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=10,
        purge_max_runtime=timedelta(seconds=2),
        purge_strategy="index",
    )
    # Readings: 0 sets the deadline at 2; 1 lets the first batch start; 2 is the budget's end.
    first = Purger(config, env(db, monotonic=lambda: float(next(ticks)))).run_once(now)
    assert (first.num_deleted, first.num_batches, first.stopped_on_budget, first.rows_left) == (10, 1, 1, 15)
    assert len(remaining(conn)) == 15
    second = Purger(config, env(db)).run_once(now)
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

    config = PurgeFields(purge_target_batch_duration=UNHURRIED, purge_batch_size=10, purge_strategy="index")
    first = Purger(config, env(db, stop=stop), batch_clock=batch_clock).run_once(now)
    assert (first.num_deleted, first.num_batches, first.stopped_on_signal, first.rows_left) == (10, 1, 1, 15)
    assert first.ok
    second = Purger(config, env(db)).run_once(now)
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
        Purger(PurgeFields(), env(db, guard=short))
    message = str(refused.value)
    assert "CORE_JOBS_PROCESSED_JOBS_TTL=PT15M" in message and "PT10M" in message and "TOO SHORT" in message
    assert len(remaining(conn)) == 3


def test_run_once_purge_exits_2_and_deletes_nothing_when_the_guard_fails(clean_env, database_url, conn, now, capsys):
    """`core-jobs run-once purge` with a TTL below margin x window exits 2, explains, and deletes nothing."""
    add_old_expired_fences(conn, now, 3)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT10M")
    assert main(["run-once", "purge"]) == EXIT_USAGE
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
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=10,
        purge_min_batch_size=2,
        purge_timeouts_before_shrink=2,
        purge_statement_timeout=timedelta(milliseconds=50),
        purge_strategy="index",
    )
    with psycopg.connect(database_url) as other:  # holds a row lock on the 8th fence in expiry order
        other.execute("SELECT 1 FROM core.processed_jobs WHERE job_id = %s FOR UPDATE", (ids[7],))
        result = Purger(config, env(db)).run_once(now)
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
    after = Purger(config, env(db)).run_once(now)  # the lock is gone: the next run starts afresh and finishes
    assert (after.num_deleted, after.batch_size, after.ok) == (3, 10, True)


def test_rows_left_is_minus_one_when_even_counting_times_out(db, conn, now, database_url, events):
    """With the table locked by another session, auto cannot estimate, and the run gives up unable to count."""
    add_old_expired_fences(conn, now, 3)
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=10,
        purge_min_batch_size=10,
        purge_statement_timeout=timedelta(milliseconds=50),
        purge_strategy="auto",
    )
    with psycopg.connect(database_url) as other:
        other.execute("LOCK TABLE core.processed_jobs IN ACCESS EXCLUSIVE MODE")
        result = Purger(config, env(db)).run_once(now)
        other.rollback()
    assert (result.num_deleted, result.num_timeouts, result.gave_up, result.rows_left) == (0, 2, 1, -1)
    assert len(remaining(conn)) == 3
    assert [e["strategy"] for e in events.named("maintenance.purge.estimates_timeout")] == ["index"]


@BOTH_PATHS
def test_can_run_repeatedly(db, conn, now, strategy):
    """A second run over the same state deletes nothing and still succeeds; the kept rows stay."""
    add_old_expired_fences(conn, now, 5)
    fresh = add_fence(conn, processed_at=now - SECOND, expires_at=now + timedelta(days=7))
    first = purger(db, purge_strategy=strategy).run_once(now)
    second = purger(db, purge_strategy=strategy).run_once(now)
    third = purger(db, purge_strategy=strategy).run_once(db.server_now())
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


def test_settings_built_in_code_are_validated_too():
    """PurgeFields built in code with a zero batch size or an unknown strategy is refused, naming the field and the bound."""
    with pytest.raises(ValidationError, match=r"purge_batch_size\n.*greater than or equal to 1"):
        PurgeFields(purge_batch_size=0)
    with pytest.raises(ValidationError, match=r"purge_strategy\n.*'auto', 'index' or 'sweep'"):
        PurgeFields(purge_strategy="seqscan")
