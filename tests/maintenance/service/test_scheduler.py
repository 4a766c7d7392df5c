"""`core-jobs serve` (issue 5): cron per job, coalescing and misfire grace, /healthz and /metrics, SIGTERM."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from apscheduler.executors.debug import DebugExecutor
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger
from freezegun import freeze_time
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from support.jobs import env
from support.waiting import wait_until

from maintenance.cli import main
from maintenance.cli.jobs import after_run_hooks
from maintenance.errors import EXIT_USAGE
from maintenance.jobs.base import JobSpec
from maintenance.jobs.metrics.job import MetricsJob
from maintenance.jobs.metrics.settings import MetricsFields
from maintenance.service.http import make_server, serve_in_background
from maintenance.service.runner import build_jobs, job_env, run_job
from maintenance.service.scheduler import JobScheduler
from maintenance.service.telemetry import Telemetry
from maintenance.settings import ConfigError, Settings

PROMTOOL = "/usr/bin/promtool"

START = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)


class SteppedScheduler(BaseScheduler):
    """An APScheduler that never waits: the test calls step() at each (frozen) instant."""

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait)

    def wakeup(self) -> None:  # nothing sleeps, so nothing to wake
        pass

    def step(self) -> None:
        self._process_jobs()


def stepped() -> SteppedScheduler:
    return SteppedScheduler(timezone=UTC, executors={"default": DebugExecutor()})


class Recorder:
    """A job that records the instants it ran at (the scheduler's behaviour is what is under test)."""

    def __init__(self) -> None:
        self.ran_at: list[datetime] = []

    def run_once(self, now: datetime) -> Recorder:
        self.ran_at.append(datetime.now(UTC))
        return self

    ok = True

    def fields(self) -> dict[str, int]:
        return {"num_runs": len(self.ran_at)}


def recorder_spec(name: str) -> tuple[JobSpec[BaseModel], Recorder]:
    job = Recorder()
    return JobSpec(
        name=name,
        summary="records",
        settings=BaseModel,
        build=lambda _fields, _env: job,
        zero_fields=lambda: {"num_runs": 0},
    ), job


def fire_times(cron: str, start: datetime, end: datetime) -> list[datetime]:
    trigger = CronTrigger.from_crontab(cron, timezone=UTC)
    times, previous, now = [], None, start
    while (fire := trigger.get_next_fire_time(previous, now)) and fire <= end:
        times.append(fire)
        previous, now = fire, fire
    return times


def test_serve_runs_every_registered_job_on_its_own_schedule(db, database_url):
    """Over 30 frozen minutes, each registered job runs exactly at the fire times of its crontab setting."""
    settings = Settings(
        database_url=database_url,
        schedule_metrics="*/2 * * * *",
        schedule_purge="*/15 * * * *",
        schedule_alerts="*/5 * * * *",
    )
    telemetry = Telemetry()
    built = build_jobs(settings, job_env(settings, db))
    end = START + timedelta(minutes=30)
    with freeze_time(START) as clock:
        jobs = JobScheduler(settings, db, built, scheduler=stepped(), telemetry=telemetry)
        jobs.start()
        while datetime.now(UTC) < end:
            clock.tick(timedelta(minutes=1))
            jobs.scheduler.step()
        jobs.stop()

    assert [spec.name for spec, _ in built]  # at least the metrics job is registered
    for spec, _job in built:
        expected = len(fire_times(settings.schedule_of(spec.name), START, end))
        ran = telemetry.registry.get_sample_value(
            "core_jobs_job_runs_total", {"job_name": spec.name, "outcome": "success"}
        )
        assert ran == expected, spec.name
    assert (
        telemetry.registry.get_sample_value("core_jobs_job_runs_total", {"job_name": "metrics", "outcome": "success"})
        == 15
    )


def test_each_job_keeps_its_own_cron_in_one_scheduler(db, database_url):
    """purge every 15 min, alerts every 5 and metrics every minute fire at their own instants, side by side."""
    settings = Settings(database_url=database_url)
    (purge, purged), (alerts, alerted) = recorder_spec("purge"), recorder_spec("alerts")
    metrics = JobSpec(name="metrics", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {})
    telemetry = Telemetry()
    with freeze_time(START) as clock:
        jobs = JobScheduler(
            settings,
            db,
            [(purge, purged), (alerts, alerted), (metrics, MetricsJob(MetricsFields(), env(db)))],
            scheduler=stepped(),
            telemetry=telemetry,
        )
        jobs.start()
        for _ in range(16):
            clock.tick(timedelta(minutes=1))
            jobs.scheduler.step()
        jobs.stop()

    # Ticks land 30 s after each minute: a job runs at the first tick after its fire time.
    assert purged.ran_at == [START + timedelta(minutes=15)]
    assert alerted.ran_at == [START + timedelta(minutes=m) for m in (5, 10, 15)]
    assert (
        telemetry.registry.get_sample_value("core_jobs_job_runs_total", {"job_name": "metrics", "outcome": "success"})
        == 16
    )


MINUTE = START.replace(second=0)


def run_after_a_pause(db, database_url, grace: str, resume_at: datetime) -> Recorder:
    """A metrics-like job scheduled every minute, with the scheduler paused from START to ``resume_at``."""
    settings = Settings(database_url=database_url, scheduler_misfire_grace=grace)
    spec, job = recorder_spec("metrics")
    with freeze_time(START) as clock:
        jobs = JobScheduler(settings, db, [(spec, job)], scheduler=stepped(), telemetry=Telemetry())
        jobs.start()
        clock.move_to(resume_at)
        jobs.scheduler.step()
        jobs.stop()
    return job


def test_missed_runs_within_the_grace_are_coalesced_into_one(db, database_url):
    """Three fire times missed while the process was busy, all within the grace, give one run, not three."""
    resume_at = MINUTE + timedelta(minutes=3, seconds=30)  # 12:01, :02, :03 due, the oldest 150 s ago
    assert run_after_a_pause(db, database_url, "PT5M", resume_at).ran_at == [resume_at]


def test_a_run_later_than_the_misfire_grace_is_skipped_and_logged(db, database_url, logs):
    """A fire time 50 s past with a 45 s grace does not run, and maintenance.scheduler.missed names it."""
    resume_at = MINUTE + timedelta(minutes=1, seconds=50)  # 12:01 is 50 s late
    assert run_after_a_pause(db, database_url, "PT45S", resume_at).ran_at == []
    missed = logs.named("maintenance.scheduler.missed")
    assert [(e["job"], e["scheduled_at"]) for e in missed] == [("metrics", (MINUTE + timedelta(minutes=1)).isoformat())]


class Blocking(Recorder):
    """A job whose run lasts until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()

    def run_once(self, now: datetime) -> Recorder:
        super().run_once(now)
        self.started.set()
        assert self.release.wait(timeout=30)
        return self


def test_a_run_due_while_the_previous_one_still_runs_is_skipped_and_logged(db, database_url, logs):
    """max_instances=1: the 12:02 run of a job still busy with its 12:01 run is skipped (maintenance.scheduler.skipped)."""
    settings = Settings(database_url=database_url)
    job = Blocking()
    spec = JobSpec(
        name="metrics",
        summary="",
        settings=BaseModel,
        build=lambda _fields, _env: job,
        zero_fields=lambda: {"num_runs": 0},
    )
    scheduler = SteppedScheduler(timezone=UTC, executors={"default": ThreadPoolExecutor(2)})
    with freeze_time(START) as clock:
        jobs = JobScheduler(settings, db, [(spec, job)], scheduler=scheduler, telemetry=Telemetry())
        jobs.start()
        clock.move_to(MINUTE + timedelta(minutes=1, seconds=1))
        jobs.scheduler.step()
        assert job.started.wait(timeout=30)  # the 12:01 run is in hand, in its own thread
        clock.move_to(MINUTE + timedelta(minutes=2, seconds=1))
        jobs.scheduler.step()
        job.release.set()
        jobs.stop()

    assert len(job.ran_at) == 1
    skipped = logs.named("maintenance.scheduler.skipped")
    assert [(e["job"], e["scheduled_at"]) for e in skipped] == [
        ("metrics", (MINUTE + timedelta(minutes=2)).isoformat())
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CORE_JOBS_SCHEDULE_METRICS", "61 * * * *"),
        ("CORE_JOBS_SCHEDULE_PURGE", "*/15 * * *"),
        ("CORE_JOBS_SCHEDULE_ALERTS", "0 9 * * 1"),
        ("CORE_JOBS_SCHEDULER_MISFIRE_GRACE", "PT0S"),
        ("CORE_JOBS_HTTP_PORT", "70000"),
    ],
)
def test_invalid_cron_exits_2_naming_the_setting(clean_env, database_url, capsys, name, value):
    """`core-jobs serve` with a bad crontab (or grace, or port) exits 2 at start and names the setting."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv(name, value)
    assert main(["serve"]) == EXIT_USAGE
    assert name in capsys.readouterr().err


def test_a_job_without_a_schedule_setting_is_a_configuration_error():
    """A registered job with no CORE_JOBS_SCHEDULE_<JOB> setting stops serve with the setting to add."""
    with pytest.raises(ConfigError, match="CORE_JOBS_SCHEDULE_REINDEX"):
        Settings().schedule_of("reindex")


def test_healthz_and_metrics_answer_over_a_real_socket(db, database_url):
    """/healthz is 200 with each job's last run while the scheduler runs, 503 after; /metrics is Prometheus text."""
    settings = Settings(database_url=database_url)
    telemetry = Telemetry()
    jobs = JobScheduler(
        settings, db, build_jobs(settings, job_env(settings, db), ["metrics"]), scheduler=stepped(), telemetry=telemetry
    )
    server = make_server("127.0.0.1", 0, health=jobs.health, registry=telemetry.registry)
    serve_in_background(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with freeze_time(START) as clock:
            jobs.start()
            clock.tick(timedelta(minutes=1))
            jobs.scheduler.step()
        health = httpx.get(f"{base}/healthz")
        metrics = httpx.get(f"{base}/metrics")
        missing = httpx.get(f"{base}/nope")
        jobs.stop()
        stopped = httpx.get(f"{base}/healthz")
    finally:
        server.shutdown()
        server.server_close()

    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert body["jobs"]["metrics"]["last_run"]["ok"] is True
    assert body["jobs"]["metrics"]["schedule"] == "* * * * *"
    assert metrics.status_code == 200
    names = {f.name for f in text_string_to_metric_families(metrics.text)}
    assert {"core_jobs_job_runs", "core_jobs_successes", "core_jobs_dead_letters_pending"} <= names
    assert missing.status_code == 404
    assert stopped.status_code == 503


class Leaky:
    """A job that fails with an error quoting a secret (as a driver or HTTP library might)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def run_once(self, now: datetime) -> Recorder:
        raise RuntimeError(f"request with Authorization: {self.secret} failed")


def test_healthz_never_shows_a_secret_from_a_job_error(db, database_url):
    """A job error quoting the API token, the heartbeat URL or the database password reaches /healthz masked."""
    token, heartbeat = "bs-token-5e1f09c2", "https://uptime.example/api/v1/heartbeat/hb-token-77aa"
    password_url = database_url.replace("postgresql://postgres@", "postgresql://postgres:pw-9c1d3e@")
    settings = Settings(database_url=database_url, betterstack_api_token=token, betterstack_heartbeat_url=heartbeat)
    spec = JobSpec(
        name="alerts", summary="", settings=BaseModel, build=lambda _fields, _env: None, zero_fields=lambda: {}
    )
    telemetry = Telemetry()
    with freeze_time(START) as clock:
        jobs = JobScheduler(
            settings,
            db,
            [(spec, Leaky(f"{token} {heartbeat}/fail {password_url}"))],
            scheduler=stepped(),
            telemetry=telemetry,
        )
        jobs.start()
        clock.tick(timedelta(minutes=5))
        jobs.scheduler.step()
        _ok, body = jobs.health()
        jobs.stop()

    error = body["jobs"]["alerts"]["last_run"]["error"]
    assert error.startswith("RuntimeError: request with Authorization: ***")
    for secret in (token, "hb-token-77aa", "pw-9c1d3e"):
        assert secret not in json.dumps(body)


def test_serve_pings_the_heartbeat_after_each_run(db, database_url, fake_bs):
    """With a heartbeat URL, every scheduled run pings it (its /fail form after a failed run), as run-once does:
    the hooks are the composition root's, as `core-jobs serve` builds them."""
    settings = Settings(
        database_url=database_url, betterstack_heartbeat_url=fake_bs.heartbeat_url(), schedule_alerts="*/2 * * * *"
    )
    (metrics, _), alerts = (
        recorder_spec("metrics"),
        JobSpec(
            name="alerts", summary="", settings=BaseModel, build=lambda _fields, _env: None, zero_fields=lambda: {}
        ),
    )
    with freeze_time(START) as clock:
        telemetry = Telemetry()
        jobs = JobScheduler(
            settings,
            db,
            [(metrics, Recorder()), (alerts, Leaky("boom"))],
            scheduler=stepped(),
            telemetry=telemetry,
            after_run=after_run_hooks(settings, telemetry),
        )
        jobs.start()
        clock.tick(timedelta(minutes=1))  # 12:01:30: metrics
        jobs.scheduler.step()
        clock.tick(timedelta(minutes=1))  # 12:02:30: metrics and alerts, which fails
        jobs.scheduler.step()
        jobs.stop()

    token_path = fake_bs.heartbeat_url().removeprefix(fake_bs.url)
    assert sorted((p.path, p.body) for p in fake_bs.heartbeats) == [
        (token_path, "core-jobs serve: ok (metrics)"),
        (token_path, "core-jobs serve: ok (metrics)"),
        (token_path + "/fail", "core-jobs serve: 1 of 1 jobs failed: alerts"),
    ]


def test_shutdown_lets_the_run_in_hand_finish(db, database_url, conn):
    """stop() stops scheduling at once but returns only after the running job has finished, successfully."""
    settings = Settings(database_url=database_url)
    telemetry = Telemetry()
    jobs = JobScheduler(
        settings, db, build_jobs(settings, job_env(settings, db), ["metrics"]), telemetry=telemetry
    )  # real threads
    with psycopg.connect(database_url) as blocker:
        blocker.execute("SELECT 1 FROM core.metrics_watermark FOR UPDATE")  # the run will wait on this row
        jobs.start()
        jobs.scheduler.get_job("metrics").modify(next_run_time=datetime.now(UTC))
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'core-jobs' AND wait_event_type = 'Lock'"
                ).fetchone()[0]
                == 1
            )
        )
        stopping = threading.Thread(target=jobs.stop)
        stopping.start()
        wait_until(lambda: not jobs.scheduler.running)
        assert stopping.is_alive() and "metrics" not in telemetry.last_runs  # still waiting for the run
        blocker.commit()
    stopping.join(timeout=30)
    assert not stopping.is_alive()
    assert telemetry.last_runs["metrics"].ok is True


