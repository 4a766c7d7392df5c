"""The take of a new execution, sent in one round trip (harness/durable/executor.py, harness/pipelined.py).

Its insert and its fence probe are two statements of one pipelined transaction, so a delivery
whose insert waited for a worker's final transaction still sees that success's fence, and the
execution it inserted is dropped again before the take commits (J-AC8).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import psycopg
from support.harness_support import fences, row_counts, wait_until_waiting_on_lock
from support.ledger_support import deliver, execution

from harness.queue.port import Acked, Duplicate, Outcome


def test_a_take_that_waited_for_a_success_sees_its_fence_and_leaves_no_execution(conn, database_url, ledger_consumer):
    """A delivery whose insert waited on the final transaction of the job's success is a Duplicate, and only that success's fence and work remain."""
    job_id = uuid.uuid4()
    in_final_write, release = threading.Event(), threading.Event()
    original = ledger_consumer.handler

    def held_final_write(work_conn: psycopg.Connection, payload: Any, ctx: Any) -> None:
        original(work_conn, payload, ctx)
        in_final_write.set()
        assert release.wait(20), "the test never released the final write"

    outcomes: dict[str, Outcome] = {}

    def first_worker() -> None:
        with psycopg.connect(database_url, autocommit=True) as first:
            outcomes["first"] = deliver(first, replace(ledger_consumer, handler=held_final_write), job_id)

    worker = threading.Thread(target=first_worker)
    worker.start()
    assert in_final_write.wait(20), "the first delivery never reached its final write"
    before = row_counts(conn)
    with psycopg.connect(database_url, autocommit=True) as second:
        pid = second.info.backend_pid
        redelivery = threading.Thread(
            target=lambda: outcomes.setdefault("second", deliver(second, ledger_consumer, job_id))
        )
        redelivery.start()
        wait_until_waiting_on_lock(conn, pid)  # its insert waits on the execution the success is deleting
        release.set()
        worker.join(20)
        redelivery.join(20)
    assert isinstance(outcomes["first"], Acked)
    assert isinstance(outcomes["second"], Duplicate)
    assert execution(conn, job_id) is None
    assert fences(conn, job_id) == 1
    after = row_counts(conn)
    changed = {t: after[t] - before[t] for t in after if after[t] != before[t]}
    assert changed == {
        "core.executions": -1,
        "core.execution_checkpoints": -3,
        "core.processed_jobs": 1,
        "example.loyalty_points": 1,
    }
