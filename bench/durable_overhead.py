"""What the durable executor itself costs: a 3-action job against the same job without actions.

    uv run python bench/durable_overhead.py                # 3000 jobs per variant
    uv run python bench/durable_overhead.py --jobs 5000
    uv run python bench/durable_overhead.py --rtt-ms 0.5     # through a local proxy adding 0.5 ms per round trip

On one connection, jobs alternate between (a) a **plain** consumer — ``handle()``: validation,
the fence and a no-op handler in one transaction — and (b) a **durable** consumer with the same
handler and three no-op actions, ``READ_ONLY``, ``IDEMPOTENT_WRITE`` and ``NON_IDEMPOTENT_WRITE``
(``harness/durable/executor.py``: the take, the two writes' ``STARTED`` checkpoints, the final
transaction). The actions do nothing, so no HTTP is measured: only our own cost. Prints each
median and p95 per job, the durable overhead (target ≤ 1.5 ms median, docs/spec.md NF-13) and the round
trips per job, counted from libpq's protocol trace of one traced job of each (a round trip is a
turn from the client sending to the client reading; the timed jobs are not traced).

``--rtt-ms`` puts a local TCP proxy between the benchmark and PostgreSQL that holds every chunk
half that time each way: a database across a network, where each round trip costs its RTT
(on localhost one costs ~0.03 ms, less than psycopg's pipeline machinery costs in Python).

The server, the scratch database and the caveats are bench/harness.py's (``HARNESS_BENCH_DATABASE_URL``);
the overhead is a difference of medians measured in one run, so drift hits both variants alike.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel

from bench.harness import DEFAULT_SERVER, TENANT, TTL, percentile
from core_jobs_demo import scratch_database
from harness.consumer.actions import Action, ActionContext, Effect
from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.handling import handle
from harness.pg import connect
from harness.queue.port import Acked, Delivery, Envelope
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

LEASE = timedelta(seconds=30)
TARGET_MS = 1.5


class Points(BaseModel):
    n: int


def _noop_handler(conn: psycopg.Connection, payload: Points, ctx: JobContext) -> None:
    return None


def _noop_call(payload: Points, ctx: ActionContext) -> dict[str, bool]:
    return {"ok": True}


PLAIN = Consumer(name="bench.plain", queue="bench.plain", payload_schema=Points, handler=_noop_handler)
DURABLE = Consumer(
    name="bench.durable",
    queue="bench.durable",
    payload_schema=Points,
    handler=_noop_handler,
    actions=(
        Action(name="lookup", effect=Effect.READ_ONLY, call=_noop_call),
        Action(name="credit", effect=Effect.IDEMPOTENT_WRITE, call=_noop_call),
        Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=_noop_call),
    ),
)


def run_job(conn: psycopg.Connection, consumer: Consumer, i: int) -> None:
    """One new job through ``handle()``; it must be acked."""
    envelope = Envelope(job_id=uuid.uuid4(), payload={"n": i}, tenant_id=TENANT)
    outcome = handle(
        conn,
        consumer,
        Delivery(queue=consumer.queue, envelope=envelope, attempt=1),
        policy=RetryPolicy(),
        fence_ttl=TTL,
        lease=LEASE,
    )
    assert outcome == Acked(), outcome


def round_trips(conn: psycopg.Connection, job: Callable[[], Any]) -> int:
    """How many times the client waited for the server while ``job`` ran: turns from F to B in libpq's trace."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            job()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        directions = [line.split("\t", 1)[0] for line in trace if line.strip()]
    return sum(1 for pair in itertools.pairwise(directions) if pair == ("F", "B"))


def _forward(source: socket.socket, sink: socket.socket, one_way: float) -> None:
    """Copy ``source`` to ``sink``, each chunk held ``one_way`` seconds, in order (two threads: read, send)."""
    held: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def send() -> None:
        while True:
            due, chunk = held.get()
            if not chunk:
                break
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    while chunk := source.recv(65536):
        held.put((time.perf_counter() + one_way, chunk))
    held.put((0.0, b""))
    sender.join()


def _proxy(listener: socket.socket, host: str, port: int, one_way: float) -> None:
    """Serve ``listener`` forever: each connection forwarded to ``host:port`` with ``one_way`` held each way."""
    while True:
        client, _ = listener.accept()
        server = socket.create_connection((host, port))
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_forward, args=(client, server, one_way), daemon=True).start()
        threading.Thread(target=_forward, args=(server, client, one_way), daemon=True).start()


@contextmanager
def delaying_proxy(url: str, rtt_ms: float) -> Iterator[str]:
    """``url`` through a local TCP proxy process that adds ``rtt_ms`` to every round trip (half each way)."""
    target = conninfo_to_dict(url)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    args = (listener, str(target["host"]), int(target.get("port") or 5432), rtt_ms / 2000)
    proxy = mp.get_context("fork").Process(target=_proxy, args=args, daemon=True)
    proxy.start()
    try:
        yield make_conninfo(url, host="127.0.0.1", port=port)
    finally:
        proxy.terminate()
        proxy.join(5)
        listener.close()


def measure(url: str, jobs: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per-job wall times in ms of each variant, interleaved, and the round trips of one job of each."""
    variants = {"plain": PLAIN, "durable": DURABLE}
    times: dict[str, list[float]] = {name: [] for name in variants}
    with connect(url, autocommit=True) as conn:
        for i in range(300):  # warm-up: plans, caches, the sequence
            for consumer in variants.values():
                run_job(conn, consumer, i)
        trips = {name: round_trips(conn, lambda c=consumer: run_job(conn, c, 0)) for name, consumer in variants.items()}
        for i in range(jobs):  # interleaved, so drift on a shared machine hits both alike
            for name, consumer in variants.items():
                started = time.perf_counter()
                run_job(conn, consumer, i)
                times[name].append((time.perf_counter() - started) * 1000)
        left = conn.execute("SELECT count(*) FROM core.executions").fetchone()
        assert left == (0,), f"executions left behind: {left}"  # a success leaves only its fence
    return times, trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per variant (default 3000)")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time added by a local proxy (default 0)")
    args = parser.parse_args()
    configure_logging(level="ERROR")
    server = os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER)
    with scratch_database(server) as url:
        migrate.upgrade(url)
        if args.rtt_ms > 0:
            with delaying_proxy(url, args.rtt_ms) as proxied:
                times, trips = measure(proxied, args.jobs)
        else:
            times, trips = measure(url, args.jobs)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    network = f", {args.rtt_ms} ms added per round trip" if args.rtt_ms > 0 else ""
    print(
        f"Durable executor overhead, {args.jobs} jobs per variant, interleaved, one connection, no-op actions{network} (ms):"
    )
    for name, label in (("plain", "plain consumer (fence + no-op handler)"), ("durable", "durable, 3 no-op actions")):
        print(
            f"  {label:<40} median {medians[name]:.3f}  p95 {percentile(times[name], 0.95):.3f}"
            f"  round trips {trips[name]}"
        )
    overhead = medians["durable"] - medians["plain"]
    print(
        f"  overhead of the durable path: median {overhead:+.3f} ms, {trips['durable'] - trips['plain']:+d} round trips"
        f"   target <= {TARGET_MS} ms ({'met' if overhead <= TARGET_MS else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
