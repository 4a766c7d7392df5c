"""A drain killed with SIGKILL at random points, again and again: every job has exactly one effect or one dead letter.

The worker runs the crash consumer (tests/support/harness_consumers.py), each job one row of its own in
``crash_effects``, in batches of 10 or 100 (shared work transactions, harness/handling.py). Each round kills it at a
point the round draws: inside a handler (before or after its INSERT, on its n-th call), or from outside once a
drawn number of effects has committed (anywhere: a claim, a batch's open, a handler, its commit, an ack). Between
rounds the dead worker's leases are made expired (what waiting them out would do); at the end one worker drains
what is left. A failure names its seed; ``CORE_JOBS_TEST_CRASH_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import os
import random
import signal
import uuid

import pytest
from support import harness_consumers
from support.factories import TENANT
from support.harness_support import expire_leases, make_due, run_worker, scalar
from support.waiting import wait_until

from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from tests.harness.test_worker_process import WorkerProcess

JOBS = 400
ROUNDS = 6


def committed_effects(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM crash_effects")


@pytest.mark.parametrize("name", ["crashing", "crashing_batched"], ids=["handler", "batch-handler"])
def test_a_drain_killed_at_random_points_leaves_each_job_exactly_one_effect_or_one_dead_letter(
    database_url, conn, name
):
    """Its consumer's handler per job, or its batch handler (a shared transaction's effects in one INSERT)."""
    crashing = getattr(harness_consumers, name)
    seed = int(os.environ.get("CORE_JOBS_TEST_CRASH_SEED") or random.randrange(1 << 32))
    draw = random.Random(seed)
    conn.execute("CREATE TABLE crash_effects (job_id uuid NOT NULL)")  # no key: a second effect would show
    conn.execute("GRANT INSERT ON crash_effects TO core_jobs_worker")  # the worker's role (migration 0020)
    jobs = [uuid.uuid4() for _ in range(JOBS)]
    PgQueue(conn).publish_many(
        [
            (crashing.queue, Envelope(job_id=job, payload={"member_id": "m", "points": 1}, tenant_id=TENANT))
            for job in jobs
        ]
    )
    kills = 0
    for _round in range(ROUNDS):
        batch = draw.choice(["10", "100"])
        # Inside a handler, before or after its work: always the first round, whose worker reaches the drawn call
        # (at most 120 of the 400 jobs); a drain from outside may end before its target, killing nothing.
        if _round == 0 or draw.random() < 0.5:
            env = {"CRASH_AT_CALL": str(draw.randint(1, 120)), "CRASH_PHASE": draw.choice(["before", "after"])}
            worker = WorkerProcess(
                database_url, "--once", "--batch-size", batch, consumer=f"support.harness_consumers:{name}", env=env
            )
            code = worker.process.wait(120)
        else:  # from outside, once some more effects have committed
            target = committed_effects(conn) + draw.randint(1, 150)
            worker = WorkerProcess(
                database_url, "--once", "--batch-size", batch, consumer=f"support.harness_consumers:{name}"
            )
            wait_until(
                lambda: worker.process.poll() is not None or committed_effects(conn) >= target,  # noqa: B023
                timeout=120,
                what=f"{target} effects committed (seed {seed})",
            )
            worker.process.send_signal(signal.SIGKILL)
            code = worker.process.wait(60)
        assert code in (0, -signal.SIGKILL), f"seed {seed}: exit {code}; output: {''.join(worker.output)}"
        # The handler fails only by dying: a retry means its INSERT was refused (a grant the worker's role lacks).
        failed = [line for line in worker.output if '"harness.job.retry_scheduled"' in line]
        assert failed == [], f"seed {seed}: a job failed without a kill: {failed[:1]}"
        kills += code == -signal.SIGKILL
        expire_leases(conn)
        make_due(conn)
    assert kills >= 1, f"seed {seed}: no round killed its worker"

    run_worker(database_url, crashing)

    rows = conn.execute(
        """SELECT j.job_id,
                  (SELECT count(*) FROM crash_effects AS e WHERE e.job_id = j.job_id),
                  (SELECT count(*) FROM core.dead_letters AS d WHERE d.job_id = j.job_id)
             FROM unnest(%s::uuid[]) AS j(job_id)""",
        (jobs,),
    ).fetchall()
    wrong = [(job, effects, letters) for job, effects, letters in rows if (effects, letters) not in ((1, 0), (0, 1))]
    assert wrong == [], f"seed {seed}: jobs without exactly one effect or one dead letter: {wrong[:10]}"
    letters = scalar(conn, "SELECT count(*) FROM core.dead_letters")
    assert letters <= kills, f"seed {seed}: {letters} dead letters for {kills} kills (only a killer is dead-lettered)"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0, f"seed {seed}"
