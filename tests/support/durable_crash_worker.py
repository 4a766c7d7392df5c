"""A worker of the ledger points consumer (harness/examples/ledger_points.py) that dies hard in one action.

Usage: python durable_crash_worker.py DATABASE_URL LEDGER_URL ACTION WHEN

It runs the worker once over the queue ``points.ledger``; in ``ACTION`` it dies with
``os._exit`` (no cleanup, no rollback, no settling):

- ``before`` — before the action's call: a write's STARTED checkpoint is committed, nothing sent;
- ``after`` — once the call returned: the request was sent and answered, nothing recorded after;
- ``paused`` — once the call returned, it prints ``sent`` and waits for a line on stdin before
  going on (the parent then holds the execution's row lock, so the next commit — the next
  write's STARTED — blocks, and kills this process with SIGKILL while it waits).

The worker's connections are named ``durable-crash-worker`` (pg_stat_activity.application_name).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from datetime import timedelta

from harness.consumer.retry import RetryPolicy
from harness.examples.ledger_points import make_consumer
from harness.worker import Worker, WorkerConfig

CRASH_EXIT = 77
APPLICATION_NAME = "durable-crash-worker"


def main(database_url: str, ledger_url: str, action: str, when: str) -> None:
    consumer = make_consumer(ledger_url, timeout=2.0)

    def dying(real):
        def call(payload, ctx):
            if when == "before":
                os._exit(CRASH_EXIT)
            answer = real(payload, ctx)
            if when == "after":
                os._exit(CRASH_EXIT)
            print("sent", flush=True)
            sys.stdin.readline()
            return answer

        return call

    consumer = replace(
        consumer, actions=tuple(replace(a, call=dying(a.call)) if a.name == action else a for a in consumer.actions)
    )
    worker = Worker(
        database_url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=timedelta(days=7)),
        application_name=APPLICATION_NAME,
    )
    worker.run(once=True)
    sys.exit(0)  # not reached in a crash: the action ends the process first


if __name__ == "__main__":
    main(*sys.argv[1:5])
