"""A PostgreSQL failover mid-drain loses no job and applies none twice, on the reference queue (issue 27, items 1-2).

The rig (tests/support/failover.py) is a private primary and a streaming standby, the worker on a
libpq multi-host URL with ``target_session_attrs=read-write``; a failover kills the primary
(``pg_ctl stop -m immediate``) and promotes the standby, then a new standby is built. On the
reference queue the work, its fence and the message's ack are one database's: a commit the
promoted standby never received is lost whole, and the message is simply taken again — so both
replication modes must end with every job having exactly one effect or one dead letter.

The worker is supervised (restarted when it exits, as Kubernetes would); it reconnects by itself
after a lost connection, so the supervisor has nothing to do — the test asserts it never exited. A few
failovers here; ``bench/failover.py`` runs twenty and more per mode and prints the figures.
"""

from __future__ import annotations

import psycopg
import pytest
from support.factories import publish
from support.failover import (
    DATABASE,
    FailoverRig,
    SupervisedWorker,
    fail_over_mid_drain,
    queue_empty,
    tally,
)
from support.failover_consumers import QUEUE
from support.waiting import wait_until

pytestmark = pytest.mark.failover

JOBS = 300
FAILOVERS = 2
WORK_MS = 10  # each job's work holds its transaction this long: the failovers find the drain running


@pytest.fixture(params=["asynchronous", "synchronous"])
def rig(request, failover_rigs):
    return failover_rigs.fresh(synchronous=request.param == "synchronous")


def test_rig_follows_the_primary_across_failovers(rig: FailoverRig) -> None:
    for _ in range(2):
        with psycopg.connect(rig.url(), autocommit=True) as conn:
            conn.execute("INSERT INTO public.failover_effects (job_id) VALUES (gen_random_uuid())")
            assert conn.info.port == rig.primary.port
            assert not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        rig.wait_caught_up()
        assert rig.standby is not None
        with psycopg.connect(rig.standby.url(DATABASE), autocommit=True) as standby:
            assert standby.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert standby.execute("SELECT 1 FROM pg_roles WHERE rolname = 'core_jobs_api'").fetchone()
        rig.failover()
        rig.rebuild_standby()
    with psycopg.connect(rig.url(), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.failover_effects").fetchone()[0] == 2


def test_failovers_mid_drain_lose_no_job_and_apply_none_twice(rig: FailoverRig, tmp_path) -> None:
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        job_ids = [publish(conn, {"n": n, "work_ms": WORK_MS}, queue=QUEUE) for n in range(JOBS)]
    rig.wait_caught_up()  # every message on the standby: what a failover may lose is the drain's only
    worker = SupervisedWorker(rig.url(), "support.failover_consumers:effect", tmp_path / "worker.log").start()
    try:
        counted = fail_over_mid_drain(rig, failovers=FAILOVERS, jobs=JOBS, worker=worker)
        wait_until(lambda: queue_empty(rig, QUEUE), 120, f"every message of {QUEUE} acked")
    finally:
        worker.stop()
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        outcome = tally(conn, job_ids)
    assert rig.failovers == FAILOVERS
    assert all(count < JOBS for count in counted), f"a failover came after the drain: {counted} of {JOBS}"
    assert (outcome.lost, outcome.doubled, outcome.both) == ([], [], []), outcome.figures()
    assert outcome.effects + outcome.dead_letters == JOBS
    assert worker.exits == []  # the worker rode out each failover by reconnecting: its supervisor never restarted it
