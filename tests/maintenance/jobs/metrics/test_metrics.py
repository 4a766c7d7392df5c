"""The metrics job (issue 5): success volume since a watermark, dead-letter gauges, export."""

from __future__ import annotations

import os
import secrets
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import make_conninfo
from support.factories import add_dead_letter, add_execution, add_fences, resolve_execution
from support.jobs import env
from support.logcapture import events_in
from support.waiting import wait_until
from werkzeug import Request, Response

from maintenance.cli import main
from maintenance.errors import EXIT_OK
from maintenance.jobs.base import JobSpec
from maintenance.jobs.metrics.job import SETTLE, MetricsJob, add_counts, choose_horizon
from maintenance.jobs.metrics.settings import MetricsFields
from maintenance.runtime.db import Database
from maintenance.service.runner import run_job
from maintenance.service.telemetry import Telemetry

TENANTS = "00000000-0000-4000-8000-{:012x}"  # tenant n of a test
PUSH_PATH = "/metrics/job/core-jobs/job_name/metrics"


def server_now(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


def core_row_counts(conn: psycopg.Connection) -> dict[str, int]:
    tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'core' ORDER BY 1")]
    return {
        t: conn.execute(sql.SQL("SELECT count(*) FROM core.{}").format(sql.Identifier(t))).fetchone()[0] for t in tables
    }


def pushed_families(body: bytes) -> dict[str, dict[tuple, float]]:
    """Prometheus text -> {sample name: {sorted label items: value}}."""
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def run_once_metrics_and_push(clean_env, database_url: str, httpserver) -> dict[str, dict[tuple, float]]:
    """`core-jobs run-once metrics` against the test database and a local Pushgateway; what it PUT."""
    httpserver.expect_request(PUSH_PATH, method="PUT").respond_with_data("", status=200)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_METRICS_PUSHGATEWAY_URL", httpserver.url_for("/"))
    assert main(["run-once", "metrics"]) == EXIT_OK
    ((request, _response),) = httpserver.log
    return pushed_families(request.get_data())


# --- export --------------------------------------------------------------------------------------
def test_run_once_metrics_pushes_per_consumer_counts_and_logs_them(clean_env, database_url, conn, httpserver, capsys):
    """`core-jobs run-once metrics` PUTs each consumer's success count to the Pushgateway and logs the same figures."""
    now = server_now(conn)
    add_fences(conn, "points.credit", 7, now - timedelta(minutes=30))
    add_fences(conn, "points.expire", 3, now - timedelta(minutes=20))
    add_fences(conn, "notifications.email", 1, now - timedelta(hours=2))
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(minutes=10))
    pushed = run_once_metrics_and_push(clean_env, database_url, httpserver)
    assert pushed["core_jobs_successes_total"] == {
        (("consumer", "notifications.email"),): 1.0,
        (("consumer", "points.credit"),): 7.0,
        (("consumer", "points.expire"),): 3.0,
    }
    assert pushed["core_jobs_dead_letters_pending"] == {(("queue", "points.credit"),): 1.0}
    assert "core_jobs_job_result" not in pushed  # one metric per quantity: the successes are core_jobs_successes_total
    assert (("job_name", "metrics"), ("outcome", "success")) in pushed["core_jobs_job_runs_total"]
    [event] = events_in(capsys.readouterr().out, "maintenance.metrics.collected")
    assert event["successes_total"] == {"notifications.email": 1, "points.credit": 7, "points.expire": 3}
    assert event["successes"] == {"notifications.email": 1, "points.credit": 7, "points.expire": 3}
    assert event["dead_letters"]["points.credit"]["pending"] == 1


def test_a_failed_push_is_logged_and_the_run_still_succeeds(clean_env, database_url, httpserver, capsys):
    """A Pushgateway answering 500 makes a push_failed event, and run-once still exits 0."""
    httpserver.expect_request(PUSH_PATH, method="PUT").respond_with_data("down", status=500)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_METRICS_PUSHGATEWAY_URL", httpserver.url_for("/"))

    assert main(["run-once", "metrics"]) == EXIT_OK

    out = capsys.readouterr().out
    assert '"maintenance.metrics.push_failed"' in out
    assert '"maintenance.metrics.stop"' in out


