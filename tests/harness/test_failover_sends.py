"""A NON_IDEMPOTENT_WRITE across PostgreSQL failovers mid-drain: never sent twice, an uncertain one held for an operator.

The rig (tests/support/failover.py) fails the primary over mid-drain while a real ``core-jobs worker`` runs
``support.failover_consumers:notifier``: each job sends one request to the local loyalty ledger (a real HTTP server
in this process, counting the requests per job), then records its effect. A worker that dies with the primary
leaves a send in doubt (its ``STARTED`` checkpoint committed, its final transaction not): the next take must park
it ``RECONCILIATION_REQUIRED``, never send it again. Over synchronous standbys the checkpoint survives every
failover; over asynchronous ones only the replication barrier (``await_standby``) keeps a send from leaving before
its checkpoint is on the standby. ``bench/failover.py --consumer send`` runs twenty failovers per mode and queue.
"""

from __future__ import annotations

import psycopg
import pytest
from support.factories import publish
from support.failover import SupervisedWorker, ended, fail_over_mid_drain, queue_empty, tally_sends
from support.failover_consumers import LEDGER_URL_VARIABLE, NOTIFIER_QUEUE, sends_per_job
from support.waiting import wait_until

from core_jobs_demo.ledger import LoyaltyLedger

pytestmark = pytest.mark.failover

JOBS = 120
FAILOVERS = 2
WORK_MS = 20  # the final transaction holds this long after the send: a failover finds sends in doubt

# Each held execution's write checkpoint: what reconciliation found.
HELD_CHECKPOINTS = """
SELECT c.status, count(*) FROM core.execution_checkpoints c JOIN core.executions e ON e.id = c.execution_id
 WHERE e.status = 'RECONCILIATION_REQUIRED' GROUP BY c.status
"""


@pytest.mark.parametrize(
    ("mode", "guard"),
    [("synchronous", {}), ("asynchronous", {"CORE_JOBS_WORKER_AWAIT_STANDBY": "PT1M"})],
    ids=["synchronous", "asynchronous-with-the-barrier"],
)
def test_failovers_mid_drain_send_no_non_idempotent_write_twice_and_hold_each_uncertain_one(
    mode: str, guard: dict[str, str], tmp_path, failover_rigs
) -> None:
    rig = failover_rigs.fresh(synchronous=mode == "synchronous")
    with LoyaltyLedger() as ledger:
        with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
            job_ids = [publish(conn, {"n": n, "work_ms": WORK_MS}, queue=NOTIFIER_QUEUE) for n in range(JOBS)]
        rig.wait_caught_up()
        env = guard | {LEDGER_URL_VARIABLE: ledger.url}
        worker = SupervisedWorker(rig.url(), "support.failover_consumers:notifier", tmp_path / "worker.log", env=env)
        worker.start()
        try:
            counted = fail_over_mid_drain(
                rig, failovers=FAILOVERS, jobs=JOBS, timeout=180, progress=ended, worker=worker
            )
            wait_until(lambda: queue_empty(rig, NOTIFIER_QUEUE), 180, f"every message of {NOTIFIER_QUEUE} acked")
        finally:
            worker.stop()
        sends = sends_per_job(e.body for e in ledger.effects(endpoint="notify"))
        with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
            outcome = tally_sends(conn, job_ids, sends, NOTIFIER_QUEUE)
            held = dict(conn.execute(HELD_CHECKPOINTS).fetchall())
    assert all(count < JOBS for count in counted), f"a failover came after the drain: {counted} of {JOBS}"
    assert (outcome.sent_twice, outcome.lost, outcome.doubled) == ([], [], []), outcome.figures()
    assert outcome.effects + outcome.dead_letters + len(outcome.reconciliation) == JOBS, outcome.figures()
    assert held == ({"UNCERTAIN": len(outcome.reconciliation)} if outcome.reconciliation else {}), held
    assert worker.exits == []  # the worker rode out each failover by reconnecting
