"""The purge's two access paths, and how a run chooses between them.

``maintenance/jobs/purge/__init__.py`` runs the batch loop (transactions, timeouts, budget, lock); this module
says which rows one batch deletes and when the walk is done. Both paths delete exactly the same
rows: every batch statement applies the same guards (``sql.py``).

- ``index``: walks ``processed_jobs_expires_at_idx`` in expiry order, deleting by ``ctid`` and
  carrying a cursor on ``expires_at``. It reads only expired rows, so it is cheap when few have
  expired; but when the rows lie in random physical order, each batch touches thousands of
  scattered pages (measured 72–149 K rows/s, transactions up to 0.5 s, 60 % expired, 2 M rows).
- ``sweep``: walks the heap in ranges of whole blocks (a TID range scan), ``blocks`` ≈ batch
  size / rows per page, carrying the next block number, up to the relation's size at the start
  of the run (rows inserted later are not expired). It reads every page once, in order, whatever
  the layout; wasteful when few rows have expired.

``auto`` decides once per run, before the first batch (``choose``). First it counts the expired fences along
the index, up to the fewest at which the sweep could be estimated cheaper in any layout
(``sweep_floor``): fewer than that — the steady state of a purge run every few minutes — and the run
walks the index, nothing sampled. Otherwise from two cheap estimates:
the fraction of deletable rows in a ``TABLESAMPLE SYSTEM`` of ~1 % of the pages, and the
physical correlation of ``expires_at`` ranked over the same sample, as ANALYZE computes it. Never
from ``pg_stats``: missing before the first ANALYZE, and stale after a bulk load, a reshuffle or
a mass delete (analyzed small then bulk loaded, pg_stats said 0.01 where the rows were in order,
0.95). The choice needs no statistics: ``rows_per_page`` (``pg_class``) scales both estimated
times alike, so it sizes the sweep's block range and the progress estimate, never the choice.
It estimates each path's time from measured per-row costs and takes the cheaper: the sweep
when many rows have expired and the layout is not in expiry order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from maintenance.jobs.purge.sql import (
    EXPIRED_UP_TO,
    INDEX_BATCH,
    INDEX_BATCH_END,
    INDEX_ROWS_LEFT,
    INDEX_TIED_BATCH,
    SAMPLE_ESTIMATES,
    SET_BATCH_LIMITS,
    SWEEP_BATCH,
    SWEEP_ROWS_LEFT,
    TABLE_SIZE,
    TRANSACTION_MS,
)

# --- auto's cost model (measured with bench/purge.py, see docs/performance.md) -------------------
# Sample 1 % of the pages, but at least this many (all of a small table): ~20 000 rows of a
# 2 M-row table in 6-12 ms, enough to tell 1 % expired from 2 %;
MIN_SAMPLED_BLOCKS = 200
# and at most this many (16 MB of random reads), so a huge table's sample stays cheap: 170 000
# rows are plenty for a fraction.
MAX_SAMPLED_BLOCKS = 2_000
# Per-row costs in microseconds, fitted to 2 M fences (23 000 pages, 1.5 x shared_buffers) on this
# 2-core machine; only their ratios matter. The sweep reads and tests every row of the table, then
# deletes the expired ones: 0.44 s with 1 % expired, 0.75 s with 20 %, 1.3-1.6 s with 60 %, in any
# layout.
SWEEP_READ_COST = 0.21  # per row of the table
SWEEP_DELETE_COST = 0.75  # per deleted row
# The index walk costs per deleted row 1.2 us when the rows lie in expiry order (60 % expired:
# 1.45 s), plus a share of scattered-page cost that grows as |correlation| falls: fitted
# (per-row cost - 1.2) / (1 - |correlation|) was 5-9 at 1-60 % expired in random order, 6-15
# with 10-50 % of the rows out of place (correlation 0.5-0.9).
INDEX_DELETE_COST = 1.2
INDEX_SCATTER_COST = 7.0
# The sweep is taken only when estimated at least 10 % faster: near a tie the index walk is the
# better neighbour, reading only expired rows and leaving the cache to the application. So in
# random order the sweep from ~3 % expired (measured even at 2 %, 2x faster at 3-5 %, index 2x
# faster at 1 %); in expiry order only from ~64 % (at 60 %, sweep / index rows/s was 0.95-1.9 over
# six runs, median 1.12: close enough for the index walk's smaller footprint to count).
SWEEP_MARGIN = 0.9
# Rows per page when the planner has no figures yet (never vacuumed or analyzed): the benchmark's
# fences fill 86 to an 8 KB page; longer consumer names fewer.
FALLBACK_ROWS_PER_PAGE = 80.0


@contextmanager
def _in_one_message(
    conn: psycopg.Connection, timeout: str, statements: str, params: dict[str, Any], limits: str
) -> Iterator[psycopg.ClientCursor]:
    """``limits`` then ``statements`` as one message (:func:`fetch_limited` says why); the cursor past the limits' row."""
    assert conn.autocommit, "a purge batch is its own transaction: the connection must be in autocommit"
    with psycopg.ClientCursor(conn) as cursor:
        cursor.execute(f"{limits};\n{statements}", params | {"statement_timeout": timeout})
        cursor.nextset()  # past the limits' row, to the first statement's result
        yield cursor