def test_sigterm_stops_serve_and_exits_0(database_url):
    """A `core-jobs serve` process answers /healthz, and on SIGTERM logs stopping/stopped and exits 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_") or k == "CORE_JOBS_TEST_DATABASE_URL"}
    env |= {
        "CORE_JOBS_DATABASE_URL": database_url,
        "CORE_JOBS_HTTP_HOST": "127.0.0.1",
        "CORE_JOBS_HTTP_PORT": "0",
        "CORE_JOBS_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "maintenance", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = read_event(proc, "maintenance.serve.started")
        health = httpx.get(f"http://127.0.0.1:{started['port']}/healthz")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert health.status_code == 200
    assert code == 0
    assert '"signal": "SIGTERM"' in rest and '"maintenance.serve.stopped"' in rest


def read_event(proc: subprocess.Popen, event: str, timeout: float = 30.0) -> dict:
    """The first JSON log line of ``proc`` with this event name (bounded wait)."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=deadline - time.monotonic()):
            line = proc.stdout.readline()
            if not line:
                break
            if f'"{event}"' in line:
                return json.loads(line)
    raise AssertionError(f"{event} not logged; stderr: {proc.stderr.read() if proc.poll() is not None else ''}")


def test_metrics_are_negotiated_text_or_openmetrics_and_pass_promtool(db, database_url):
    """/metrics answers Prometheus text by default and OpenMetrics (ending # EOF) to an Accept asking for it; both parse, and promtool check metrics passes the text when it is installed."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    settings = Settings(database_url=database_url)
    telemetry = Telemetry()
    built = build_jobs(settings, job_env(settings, db), ["purge", "metrics"])
    for spec, job in built:
        run_job(spec, job, db, telemetry)
    server = make_server("127.0.0.1", 0, health=lambda: (True, {}), registry=telemetry.registry)
    serve_in_background(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        text = httpx.get(f"{base}/metrics")
        openmetrics = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    finally:
        server.shutdown()
        server.server_close()

    assert text.headers["content-type"].startswith("text/plain")
    assert {"core_jobs_purge_rows_deleted", "core_jobs_job_runs"} <= {
        f.name for f in text_string_to_metric_families(text.text)
    }
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.endswith("# EOF\n")
    assert {"core_jobs_purge_rows_deleted", "core_jobs_job_runs"} <= {
        f.name for f in openmetrics_families(openmetrics.text)
    }
    if os.path.exists(PROMTOOL):
        checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text.content, capture_output=True, check=False)
        assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()
