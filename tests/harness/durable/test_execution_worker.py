"""The worker running a durable consumer on the reference queue: retries settled on the queue, Held acked, J-AC8."""

from __future__ import annotations

from datetime import timedelta

from support.factories import publish
from support.harness_support import make_due, points, row_counts, run_worker, scalar
from support.ledger_support import PAYLOAD, execution, make_execution_due

from core_jobs_demo.ledger import Fault


def test_a_transient_failure_is_retried_by_the_queue_at_the_execution_s_run_at(
    conn, database_url, ledger, ledger_consumer, logs
):
    """503 on the credit: the message is retried after the same delay as the execution's run_at, then the job succeeds."""
    ledger.fail("credits", Fault.unavailable(retry_after="5"))
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    assert run_worker(database_url, consumer=ledger_consumer).retried == 1
    message_run_at = scalar(conn, "SELECT run_at FROM core.queue_messages WHERE job_id = %s", (job_id,))
    row = execution(conn, job_id)
    assert row["status"] == "RETRY_WAIT"
    assert timedelta(0) <= message_run_at - row["run_at"] < timedelta(seconds=1)  # never before the execution is due
    [scheduled] = logs.named("harness.execution.retry_scheduled")
    assert (scheduled["action"], scheduled["attempt"], scheduled["delay_s"]) == ("credit", 1, 5.0)
    make_due(conn)
    make_execution_due(conn, job_id)
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    assert points(conn, "m-7") == 25 and len(ledger.effects(endpoint="credits")) == 1


def test_a_durable_success_through_the_worker_leaves_only_the_fence_and_the_balance(
    conn, database_url, ledger, ledger_consumer
):
    """J-AC8 through the queue: the message, the execution, its checkpoints and history are all gone."""
    before = row_counts(conn)
    publish(conn, PAYLOAD, queue="points.ledger")
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    after = row_counts(conn)
    assert {t: after[t] - before[t] for t in after if after[t] != before[t]} == {
        "core.processed_jobs": 1,
        "example.loyalty_points": 1,
    }


def test_a_held_execution_is_acked_counted_and_logged(conn, database_url, ledger, ledger_consumer, logs):
    """notify answered 503: RECONCILIATION_REQUIRED; the worker acks the message, counts held, logs both events."""
    ledger.fail("notify", Fault.unavailable())
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    stats = run_worker(database_url, consumer=ledger_consumer)
    assert (stats.held, stats.retried, stats.dead_lettered) == (1, 0, 0)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    [held] = logs.named("harness.execution.held")
    assert held["job_id"] == str(job_id) and held["execution_id"] == execution(conn, job_id)["id"]
    [why] = logs.named("harness.execution.reconciliation_required")
    assert why["action"] == "notify"
    assert logs.named("harness.worker.stop")[0]["num_held"] == 1