def fetch_limited(
    conn: psycopg.Connection, timeout: str, query: str, params: dict[str, Any], limits: str = SET_BATCH_LIMITS
) -> tuple:
    """One row of ``query``, run in its own transaction under the batch limits, in one round trip.

    ``limits`` (sql.SET_BATCH_LIMITS or sql.SET_ROW_BATCH_LIMITS) and ``query`` travel as one
    simple-protocol message, the values bound client-side: PostgreSQL runs one message's
    statements as one implicit transaction, so the limits (``set_config(…, true)``) hold for
    exactly this statement's transaction, which commits when the message is done — one round
    trip, where BEGIN, the limits, the statement and COMMIT each waited for an answer (four; on
    the loaded machine each wait cost a scheduling delay: bench/purge_profile.py). A failed
    statement (a timeout) rolls the whole message back and leaves the connection idle. Never a
    prepared statement: after five runs PostgreSQL may switch to a generic plan, and for the batch
    delete one such plan ran 10x slower in the benchmark. ``conn`` must be in autocommit, or the
    message would join the connection's open transaction.
    """
    with _in_one_message(conn, timeout, query, params, limits) as cursor:
        row = cursor.fetchone()
    assert row is not None
    return row


def delete_limited(
    conn: psycopg.Connection, timeout: str, delete: str, params: dict[str, Any], limits: str = SET_BATCH_LIMITS
) -> tuple[int, float]:
    """(rows deleted, the transaction's milliseconds on the server's clock): ``delete`` as one batch, in one round trip.

    As :func:`fetch_limited`, with ``sql.TRANSACTION_MS`` after the DELETE in the same message and
    the same implicit transaction: the count is the DELETE's command tag, the time is read once the
    DELETE is done.
    """
    with _in_one_message(conn, timeout, f"{delete};\n{TRANSACTION_MS}", params, limits) as cursor:
        deleted = cursor.rowcount  # the DELETE's command tag
        cursor.nextset()
        row = cursor.fetchone()
    assert row is not None and deleted >= 0
    return deleted, float(row[0])


# --- the choice -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimates:
    """What ``auto`` looks at; read once per run, before the first batch."""

    table_blocks: int  # the heap's size in blocks at the start of the run
    rows_per_page: float  # reltuples / relpages, or FALLBACK_ROWS_PER_PAGE
    expired_fraction: float | None = None  # deletable rows / rows in the sample (auto only)
    sampled_rows: int | None = None
    # the rank correlation of expires_at with the physical order over the sample, as ANALYZE
    # computes it (None when the sample has fewer than two rows)
    correlation: float | None = None
    # the expired fences counted along the index when fewer than sweep_floor: then nothing is sampled
    expired_rows: int | None = None

    @property
    def rows(self) -> float:
        """The table's rows, estimated: its blocks now at the planner's rows per page."""
        return self.rows_per_page * self.table_blocks

    def deletable_rows(self) -> int | None:
        """The rows counted expired, or the rows the sample says are deletable scaled to the table; None unmeasured."""
        if self.expired_rows is not None:
            return self.expired_rows
        if self.expired_fraction is None:
            return None
        return round(self.expired_fraction * self.rows)

    def seconds(self) -> tuple[float, float]:
        """Auto's estimated run time (index walk, sweep) from the per-row costs above."""
        rows = self.rows
        expired = self.expired_fraction or 0.0
        scatter = 1.0 - min(1.0, abs(self.correlation or 0.0))
        index = rows * expired * (INDEX_DELETE_COST + scatter * INDEX_SCATTER_COST)
        sweep = rows * (SWEEP_READ_COST + expired * SWEEP_DELETE_COST)
        return index / 1e6, sweep / 1e6