def test_push_events_never_show_the_pushgateway_url_path(db, httpserver, logs):
    """A Pushgateway behind a path carrying a token: pushed and push_failed events show only scheme://host/…."""
    gateway = httpserver.url_for("/gw-token-4d2c")
    httpserver.expect_ordered_request("/gw-token-4d2c" + PUSH_PATH, method="PUT").respond_with_data("", status=200)
    httpserver.expect_ordered_request("/gw-token-4d2c" + PUSH_PATH, method="PUT").respond_with_data("down", status=500)
    telemetry = Telemetry()
    spec = JobSpec(
        name="metrics", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {"num_successes": 0}
    )
    run_job(spec, MetricsJob(MetricsFields(), env(db)), db, telemetry)

    assert telemetry.push(gateway, "metrics") is True
    assert telemetry.push(gateway, "metrics") is False

    events = {e["event"]: e for e in events_in(logs.text) if e["event"].startswith("maintenance.metrics.push")}
    assert set(events) == {"maintenance.metrics.pushed", "maintenance.metrics.push_failed"}
    assert {e["gateway"] for e in events.values()} == {f"http://{httpserver.host}:{httpserver.port}/…"}
    assert "gw-token-4d2c" not in logs.text


class PushgatewayStandIn:
    """The Pushgateway's grouping semantics: PUT replaces the whole group, POST only the metric
    families it carries (families without samples are dropped on arrival, as the real one does)."""

    def __init__(self, httpserver) -> None:
        self.families: dict[str, dict[tuple, float]] = {}
        for method in ("PUT", "POST"):
            httpserver.expect_request(PUSH_PATH, method=method).respond_with_handler(self.push)

    def push(self, request: Request) -> Response:
        pushed = {name: samples for name, samples in pushed_families(request.get_data()).items() if samples}
        self.families = pushed if request.method == "PUT" else self.families | pushed
        return Response("", status=200)


def test_a_failed_run_keeps_the_last_success_timestamp_on_the_pushgateway(db, empty_database_url, httpserver):
    """Run-once succeeds, then a later run-once (a new process) fails: last_success stays, the failure shows."""
    gateway = PushgatewayStandIn(httpserver)
    spec = JobSpec(
        name="metrics", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {"num_successes": 0}
    )
    first, second = Telemetry(), Telemetry()  # two CronJob pods: each process starts from zero

    run_job(spec, MetricsJob(MetricsFields(), env(db)), db, first)
    assert first.push(httpserver.url_for("/"), "metrics")
    succeeded_at = gateway.families["core_jobs_job_last_success_timestamp_seconds"]
    broken = Database(empty_database_url)  # no schema: this run fails
    run_job(spec, MetricsJob(MetricsFields(), env(broken)), broken, second)
    assert second.push(httpserver.url_for("/"), "metrics")

    assert gateway.families["core_jobs_job_last_success_timestamp_seconds"] == succeeded_at
    assert gateway.families["core_jobs_job_runs_total"] == {(("job_name", "metrics"), ("outcome", "failure")): 1.0}


@pytest.fixture
def created_series_switched_on():
    """prometheus_client's process-wide ``_created`` switch on, as a library user may leave it; restored after."""
    import prometheus_client.metrics as metrics_module
    from prometheus_client import disable_created_metrics, enable_created_metrics

    was_on = metrics_module._use_created
    enable_created_metrics()
    yield
    (enable_created_metrics if was_on else disable_created_metrics)()


def test_no_created_series_are_served_or_pushed_whatever_the_library_switch(db, httpserver, created_series_switched_on):
    """With prometheus_client's _created switch on, /metrics and the Pushgateway still get no *_created series."""
    gateway = PushgatewayStandIn(httpserver)
    telemetry = Telemetry()
    spec = JobSpec(
        name="metrics", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {"num_successes": 0}
    )
    run_job(spec, MetricsJob(MetricsFields(), env(db)), db, telemetry)
    assert telemetry.push(httpserver.url_for("/"), "metrics")

    served = generate_latest(telemetry.registry).decode()
    assert "core_jobs_job_runs_total" in served and "_created" not in served
    assert "core_jobs_job_runs_total" in gateway.families
    assert not [name for name in gateway.families if name.endswith("_created")]


def test_pushgateway_url_with_credentials_is_refused(clean_env, capsys):
    """A Pushgateway URL carrying user:password exits 2 naming the setting, without echoing the password."""
    clean_env.setenv("CORE_JOBS_METRICS_PUSHGATEWAY_URL", "https://ops:hunter22@push.example")
    assert main(["check-config"]) == 2
    err = capsys.readouterr().err
    assert "CORE_JOBS_METRICS_PUSHGATEWAY_URL" in err and "hunter22" not in err


