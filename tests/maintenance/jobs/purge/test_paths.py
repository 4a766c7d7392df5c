"""The purge's two access paths (the index walk and the block sweep) and auto's choice between them.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from support.jobs import env
from support.purge_support import (
    LOAD_FENCES,
    PROTECTED,
    REPLAY_GUARDS,
    UNHURRIED,
    add_mixed_fences,
    expected_after_purge,
    load_fences,
    purger,
    remaining,
    table_blocks,
)
from support.round_trips import protocol_trace

from maintenance.jobs.purge import paths
from maintenance.jobs.purge.job import Purger
from maintenance.jobs.purge.paths import BlockSweep, Estimates, IndexWalk, choose, sample_percent, sweep_floor
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.jobs.purge.sql import EXPIRED_UP_TO, SAMPLE_ESTIMATES
from maintenance.settings import ConfigError, load_settings


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
        result = purger(
            db, purge_strategy=strategy, purge_batch_size=100, hashed_pending_limit=hashed_pending_limit
        ).run_once(now)
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
    result = purger(db, purge_strategy="sweep", purge_batch_size=200).run_once(now)
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
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=200,
        purge_max_runtime=timedelta(seconds=2),
        purge_strategy="sweep",
    )
    first = Purger(config, env(db, monotonic=lambda: float(next(ticks)))).run_once(now)
    assert (first.num_batches, first.stopped_on_budget, first.used_sweep) == (1, 1, 1)
    assert 0 < first.num_deleted < 1000
    assert first.rows_left == 1000 - first.num_deleted == len(remaining(conn))
    second = Purger(config, env(db)).run_once(now)
    assert (second.num_deleted, second.stopped_on_budget, second.rows_left) == (1000 - first.num_deleted, 0, 0)
    assert remaining(conn) == set()


def test_sweep_statement_timeouts_shrink_the_block_range(db, conn, now, database_url, events):
    """Sweep: timeouts halve the batch and with it the blocks per batch, down to one block, then it gives up."""
    load_fences(conn, now, 1000, 1.0, shuffled=False)
    locked_block = 3
    config = PurgeFields(
        purge_target_batch_duration=UNHURRIED,
        purge_batch_size=400,
        purge_min_batch_size=50,
        purge_timeouts_before_shrink=1,
        purge_statement_timeout=timedelta(milliseconds=50),
        purge_strategy="sweep",
    )
    with psycopg.connect(database_url) as other:  # a row lock in block 3
        other.execute(
            "SELECT 1 FROM core.processed_jobs WHERE ctid >= %s::tid AND ctid < %s::tid LIMIT 1 FOR UPDATE",
            (f"({locked_block},0)", f"({locked_block + 1},0)"),
        )
        result = Purger(config, env(db)).run_once(now)
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
    result = purger(db, purge_strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], chosen["setting"], result.used_sweep) == ("sweep", "auto", 1)
    assert abs(chosen["correlation"]) < 0.1
    assert chosen["expired_fraction"] == 0.7  # a small table is sampled whole
    assert chosen["estimated_sweep_s"] < chosen["estimated_index_s"]
    assert result.num_deleted == 2100


def test_auto_walks_the_index_on_a_table_in_expiry_order(db, conn, now, events):
    """Auto: rows in expiry order, 30 % expired (past the count that skips the sample): sampled, it walks the index."""
    load_fences(conn, now, 3000, 0.3, shuffled=False)
    result = purger(db, purge_strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.used_sweep) == ("index", 0)
    assert chosen["reason"].startswith("index estimated cheaper")
    assert (chosen["expired_fraction"], chosen["expired_rows"]) == (0.3, None)
    assert result.num_deleted == 900


def test_auto_walks_the_index_without_a_sample_when_few_fences_have_expired(db, conn, now, events, monkeypatch):
    """Auto, 1 % expired in random order (the steady state): the expired fences, counted along the index, are fewer
    than the sweep could ever win with; it walks the index and reads no sample (no TABLESAMPLE statement is sent)."""
    load_fences(conn, now, 3000, 0.01, shuffled=True)
    sent: list[str] = []
    real = paths.fetch_limited
    monkeypatch.setattr(
        paths, "fetch_limited", lambda c, t, query, *a, **k: sent.append(query) or real(c, t, query, *a, **k)
    )
    result = purger(db, purge_strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], result.used_sweep, result.num_deleted) == ("index", 0, 30)
    assert (chosen["expired_rows"], chosen["sampled_rows"], chosen["expired_fraction"], chosen["correlation"]) == (
        30,
        None,
        None,
        None,
    )
    assert chosen["reason"].startswith("few expired: 30 fences, fewer than the ")
    assert SAMPLE_ESTIMATES not in sent and EXPIRED_UP_TO in sent


def test_auto_walks_the_index_on_an_empty_table_never_analyzed(db, conn, now, events):
    """Auto: never analyzed and empty, no fence has expired: it takes the index walk, samples nothing, deletes nothing."""
    result = purger(db, purge_strategy="auto").run_once(now)
    (chosen,) = events.named("maintenance.purge.strategy_chosen")
    assert (chosen["strategy"], chosen["expired_rows"], result.num_deleted) == ("index", 0, 0)
    assert (chosen["estimated_index_s"], chosen["estimated_sweep_s"], chosen["sampled_rows"]) == (None, None, None)
    assert chosen["reason"].startswith("few expired: 0 fences")


@pytest.mark.parametrize("rows_per_page", [86.0, 20.0])
@pytest.mark.parametrize("table_blocks", [35, 23_000, 1_200_000])
def test_the_count_that_skips_the_sample_is_the_fewest_expired_the_sweep_could_win_with(table_blocks, rows_per_page):
    """sweep_floor is exact against choose's own estimate in the layout most in the sweep's favour (random order):
    one expired row fewer, the index walk; at the floor, the sweep."""
    floor = sweep_floor(Estimates(table_blocks=table_blocks, rows_per_page=rows_per_page))

    def chosen(expired: int) -> str:
        rows = table_blocks * rows_per_page
        estimates = Estimates(
            table_blocks=table_blocks, rows_per_page=rows_per_page, expired_fraction=expired / rows, correlation=0.0
        )
        return choose("auto", estimates)[0]

    assert (chosen(floor - 1), chosen(floor)) == ("index", "sweep")


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
    result = purger(db, purge_strategy="auto").run_once(now)
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
    assert load_settings().purge_strategy == "auto"
    clean_env.setenv("CORE_JOBS_PURGE_STRATEGY", "sweep")
    assert load_settings().purge_strategy == "sweep"
    clean_env.setenv("CORE_JOBS_PURGE_STRATEGY", "seqscan")
    with pytest.raises(ConfigError, match="CORE_JOBS_PURGE_STRATEGY"):
        load_settings()
