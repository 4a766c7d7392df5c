"""The runner: every job run emits start, then stop or error with the same keys; a failure never stops the next job."""

from __future__ import annotations

import threading

from freezegun import freeze_time
from support.jobs import CountingJob, FailingJob, spec

from maintenance.service.runner import Runner, run_jobs
from maintenance.service.telemetry import Telemetry


def test_failed_job_emits_error_with_zero_fields_and_the_next_job_still_runs(db, logs):
    """A job that raises gives <prefix>.error with its fields at zero plus error; the next job runs on PostgreSQL's clock."""
    after = CountingJob()
    with freeze_time("2001-01-01"):  # the application clock is wrong; the job still gets the server's
        outcomes = run_jobs(
            [(spec("broken"), FailingJob()), (spec("after"), after)], db, Telemetry(), stop=threading.Event()
        )

    assert [(o.name, o.ok) for o in outcomes] == [("broken", False), ("after", True)]
    assert outcomes[0].error == "RuntimeError: provider down"
    events = logs.by_name()
    assert list(events) == ["test.broken.start", "test.broken.error", "test.after.start", "test.after.stop"]
    assert events["test.broken.error"]["num_done"] == 0
    assert events["test.broken.error"]["error"] == "RuntimeError: provider down"
    assert events["test.after.stop"]["num_done"] == 3 and events["test.after.stop"]["ok"] is True
    assert all(e["job"] in ("broken", "after") for e in events.values())
    with db.connect() as conn:
        server_year = conn.execute("SELECT extract(year FROM now())::int").fetchone()[0]
    assert after.now.year == server_year != 2001


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class UnprintableJob:
    def run_once(self, now):
        raise Unprintable()


def test_a_job_error_that_cannot_be_printed_is_recorded_by_its_type_and_the_next_job_runs(db, logs):
    """An exception whose __str__ raises is that job's error, named by type; run-once goes on to the next job."""
    after = CountingJob()
    outcomes = run_jobs(
        [(spec("broken"), UnprintableJob()), (spec("after"), after)], db, Telemetry(), stop=threading.Event()
    )

    assert [(o.name, o.ok) for o in outcomes] == [("broken", False), ("after", True)]
    assert outcomes[0].error is not None and outcomes[0].error.startswith("Unprintable: <message unprintable")
    assert logs.by_name()["test.broken.error"]["error"] == outcomes[0].error


LEAKY = "RuntimeError: Better Stack refused at postgresql://app:pw-9876@db/core"


class LeakyJob:
    def run_once(self, now):
        raise RuntimeError("Better Stack refused at postgresql://app:pw-9876@db/core")


def test_a_failed_jobs_span_status_and_outcome_mask_its_credentials_as_its_log_line_does(spans, db, logs):
    """A job error quoting a URL password reaches the span status and JobOutcome.error masked exactly as its error event."""
    (outcome,) = run_jobs([(spec("leaky"), LeakyJob())], db, Telemetry(), stop=threading.Event())

    logged = logs.by_name()["test.leaky.error"]["error"]
    assert logged == LEAKY.replace("pw-9876", "***")
    assert outcome.error == logged
    assert spans.one("job leaky").status.description == logged


class Hook:
    """An after-run hook that records each call: (job names and oks, source)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, bool]], str]] = []

    def __call__(self, outcomes, source: str) -> None:
        self.calls.append(([(o.name, o.ok) for o in outcomes], source))


def test_run_once_calls_each_after_run_hook_once_with_every_outcome_failures_included(db):
    """Runner.run (run-once): the jobs, each recorded, then every hook once, for all of them, in order."""
    first, second = Hook(), Hook()
    runner = Runner(db, Telemetry(), [first, second])
    runner.run(
        [(spec("broken"), FailingJob()), (spec("after"), CountingJob())], stop=threading.Event(), source="run-once"
    )
    expected = [([("broken", False), ("after", True)], "run-once")]
    assert first.calls == expected and second.calls == expected
    assert set(runner.telemetry.last_runs) == {"broken", "after"}


def test_serve_calls_the_hooks_after_each_job_it_runs(db):
    """Runner.run_one (serve): one job, then the hooks for that job alone."""
    hook = Hook()
    runner = Runner(db, Telemetry(), [hook])
    runner.run_one(spec("one"), CountingJob(), source="core-jobs serve")
    runner.run_one(spec("two"), FailingJob(), source="core-jobs serve")
    assert hook.calls == [([("one", True)], "core-jobs serve"), ([("two", False)], "core-jobs serve")]


def test_the_composition_root_builds_only_the_hooks_whose_url_is_set_and_none_holds_the_settings(
    clean_env, monkeypatch
):
    """No URL: no hook. Both URLs: a Pushgateway and a Heartbeat, each holding its two values, never Settings;
    the heartbeat's repr does not show its URL (the path is a token)."""
    from alerts.heartbeat import Heartbeat
    from maintenance.cli.jobs import after_run_hooks
    from maintenance.service.telemetry import Pushgateway
    from maintenance.settings import load_settings

    assert after_run_hooks(load_settings(), Telemetry()) == []
    monkeypatch.setenv("CORE_JOBS_METRICS_PUSHGATEWAY_URL", "http://pushgateway:9091")
    monkeypatch.setenv("CORE_JOBS_BETTERSTACK_HEARTBEAT_URL", "https://uptime.betterstack.com/api/v1/heartbeat/s3cr3t")
    telemetry = Telemetry()
    push, beat = after_run_hooks(load_settings(), telemetry)
    assert push == Pushgateway(telemetry, "http://pushgateway:9091", 10.0)
    assert isinstance(beat, Heartbeat) and beat.url.endswith("/s3cr3t") and "s3cr3t" not in repr(beat)