# --- the watermark -------------------------------------------------------------------------------
def test_counts_back_dated_fences_once_on_each_side_of_the_watermark(db, conn):
    """Fences before a run's cutoff are counted by it; those after by the next run; none twice."""
    job = MetricsJob(MetricsFields(), env(db))
    now = server_now(conn)
    add_fences(conn, "points.credit", 2, now - timedelta(hours=1))
    add_fences(conn, "points.credit", 1, now - SETTLE - timedelta(milliseconds=1))  # just inside
    add_fences(conn, "points.credit", 4, now + timedelta(minutes=10))  # beyond this run's cutoff

    first = job.run_once(now)
    second = job.run_once(now + timedelta(minutes=20))
    third = job.run_once(now + timedelta(minutes=21))

    assert first.successes == {"points.credit": 3}
    assert second.successes == {"points.credit": 4}
    assert third.successes == {}
    assert third.totals["points.credit"]["total"] == 7
    assert first.counted_until == second.counted_from


def test_a_fence_committed_late_by_an_open_transaction_is_counted_once(db, database_url, conn):
    """A work transaction that started before newer committed fences holds the watermark back until it commits."""
    job = MetricsJob(MetricsFields(), env(db))
    with psycopg.connect(database_url) as in_flight:  # a consumer's work transaction, still open
        add_fences(in_flight, "points.credit", 1)  # processed_at = its start
        started = server_now(in_flight)
        add_fences(conn, "points.expire", 2)  # committed, newer processed_at
        add_fences(conn, "points.expire", 1, started - timedelta(minutes=1))  # committed, older

        run_while_open = job.run_once(server_now(conn) + timedelta(seconds=5))
        assert run_while_open.horizon == "open_transaction"
        assert run_while_open.counted_until == started
        assert run_while_open.successes == {"points.expire": 1}
        in_flight.commit()

    after_commit = job.run_once(server_now(conn) + timedelta(seconds=5))
    again = job.run_once(server_now(conn) + timedelta(seconds=6))

    assert after_commit.successes == {"points.credit": 1, "points.expire": 2}
    assert again.successes == {}
    assert {c: t["total"] for c, t in again.totals.items()} == {"points.credit": 1, "points.expire": 3}
    count = conn.execute("SELECT count(*) FROM core.processed_jobs").fetchone()[0]
    assert sum(t["total"] for t in again.totals.values()) == count


def test_two_concurrent_runs_serialise_and_count_each_fence_once(db, database_url, conn):
    """Two replicas running at once both wait on the watermark row; together they count every fence once."""
    now = server_now(conn)
    add_fences(conn, "points.credit", 5, now - timedelta(minutes=3))
    results = []
    with psycopg.connect(database_url) as blocker:
        blocker.execute("SELECT 1 FROM core.metrics_watermark FOR UPDATE")
        runs = [
            threading.Thread(target=lambda: results.append(MetricsJob(MetricsFields(), env(db)).run_once(now)))
            for _ in range(2)
        ]
        for run in runs:
            run.start()
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'core-jobs' AND wait_event_type = 'Lock'"
                ).fetchone()[0]
                == 2
            )
        )
        blocker.commit()
    for run in runs:
        run.join(timeout=30)
    assert sorted(sum(r.successes.values()) for r in results) == [0, 5]


def test_a_transaction_open_longer_than_max_transaction_stops_holding_the_count_back(db, database_url, conn):
    """An open transaction older than METRICS_MAX_TRANSACTION is not waited for: counting goes on to now - lag."""
    job = MetricsJob(MetricsFields(metrics_max_transaction=timedelta(minutes=5)), env(db))
    with psycopg.connect(database_url) as forgotten:
        forgotten.execute("SELECT 1")  # an idle-in-transaction session
        now = server_now(conn) + timedelta(minutes=30)
        add_fences(conn, "points.credit", 3, now - timedelta(minutes=6))
        add_fences(conn, "points.credit", 1, now - timedelta(minutes=4))

        result = job.run_once(now)

    assert result.horizon == "max_transaction"
    assert result.counted_until == now - timedelta(minutes=5)
    assert result.successes == {"points.credit": 3}


