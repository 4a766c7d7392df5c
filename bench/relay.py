"""Benchmark of the outbox relay's latency: from a replay's commit to its message on the target.

    uv run python bench/relay.py                  # 40 replays per scenario, the default 1 s interval
    uv run python bench/relay.py --replays 100 --interval 0.2

Two scratch databases on the server ``RELAY_BENCH_DATABASE_URL`` (default the local test server),
both migrated: the **outbox** (where operators replay) and the **target**, a PgQueue in the other
database standing for the broker. A relay (harness/queue/relay.py) runs in its own thread, in its
own loop (``Relay.run``) at ``--interval``, exactly as ``core-jobs relay`` does.

Scenarios, interleaved replay by replay (the machine is shared and noisy):

- **direct** (the baseline): a dead letter replayed in the target's own database — what a queue
  on the reference adapter sees, where the table is the queue: available at the commit. What it
  measures is this script's polling resolution.
- **relayed**: a dead letter replayed in the outbox's database (``maintenance.operations.
  dead_letters.replay``, its own transaction), then published to the target by the relay.

Each replay starts at a random moment of the relay's cycle (a random pause before it), so the
figures sample the whole interval. A poller on the target's database sees the message (1 ms
polls). Printed: p50 / p95 / max in ms of each, the ratio relayed / direct, and the bound —
interval + one batch — where "one batch" is measured too: ``run_once`` over 100 outbox rows.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import DEFAULT_SERVER, percentile
from core_jobs_demo import scratch_database
from harness.dead_letters import DeadLetter, write_dead_letter
from harness.pg import connect
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Envelope
from harness.queue.relay import DEFAULT_INTERVAL, Relay
from maintenance.operations.dead_letters import replay
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

QUEUE = "bench.relay"
POLL_S = 0.001
SEEN = "SELECT 1 FROM core.queue_messages WHERE job_id = %(job_id)s AND queue = %(queue)s"


def letter(conn: psycopg.Connection) -> tuple[int, uuid.UUID]:
    """A pending dead letter of QUEUE, as the harness writes it; (its id, its job id)."""
    job_id = uuid.uuid4()
    return write_dead_letter(
        conn,
        DeadLetter(
            job_id=job_id,
            queue=QUEUE,
            consumer="bench.relay",
            payload={"member_id": "m-1", "points": 1},
            attempts=5,
            last_error="TransientError: bench",
        ),
    ), job_id


def replay_and_wait(outbox: psycopg.Connection, target: psycopg.Connection, dead: tuple[int, uuid.UUID]) -> float:
    """ms from the replay's commit (on ``outbox``) until ``target`` holds its message (found by its job id)."""
    letter_id, job_id = dead
    replay(outbox, [letter_id], operator="bench")
    committed = time.perf_counter()
    while target.execute(SEEN, {"job_id": job_id, "queue": QUEUE}).fetchone() is None:
        time.sleep(POLL_S)
    return (time.perf_counter() - committed) * 1000


def one_batch_ms(url: str, target_url: str, rounds: int = 5, size: int = 100) -> list[float]:
    """ms of one ``run_once`` moving ``size`` outbox rows (claim, publish_many, ack) to the target."""
    times = []
    with connect(url, autocommit=True) as conn, connect(target_url, autocommit=True) as target_conn:
        source, target = PgQueue(conn), PgQueue(target_conn)
        for _ in range(rounds):
            source.publish_many(
                [(f"{QUEUE}.batch", Envelope(job_id=uuid.uuid4(), payload={"n": i})) for i in range(size)]
            )
            started = time.perf_counter()
            result = Relay(source, target, [f"{QUEUE}.batch"], batch_size=size).run_once()
            times.append((time.perf_counter() - started) * 1000)
            assert result.published == size
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=40, help="replays per scenario (default 40)")
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL.total_seconds(), help="the relay's interval, s (default 1)"
    )
    args = parser.parse_args()
    configure_logging(fmt="console", level="WARNING")  # the relay's per-batch events are not the figures
    server = os.environ.get("RELAY_BENCH_DATABASE_URL", DEFAULT_SERVER)
    interval = timedelta(seconds=args.interval)
    with (
        scratch_database(server, "core_jobs_bench_outbox") as url,
        scratch_database(server, "core_jobs_bench_target") as target_url,
    ):
        migrate.upgrade(url)
        migrate.upgrade(target_url)
        batch = one_batch_ms(url, target_url)
        stop = threading.Event()
        with (
            connect(url, autocommit=True) as outbox,
            connect(target_url, autocommit=True) as target,
            connect(url, autocommit=True) as relay_conn,
            connect(target_url, autocommit=True) as relay_target,
        ):
            relay = Relay(PgQueue(relay_conn), PgQueue(relay_target), [QUEUE])
            thread = threading.Thread(target=relay.run, args=(stop,), kwargs={"interval": interval}, daemon=True)
            thread.start()
            relayed_letters = [letter(outbox) for _ in range(args.replays)]
            direct_letters = [letter(target) for _ in range(args.replays)]
            direct: list[float] = []
            relayed: list[float] = []
            try:
                for relayed_id, direct_id in zip(relayed_letters, direct_letters, strict=True):
                    time.sleep(random.uniform(0, args.interval))  # a random phase of the relay's cycle
                    direct.append(replay_and_wait(target, target, direct_id))
                    time.sleep(random.uniform(0, args.interval))
                    relayed.append(replay_and_wait(outbox, target, relayed_id))
            finally:
                stop.set()
                thread.join()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"relay latency, commit -> on the target, {args.replays} replays each (ms; interval {args.interval:g} s; "
        f"load average {load} on {os.cpu_count()} cores):"
    )
    print(f"  {'':<10} {'p50':>8} {'p95':>8} {'max':>8}")
    for name, values in (("direct", direct), ("relayed", relayed)):
        print(f"  {name:<10} {percentile(values, 0.5):>8.1f} {percentile(values, 0.95):>8.1f} {max(values):>8.1f}")
    print(
        f"  ratio relayed / direct: p50 x{percentile(relayed, 0.5) / percentile(direct, 0.5):.0f}, "
        f"p95 x{percentile(relayed, 0.95) / percentile(direct, 0.95):.0f}"
    )
    print(
        f"one batch of 100 outbox rows (claim, publish_many, ack): median {statistics.median(batch):.1f} ms, "
        f"max {max(batch):.1f} ms"
    )
    bound = args.interval * 1000 + max(batch)
    print(
        f"bound: interval + one batch = {bound:.0f} ms; relayed max {max(relayed):.0f} ms "
        f"({'within' if max(relayed) <= bound else 'OVER'} the bound)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
