"""`core-jobs serve` outlives its database (maintenance/service/scheduler.py): a run whose database went away — cut
off before it starts, or its backend terminated mid-run — fails that run, recorded as any failed run, while the
service stays up; the next run connects afresh and succeeds. Real scheduler threads, the TCP proxy, PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from support.logcapture import events_in
from support.tcp_proxy import TcpProxy, proxy_of, through
from support.waiting import wait_until

from maintenance.runtime.db import APPLICATION_NAME, Database
from maintenance.service.runner import build_jobs, job_env
from maintenance.service.scheduler import JobScheduler
from maintenance.service.telemetry import Telemetry
from maintenance.settings import Settings


@pytest.fixture
def proxy(database_url) -> Iterator[TcpProxy]:
    with proxy_of(database_url) as proxy:
        yield proxy


class Service:
    """The scheduler of ``serve`` with its metrics job on ``url``, run by hand one run at a time (real threads)."""

    def __init__(self, url: str) -> None:
        settings = Settings(database_url=url)
        db = Database(settings.conninfo())
        self.telemetry = Telemetry()
        self.jobs = JobScheduler(
            settings, db, build_jobs(settings, job_env(settings, db), ["metrics"]), telemetry=self.telemetry
        )
        self.jobs.start()

    def runs(self, outcome: str) -> float:
        sample = {"job_name": "metrics", "outcome": outcome}
        return self.telemetry.registry.get_sample_value("core_jobs_job_runs_total", sample) or 0

    def start_run(self) -> None:
        self.jobs.scheduler.get_job("metrics").modify(next_run_time=datetime.now(UTC))

    def run(self) -> bool:
        """One run now, waited for; whether it succeeded."""
        before = self.runs("success") + self.runs("failure")
        self.start_run()
        wait_until(lambda: self.runs("success") + self.runs("failure") > before, timeout=60, what="the run finished")
        return self.telemetry.last_runs["metrics"].ok

    def healthy(self) -> bool:
        ok, body = self.jobs.health()
        return ok and body["status"] == "ok"


@pytest.fixture
def service(database_url, proxy) -> Iterator[Service]:
    service = Service(through(database_url, proxy))
    yield service
    service.jobs.stop()


def test_a_run_while_the_database_is_unreachable_fails_the_service_stays_up_and_the_next_run_succeeds(
    service, proxy, logs
):
    """serve never gives up (docs/deployment.md): the failed run is logged and counted — what alerts — and the
    scheduler and /healthz stay up for the next one."""
    assert service.run() is True
    proxy.cut()
    assert service.run() is False
    assert service.healthy()
    assert service.jobs.health()[1]["jobs"]["metrics"]["last_run"]["error"]
    errors = [event for event in events_in(logs.text) if event["event"].endswith(".error")]
    assert len(errors) == 1 and errors[0]["job"] == "metrics", errors
    assert "OperationalError" in errors[0]["error"], errors  # the database's, said as such
    proxy.restore()
    assert service.run() is True
    assert (service.runs("success"), service.runs("failure")) == (2, 1)


def test_a_run_whose_backend_is_terminated_mid_run_fails_and_the_next_run_succeeds(service, conn, database_url):
    with psycopg.connect(database_url) as blocker:
        blocker.execute("SELECT 1 FROM core.metrics_watermark FOR UPDATE")  # the run waits on this row
        before = service.runs("failure")
        service.start_run()
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND wait_event_type = 'Lock'"
        )
        (pid,) = wait_until(lambda: conn.execute(waiting, (APPLICATION_NAME,)).fetchone(), what="the run waiting")
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(lambda: service.runs("failure") > before, what="the run failed")
        blocker.rollback()
    assert service.healthy()
    assert service.run() is True