def test_a_role_that_cannot_see_other_sessions_falls_back_to_the_safety_lag(database_url, conn):
    """Without pg_read_all_stats, sessions of other roles are hidden, so counting stops at now - max_transaction."""
    role = f"core_jobs_metrics_{os.getpid()}_{secrets.token_hex(3)}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        for grant in (
            "GRANT USAGE ON SCHEMA core TO {}",
            "GRANT SELECT ON core.processed_jobs, core.dead_letters, core.executions, core.execution_resolutions TO {}",
            "GRANT SELECT, INSERT, UPDATE ON core.metrics_watermark TO {}",
        ):
            conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
        now = server_now(conn)
        add_fences(conn, "points.credit", 2, now - timedelta(minutes=10))
        add_fences(conn, "points.credit", 1, now - timedelta(minutes=2))
        as_role = Database(make_conninfo(database_url, user=role))

        result = MetricsJob(MetricsFields(metrics_max_transaction=timedelta(minutes=5)), env(as_role)).run_once(now)

        assert result.horizon == "max_transaction"
        assert result.counted_until == now - timedelta(minutes=5)
        assert result.successes == {"points.credit": 2}
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_watermark_never_moves_backwards(db, conn):
    """The database refuses to move counted_until back, and a run with an earlier clock counts nothing."""
    job = MetricsJob(MetricsFields(), env(db))
    now = server_now(conn)
    add_fences(conn, "points.credit", 2, now - timedelta(minutes=3))
    job.run_once(now)
    earlier = job.run_once(now - timedelta(minutes=10))
    assert earlier.successes == {} and earlier.counted_until == earlier.counted_from
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot move back"):
        conn.execute("UPDATE core.metrics_watermark SET counted_until = counted_until - interval '1 second'")


def test_writes_no_row_except_its_watermark(db, conn):
    """Row counts of every table in schema core are the same before and after a run; only the watermark changed."""
    now = server_now(conn)
    add_fences(conn, "points.credit", 5, now - timedelta(minutes=2))
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(hours=1))
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(hours=2), status="replayed")
    before = core_row_counts(conn)
    watermark_before = conn.execute("SELECT counted_until, totals FROM core.metrics_watermark").fetchall()

    MetricsJob(MetricsFields(), env(db)).run_once(now)

    assert core_row_counts(conn) == before
    assert before["metrics_watermark"] == 1
    watermark_after = conn.execute("SELECT counted_until, totals FROM core.metrics_watermark").fetchall()
    assert watermark_before == [(None, {})]
    assert watermark_after[0][1] == {"points.credit": {"total": 5, "tenants": {}}}


def test_a_deleted_watermark_row_restarts_the_counters(db, conn):
    """Deleting the watermark row (an operator's reset) makes the next run recount the fences still stored."""
    now = server_now(conn)
    add_fences(conn, "points.credit", 2, now - timedelta(minutes=3))
    job = MetricsJob(MetricsFields(), env(db))
    job.run_once(now)
    conn.execute("DELETE FROM core.metrics_watermark")
    assert job.run_once(now).totals == {"points.credit": {"total": 2, "tenants": {}}}


# --- dead letters --------------------------------------------------------------------------------
def test_dead_letter_gauges_per_queue(db, conn):
    """Pending count, oldest pending age by the run's now, and replayed/discarded totals, per queue."""
    now = server_now(conn)
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(minutes=90))
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(minutes=5))
    add_dead_letter(conn, queue="points.credit", created_at=now - timedelta(days=2), status="replayed")
    add_dead_letter(conn, queue="notifications.email", created_at=now - timedelta(days=3), status="discarded")
    add_dead_letter(conn, queue="notifications.email", created_at=now - timedelta(days=3), status="replayed")

    result = MetricsJob(MetricsFields(), env(db)).run_once(now)

    figures = {q.queue: q for q in result.dead_letters}
    assert figures["points.credit"].pending == 2
    assert figures["points.credit"].oldest_pending_age_seconds == 5400.0
    assert (figures["points.credit"].replayed, figures["points.credit"].discarded) == (1, 0)
    assert figures["notifications.email"].pending == 0
    assert figures["notifications.email"].oldest_pending_age_seconds is None
    assert (figures["notifications.email"].replayed, figures["notifications.email"].discarded) == (1, 1)
    assert result.fields()["dead_letters_oldest_pending_age_seconds"] == 5400.0