def sweep_floor(estimates: Estimates) -> int:
    """The fewest expired rows at which the sweep could be estimated cheaper, in the layout that favours it most
    (random order: each expired row a random page for the index walk); with fewer, ``choose`` would walk the index
    whatever the sample said, so it is not read. From the same per-row costs as :meth:`Estimates.seconds`:
    ``rows x SWEEP_READ_COST + e x SWEEP_DELETE_COST < SWEEP_MARGIN x e x (INDEX_DELETE_COST + INDEX_SCATTER_COST)``.
    """
    per_expired_row = SWEEP_MARGIN * (INDEX_DELETE_COST + INDEX_SCATTER_COST) - SWEEP_DELETE_COST
    return int(estimates.rows * SWEEP_READ_COST / per_expired_row) + 1


def sample_percent(table_blocks: int) -> float:
    """TABLESAMPLE SYSTEM percentage: 1 % of the pages, within [MIN, MAX]_SAMPLED_BLOCKS."""
    if table_blocks <= 0:
        return 100.0
    blocks = min(table_blocks, max(MIN_SAMPLED_BLOCKS, min(MAX_SAMPLED_BLOCKS, table_blocks // 100)))
    return 100.0 * blocks / table_blocks


def read_estimates(conn: psycopg.Connection, timeout: str, params: dict[str, Any], *, sample: bool) -> Estimates:
    """The table's size, and with ``sample`` either the expired rows (fewer than :func:`sweep_floor`, counted along
    the index) or the sample's expired fraction and physical correlation."""
    blocks, reltuples, relpages = fetch_limited(conn, timeout, TABLE_SIZE, {})
    rows_per_page = reltuples / relpages if relpages > 0 and reltuples > 0 else FALLBACK_ROWS_PER_PAGE
    estimates = Estimates(table_blocks=int(blocks), rows_per_page=rows_per_page)
    if not sample:
        return estimates
    cap = sweep_floor(estimates)
    (expired,) = fetch_limited(conn, timeout, EXPIRED_UP_TO, params | {"cap": cap})
    if expired < cap:
        return Estimates(table_blocks=int(blocks), rows_per_page=rows_per_page, expired_rows=int(expired))
    percent = {"percent": sample_percent(blocks)}
    sampled, expired, correlation = fetch_limited(conn, timeout, SAMPLE_ESTIMATES, params | percent)
    return Estimates(
        table_blocks=int(blocks),
        rows_per_page=rows_per_page,
        expired_fraction=expired / sampled if sampled else 0.0,
        sampled_rows=int(sampled),
        correlation=None if correlation is None else float(correlation),
    )


def choose(setting: str, estimates: Estimates) -> tuple[str, str]:
    """(strategy, reason): the setting when it names one, else the path auto estimates cheaper."""
    if setting != "auto":
        return setting, "set by CORE_JOBS_PURGE_STRATEGY"
    if estimates.expired_rows is not None:
        return "index", (
            f"few expired: {estimates.expired_rows} fences, fewer than the {sweep_floor(estimates)} from which"
            " the sweep could be cheaper (not sampled)"
        )
    if estimates.correlation is None:
        return "index", "no correlation: the sample has fewer than two rows"
    index_s, sweep_s = estimates.seconds()
    strategy = "sweep" if sweep_s < SWEEP_MARGIN * index_s else "index"
    return strategy, f"{strategy} estimated cheaper: index {index_s:.3f} s, sweep {sweep_s:.3f} s"


# --- the walks ------------------------------------------------------------------------------------
class IndexWalk:
    """Expiry order through the expires_at index, in ranges of at most ``batch_size`` fences; done at the cutoff.

    A batch first reads where its range ends (``sql.INDEX_BATCH_END``: the (batch_size + 1)-th
    fence's expires_at from the cursor, or the cutoff), then deletes the deletable fences of
    [cursor, end) in its own transaction; the next batch starts at ``end``. When more than
    ``batch_size`` fences expire at the cursor's instant, no range ends inside them:
    ``sql.INDEX_TIED_BATCH`` deletes them ``batch_size`` at a time, and once one such batch comes
    back short the walk moves past the instant (one microsecond, timestamptz's resolution).
    """

    name = "index"

    def __init__(self, guard: str, deletable: int | None) -> None:
        self._delete = INDEX_BATCH[guard]
        self._delete_tied = INDEX_TIED_BATCH[guard]
        self._deletable = deletable  # estimated at the start (auto's sample), for progress
        self.cursor: datetime | None = None  # every fence expiring before it is handled (None: -infinity)
        self.done = False

    def rows_left_estimate(self, deleted: int) -> int | None:
        """Deletable rows left, for progress: the start's estimate less what was deleted (None unsampled)."""
        return None if self._deletable is None else max(0, self._deletable - deleted)

    @property
    def _from(self) -> datetime | str:
        """The cursor as the statements' ``cursor`` parameter."""
        return "-infinity" if self.cursor is None else self.cursor

    def batch(self, conn: psycopg.Connection, timeout: str, params: dict[str, Any], batch_size: int) -> dict[str, Any]:
        """Delete one batch; returns the batch's log fields (``num_deleted`` first, ``transaction_ms`` as the server timed it)."""
        at = params | {"cursor": self._from, "batch_size": batch_size}
        (end,) = fetch_limited(conn, timeout, INDEX_BATCH_END, at)
        if self.cursor is None or end > self.cursor:
            deleted, transaction_ms = delete_limited(conn, timeout, self._delete, at | {"end": end})
            self.cursor = end
            self.done = end >= params["cutoff"]
        else:  # more than batch_size fences expire at the cursor's instant
            deleted, transaction_ms = delete_limited(conn, timeout, self._delete_tied, at)
            if deleted < batch_size:  # the tie's deletable fences are gone: past the instant
                self.cursor = end + timedelta(microseconds=1)
                self.done = self.cursor >= params["cutoff"]  # a tie one microsecond before the cutoff was the last
        return {"num_deleted": deleted, "transaction_ms": round(transaction_ms, 3)}

    def count_left(self, conn: psycopg.Connection, timeout: str, params: dict[str, Any], cap: int) -> int:
        return int(fetch_limited(conn, timeout, INDEX_ROWS_LEFT, params | {"cursor": self._from, "cap": cap})[0])


class BlockSweep:
    """Physical order in ranges of whole blocks; done when the next block is past the end."""

    name = "sweep"

    def __init__(self, guard: str, estimates: Estimates) -> None:
        self._delete = SWEEP_BATCH[guard]
        self._rows_per_page = estimates.rows_per_page
        self.end_block = estimates.table_blocks
        self.next_block = 0
        self.done = False

    def rows_left_estimate(self, deleted: int) -> int | None:
        """Deletable rows left, for progress: the rate so far per block, over the blocks not reached."""
        if self.next_block <= 0:
            return None
        return round(deleted * max(0, self.end_block - self.next_block) / self.next_block)

    def blocks(self, batch_size: int) -> int:
        """Blocks per batch: about ``batch_size`` rows, at least one block."""
        return max(1, round(batch_size / self._rows_per_page))

    def batch(self, conn: psycopg.Connection, timeout: str, params: dict[str, Any], batch_size: int) -> dict[str, Any]:
        """Delete one batch; returns the batch's log fields (``num_deleted`` first, ``transaction_ms`` as the server timed it)."""
        to_block = self.next_block + self.blocks(batch_size)
        deleted, transaction_ms = delete_limited(
            conn, timeout, self._delete, params | {"from_block": self.next_block, "to_block": to_block}
        )
        fields = {
            "num_deleted": deleted,
            "transaction_ms": round(transaction_ms, 3),
            "from_block": self.next_block,
            "to_block": to_block,
        }
        self.next_block = to_block
        self.done = to_block >= self.end_block
        return fields

    def count_left(self, conn: psycopg.Connection, timeout: str, params: dict[str, Any], cap: int) -> int:
        return int(
            fetch_limited(conn, timeout, SWEEP_ROWS_LEFT, params | {"from_block": self.next_block, "cap": cap})[0]
        )
