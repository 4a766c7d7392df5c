"""The purge of the operations API's idempotency keys, and a run's metrics.

Every test runs against a real PostgreSQL. Rows are placed at explicit times on both sides of
each cutoff, relative to PostgreSQL's ``now()`` read once and passed to ``run_once``. No test
sleeps: the time budget uses an injected clock, the statement timeout a row lock. The shared
rows and constants are tests/support/purge_support.py's, the fixtures tests/support/purge_fixtures.py's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError
from support.factories import add_execution
from support.purge_support import (
    ADD_IDEMPOTENCY_KEY,
    RESOLUTION_400_DAYS_AGO,
    SECOND,
    add_old_expired_fences,
    batch_clock,
    idempotency_keys,
    purger,
)

from maintenance.jobs.purge.job import on_the_batch_clock
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.settings import ConfigError, load_settings


def test_deletes_idempotency_keys_older_than_the_retention_in_batches(db, conn, now):
    """Keys recorded more than CORE_JOBS_IDEMPOTENCY_KEY_RETENTION before now (a second either side) go, in batches; resolutions stay."""
    retention = timedelta(days=30)
    for i in range(5):
        conn.execute(ADD_IDEMPOTENCY_KEY, {"key": f"old-{i}", "created_at": now - retention - SECOND * (i + 1)})
    conn.execute(ADD_IDEMPOTENCY_KEY, {"key": "young", "created_at": now - retention + SECOND})
    uncertain = add_execution(conn, age="40 days")
    conn.execute(RESOLUTION_400_DAYS_AGO, {"id": uncertain})  # in the append-only ledger: never expires
    result = purger(db, purge_batch_size=2, purge_min_batch_size=1, idempotency_key_retention=retention).run_once(now)
    assert (idempotency_keys(conn), result.idempotency_keys_deleted) == ({"young"}, 5)
    assert conn.execute("SELECT idempotency_key FROM core.execution_resolutions").fetchall() == [("resolution-key",)]


def test_refuses_an_idempotency_key_retention_shorter_than_a_day(clean_env):
    """CORE_JOBS_IDEMPOTENCY_KEY_RETENTION under P1D is refused, naming the setting (a client's retry could run its action twice)."""
    clean_env.setenv("CORE_JOBS_IDEMPOTENCY_KEY_RETENTION", "PT12H")
    with pytest.raises(ConfigError, match="CORE_JOBS_IDEMPOTENCY_KEY_RETENTION"):
        load_settings()
    with pytest.raises(ValidationError, match=r"idempotency_key_retention\n.*must be at least P1D"):
        PurgeFields(idempotency_key_retention=timedelta(hours=12))


def test_a_purge_run_exports_one_metric_per_quantity_in_base_units(db, conn, now):
    """A purge of 11 rows in batches of 7 ms and 3 ms sets core_jobs_purge_rows_deleted 11, _batches 2, _longest_batch_seconds 0.007 and _rows_left 0; no core_jobs_job_result is served."""
    from maintenance.jobs.purge.job import SPEC
    from maintenance.service.runner import run_job
    from maintenance.service.telemetry import Telemetry

    add_old_expired_fences(conn, now, 11)
    telemetry = Telemetry()
    purge = purger(db, purge_batch_size=10, batch_clock=batch_clock(7, 3), timed_by=on_the_batch_clock)
    run_job(SPEC, purge, db, telemetry)

    value = telemetry.registry.get_sample_value
    labels = {"job_name": "purge"}
    assert value("core_jobs_purge_rows_deleted", labels) == 11
    assert value("core_jobs_purge_batches", labels) == 2
    assert value("core_jobs_purge_longest_batch_seconds", labels) == pytest.approx(0.007)
    assert value("core_jobs_purge_rows_left", labels) == 0
    assert "core_jobs_job_result" not in {family.name for family in telemetry.registry.collect()}