# --- tenants -------------------------------------------------------------------------------------
def test_tenant_label_names_the_top_tenants_and_sums_the_rest_as_other(db, conn):
    """With the tenant label and TOP_N=2, the two largest tenants get a series and the others sum to 'other'."""
    job = MetricsJob(MetricsFields(metrics_tenant_label=True, metrics_tenant_top_n=2), env(db))
    now = server_now(conn)
    for tenant, n in ((1, 5), (2, 3), (3, 2), (4, 1)):
        add_fences(conn, "points.credit", n, now - timedelta(minutes=10), tenant_id=TENANTS.format(tenant))
    first = job.run_once(now)
    add_fences(
        conn, "points.credit", 9, now + timedelta(minutes=1), tenant_id=TENANTS.format(4)
    )  # big now, but no slot left
    add_fences(conn, "points.credit", 1, now + timedelta(minutes=1), tenant_id=TENANTS.format(1))
    second = job.run_once(now + timedelta(minutes=5))

    t = TENANTS.format
    assert first.totals_by_series() == {
        ("points.credit", t(1)): 5,
        ("points.credit", t(2)): 3,
        ("points.credit", "other"): 3,
    }
    assert second.totals_by_series() == {
        ("points.credit", t(1)): 6,
        ("points.credit", t(2)): 3,
        ("points.credit", "other"): 12,
    }
    families = {f.name: f for f in second.metric_families()}
    assert {tuple(s.labels.values()) for s in families["core_jobs_successes"].samples} == {
        ("points.credit", t(1)),
        ("points.credit", t(2)),
        ("points.credit", "other"),
    }


def test_lowering_top_n_folds_the_smallest_named_tenants_into_other():
    """When TOP_N shrinks, the largest named tenants keep their series and the total is unchanged."""
    totals = {"c": {"total": 20, "tenants": {"a": 9, "b": 6, "x": 2}}}
    new = add_counts(totals, {("c", "b"): 1}, tenant_label=True, top_n=2)
    assert new == {"c": {"total": 21, "tenants": {"a": 9, "b": 7}}}


def test_horizon_is_the_oldest_open_transaction_within_bounds():
    """The cutoff is the oldest open transaction's start, at most now - 1 s, at least now - max_transaction."""
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    lag = timedelta(minutes=5)
    assert choose_horizon(now, None, hidden=0, prepared=0, max_transaction=lag) == (now - SETTLE, "settle")
    opened = now - timedelta(seconds=30)
    assert choose_horizon(now, opened, hidden=0, prepared=0, max_transaction=lag) == (opened, "open_transaction")
    old = now - timedelta(hours=1)
    assert choose_horizon(now, old, hidden=0, prepared=0, max_transaction=lag) == (now - lag, "max_transaction")
    assert choose_horizon(now, None, hidden=1, prepared=0, max_transaction=lag) == (now - lag, "max_transaction")
    assert choose_horizon(now, None, hidden=0, prepared=1, max_transaction=lag) == (now - lag, "max_transaction")


# --- run metrics of every job --------------------------------------------------------------------
def test_every_job_outcome_is_recorded_as_run_metrics(db, empty_database_url):
    """A success sets runs_total{success}, duration and last success; a failure counts and times its run, sets no last success and no result gauge."""
    telemetry = Telemetry()
    spec = JobSpec(
        name="metrics", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {"num_successes": 0}
    )
    run_job(spec, MetricsJob(MetricsFields(), env(db)), db, telemetry)
    broken = Database(empty_database_url)  # no schema: the job fails
    failing = JobSpec(
        name="broken", summary="", settings=MetricsFields, build=MetricsJob, zero_fields=lambda: {"num_successes": 0}
    )
    run_job(failing, MetricsJob(MetricsFields(), env(broken)), broken, telemetry)

    value = telemetry.registry.get_sample_value
    assert value("core_jobs_job_runs_total", {"job_name": "metrics", "outcome": "success"}) == 1
    assert value("core_jobs_job_runs_total", {"job_name": "broken", "outcome": "failure"}) == 1
    assert value("core_jobs_job_last_success_timestamp_seconds", {"job_name": "metrics"}) > 0
    assert value("core_jobs_job_last_success_timestamp_seconds", {"job_name": "broken"}) is None
    assert value("core_jobs_job_duration_seconds", {"job_name": "broken"}) > 0  # the failed run was timed too
    assert telemetry.last_runs["broken"].ok is False and "UndefinedTable" in telemetry.last_runs["broken"].error


