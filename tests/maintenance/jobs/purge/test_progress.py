"""A long purge run reports its progress.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from support.purge_support import add_old_expired_fences, load_fences, purger


# --- progress of a long run ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["auto", "sweep"])
def test_a_long_run_reports_progress_at_info_every_interval(db, conn, now, logs, strategy):
    """A clock ticking 1 s per reading and a 3 s interval: progress at info with rows deleted, rate and estimate left, not after every batch."""
    load_fences(conn, now, 1000, 0.5, shuffled=False)
    ticks = itertools.count()
    overrides = {"purge_batch_size": 50, "purge_min_batch_size": 50, "purge_progress_interval": timedelta(seconds=3)}
    run = purger(db, purge_strategy=strategy, **overrides, monotonic=lambda: float(next(ticks)))
    result = run.run_once(now)
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
    purger(db, purge_batch_size=10, purge_min_batch_size=10).run_once(now)
    assert logs.named("maintenance.purge.progress") == []
