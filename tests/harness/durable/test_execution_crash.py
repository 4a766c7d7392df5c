"""A worker process that dies hard in an action, and a new worker that recovers from the database (R-4, R-7).

tests/support/durable_crash_worker.py dies with ``os._exit`` before or after calling the real local
ledger (or is killed with SIGKILL while it waits to commit the next action's STARTED). The
parent then expires the leases it left (the message's and the execution's: back-dated, not
waited for) and runs a fresh worker in-process on the same database and ledger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import psycopg
from support import ROOT, TESTS
from support.durable_crash_worker import APPLICATION_NAME, CRASH_EXIT
from support.factories import publish
from support.harness_support import expire_leases, fences, points, run_worker, scalar
from support.ledger_support import PAYLOAD, checkpoints, execution, expire_execution
from support.waiting import wait_until

from harness.consumer.actions import idempotency_key

WORKER = TESTS / "support" / "durable_crash_worker.py"


def crash_worker(database_url: str, ledger_url: str, action: str, when: str) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    return subprocess.Popen(
        [sys.executable, str(WORKER), database_url, ledger_url, action, when],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def crash(conn, database_url, ledger, action: str, when: str) -> uuid.UUID:
    """Publish one job, run the crash worker until it dies in ``action``, expire what it left leased; the job id."""
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    process = crash_worker(database_url, ledger.url, action, when)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == CRASH_EXIT, err
    recover_leases(conn, job_id)
    return job_id


def recover_leases(conn, job_id) -> None:
    expire_leases(conn)
    expire_execution(conn, job_id)


def test_an_idempotent_write_sent_before_the_crash_is_resent_with_its_key_one_effect(
    conn, database_url, ledger, ledger_consumer
):
    """Died after the credit was sent: the new worker resends it with the same key — one effect — then finishes."""
    job_id = crash(conn, database_url, ledger, "credit", "after")
    assert checkpoints(conn, job_id)["credit"] == ("STARTED", 1)
    stats = run_worker(database_url, consumer=ledger_consumer)
    assert stats.processed == 1
    key = idempotency_key(job_id, "points.ledger", "credit")
    assert ledger.calls("credits") == 2 and [e.key for e in ledger.effects(endpoint="credits")] == [key]
    assert len(ledger.effects(endpoint="notify")) == 1  # its STARTED was never committed: sent once, by the new worker
    assert points(conn, "m-7") == 25 and fences(conn, job_id) == 1 and execution(conn, job_id) is None


def test_an_idempotent_write_started_but_not_sent_is_sent_once_after_the_crash(
    conn, database_url, ledger, ledger_consumer
):
    """Died after committing the credit's STARTED but before sending it: the new worker sends it (attempt 2), one effect."""
    job_id = crash(conn, database_url, ledger, "credit", "before")
    assert ledger.calls("credits") == 0 and checkpoints(conn, job_id)["credit"] == ("STARTED", 1)
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    assert ledger.calls("credits") == 1 and len(ledger.effects(endpoint="credits")) == 1
    assert points(conn, "m-7") == 25


def test_a_non_idempotent_write_sent_before_the_crash_needs_reconciliation_with_zero_resends(
    conn, database_url, ledger, ledger_consumer
):
    """Died after notify was sent: RECONCILIATION_REQUIRED, the message acked (Held), notify never sent again."""
    job_id = crash(conn, database_url, ledger, "notify", "after")
    stats = run_worker(database_url, consumer=ledger_consumer)
    assert (stats.held, stats.processed) == (1, 0)
    assert ledger.calls("notify") == 1
    row = execution(conn, job_id)
    assert (row["status"], row["reason_action"]) == ("RECONCILIATION_REQUIRED", "notify")
    assert checkpoints(conn, job_id)["notify"] == ("UNCERTAIN", 1)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert points(conn, "m-7") == 0 and fences(conn, job_id) == 0
    assert run_worker(database_url, consumer=ledger_consumer).held == 0  # nothing left to deliver
    assert ledger.calls("notify") == 1


def test_a_non_idempotent_write_started_but_not_sent_still_needs_reconciliation(
    conn, database_url, ledger, ledger_consumer
):
    """Died after committing notify's STARTED, before the send: the database cannot tell, so RECONCILIATION_REQUIRED, zero sends."""
    job_id = crash(conn, database_url, ledger, "notify", "before")
    assert run_worker(database_url, consumer=ledger_consumer).held == 1
    assert ledger.calls("notify") == 0
    assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"


def test_a_crash_before_the_non_idempotent_start_committed_is_proof_it_was_never_sent(
    conn, database_url, ledger, ledger_consumer
):
    """Killed while notify's STARTED commit waited (so it never committed): no STARTED row proves no send — notify is sent once."""
    job_id = publish(conn, PAYLOAD, queue="points.ledger")
    process = crash_worker(database_url, ledger.url, "credit", "paused")
    try:
        while (line := process.stdout.readline()) and line.strip() != "sent":
            pass  # the worker's log lines
        assert line.strip() == "sent", process.stderr.read()
        with psycopg.connect(database_url) as locker:  # a transaction holding the execution's row lock
            locker.execute("SELECT 1 FROM core.executions WHERE job_id = %s FOR UPDATE", (job_id,))
            process.stdin.write("go\n")
            process.stdin.flush()
            wait_until(
                lambda: scalar(
                    conn,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
                    " AND datname = current_database()",  # this test's worker, not another session's
                    (APPLICATION_NAME,),
                ),
                what="the crash worker's next commit waiting on the execution's lock",
            )
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    assert "notify" not in checkpoints(conn, job_id) and ledger.calls("notify") == 0
    wait_until(
        lambda: (
            not scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                (APPLICATION_NAME,),
            )
        ),
        what="the killed worker's sessions to end",
    )
    recover_leases(conn, job_id)
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    assert ledger.calls("notify") == 1 and len(ledger.effects(endpoint="credits")) == 1
    assert points(conn, "m-7") == 25