# --- durable executions (issue 12) ----------------------------------------------------------------
def test_execution_gauges_per_consumer_and_state_and_the_oldest_uncertain_age(db, conn):
    """Counts per consumer and state (0 for the states it has none in), and the age of its oldest RECONCILIATION_REQUIRED one."""
    add_execution(conn, consumer="points.ledger", age="90 minutes")
    add_execution(conn, consumer="points.ledger", age="5 minutes")
    add_execution(conn, consumer="points.ledger", status="RETRY_WAIT")
    add_execution(conn, consumer="payments.charge", status="FAILED", age="2 days")
    now = server_now(conn)

    result = MetricsJob(MetricsFields(), env(db)).run_once(now)

    figures = {c.consumer: c for c in result.executions}
    assert figures["points.ledger"].by_status == {
        "PENDING": 0,
        "RUNNING": 0,
        "RETRY_WAIT": 1,
        "FAILED": 0,
        "RECONCILIATION_REQUIRED": 2,
    }
    assert figures["points.ledger"].oldest_reconciliation_age_seconds == pytest.approx(5400, abs=5)
    assert figures["payments.charge"].by_status["FAILED"] == 1
    assert figures["payments.charge"].oldest_reconciliation_age_seconds is None  # nothing uncertain there
    fields = result.fields()
    assert fields["executions_reconciliation_required"] == 2
    assert fields["executions_oldest_reconciliation_age_seconds"] == pytest.approx(5400, abs=5)


def test_a_resolved_execution_leaves_its_consumer_at_zero_uncertain_and_no_age(db, conn):
    """After the operator's resolution the consumer still shows RECONCILIATION_REQUIRED 0, and no oldest age."""
    uncertain = add_execution(conn, consumer="points.ledger", age="1 hour")
    resolve_execution(conn, uncertain)  # RESUME: PENDING
    [figures] = MetricsJob(MetricsFields(), env(db)).run_once(server_now(conn)).executions
    assert (figures.by_status["RECONCILIATION_REQUIRED"], figures.by_status["PENDING"]) == (0, 1)
    assert figures.oldest_reconciliation_age_seconds is None


def test_run_once_metrics_pushes_the_execution_gauges(clean_env, database_url, conn, httpserver, capsys):
    """`core-jobs run-once metrics` pushes executions by consumer and state and the oldest uncertain age, and logs them."""
    add_execution(conn, consumer="points.ledger", age="10 minutes")
    pushed = run_once_metrics_and_push(clean_env, database_url, httpserver)
    states = pushed["core_jobs_executions"]
    assert states[(("consumer", "points.ledger"), ("status", "RECONCILIATION_REQUIRED"))] == 1.0
    assert states[(("consumer", "points.ledger"), ("status", "FAILED"))] == 0.0
    [age] = pushed["core_jobs_executions_oldest_reconciliation_age_seconds"].items()
    assert age[0] == (("consumer", "points.ledger"),) and 600 <= age[1] < 660
    [event] = events_in(capsys.readouterr().out, "maintenance.metrics.collected")
    assert event["executions"]["points.ledger"]["RECONCILIATION_REQUIRED"] == 1


def test_a_run_that_raised_leaves_the_result_gauges_of_the_last_result(db, empty_database_url):
    """A declared result gauge keeps the value of the last run that returned a result when a later run raises (never a made-up 0)."""
    from maintenance.jobs.base import ResultMetric

    declared = (ResultMetric("core_jobs_metrics_test_successes", "num_successes", "test"),)
    spec = JobSpec(
        name="metrics",
        summary="",
        settings=MetricsFields,
        build=MetricsJob,
        zero_fields=lambda: {"num_successes": 0},
        result_metrics=declared,
    )
    telemetry = Telemetry()
    run_job(spec, MetricsJob(MetricsFields(), env(db)), db, telemetry)
    counted = telemetry.registry.get_sample_value("core_jobs_metrics_test_successes", {"job_name": "metrics"})
    broken = Database(empty_database_url)
    run_job(spec, MetricsJob(MetricsFields(), env(broken)), broken, telemetry)

    assert counted is not None
    assert telemetry.registry.get_sample_value("core_jobs_metrics_test_successes", {"job_name": "metrics"}) == counted
