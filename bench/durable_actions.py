"""Benchmark of durable actions: what the checkpoints cost per job, beside DBOS Transact's (docs/spec.md NF-13, NF-14).

    uv run --group bench python bench/durable_actions.py            # defaults below
    uv run --group bench python bench/durable_actions.py --jobs 500 --warm-up 50

One job is the ledger points consumer's (harness/examples/ledger_points.py): a READ_ONLY lookup,
an IDEMPOTENT_WRITE credit (with its stable key) and a NON_IDEMPOTENT_WRITE notify, over HTTP to
the local loyalty ledger (demo/core_jobs_demo/ledger.py, a real socket on 127.0.0.1), then the
final local write (the balance upsert) with its fence. It is run three ways, **interleaved job by
job** in one process, so drift on the shared 2-core machine hits all three alike:

(a) **baseline** — a plain consumer (no actions) whose handler makes the same three calls and
    then the same write, through ``harness.handling.handle``: one transaction (fence + write),
    no checkpoint. This is what a consumer did before durable actions.
(b) **ours** — the durable consumer through the same ``handle()``: the execution taken, the two
    writes' STARTED checkpoints committed before their sends, the final transaction (fence,
    write, delete of the execution).
(c) **DBOS** — a DBOS Transact workflow (its id the job's id, launched in-process and called
    synchronously) with the three calls as ``@DBOS.step()``s and the same fence + write as a
    datasource transaction (READ COMMITTED, as ours) on the same database; DBOS's system
    database is a scratch database on the same server.

Why ``handle()`` and not the worker: the worker adds the queue's claim and ack to every job,
which neither the baseline nor DBOS's direct call has; ``handle()`` is the unit that differs.
The calls are the durable consumer's own action functions in all three, on one HTTP client.

Printed: the median and p95 per job of each, the **checkpoint overhead** (b) − (a) (target ≤
1.5 ms median), DBOS's overhead (c) − (a) (target: ours ≤ DBOS's) and their ratio; what a
commit costs on this server (a durable one, as every checkpoint is, and a read-only round trip);
then ``--breakdown-jobs`` more jobs of (a) and (b) with every round trip to PostgreSQL timed
one by one (each statement, ``BEGIN`` and ``COMMIT``): where (b)'s overhead goes. At the end every variant's fences and ledger effects are counted — one per job and write —
and no execution may be left behind (a success leaves only its fence).

Server: ``HARNESS_BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``
(the benchmark creates and drops its own scratch databases there).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from core_jobs_demo import scratch_database
from core_jobs_demo.ledger import LoyaltyLedger
from harness.consumer.actions import Action, ActionContext, idempotency_key
from harness.consumer.consumer import Consumer, JobContext
from harness.consumer.retry import RetryPolicy
from harness.examples.ledger_points import make_consumer
from harness.handling import INSERT_FENCE, handle
from harness.metrics import HarnessMetrics
from harness.pg import connect
from harness.queue.port import Acked, Delivery, Envelope
from maintenance.runtime import migrate
from maintenance.runtime.logs import configure_logging

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TTL = timedelta(days=7)
LEASE = timedelta(minutes=5)
TENANT = uuid.UUID("00000000-0000-4000-8000-0000000000bd")
MEMBERS = 100  # jobs cycle through this many members' balances

# The cost of one durable commit: a transaction that has an xid writes a commit record and,
# with synchronous_commit on (the harness's checkpoints), waits for its WAL flush.
DURABLE_COMMIT = "SELECT pg_current_xact_id()"

# What each variant left: fences by consumer, and executions of any state (none: a success leaves only its fence).
COUNT_FENCES = "SELECT consumer, count(*) FROM core.processed_jobs GROUP BY consumer"
COUNT_EXECUTIONS = "SELECT count(*) FROM core.executions"


class StatementTimes:
    """Times every round trip on one connection while :meth:`tracing`: each statement, BEGIN and COMMIT."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.times: dict[str, list[float]] = defaultdict(list)

    def _took(self, what: str, started: float) -> None:
        self.times[what].append((time.perf_counter() - started) * 1000)

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        execute, transaction = self.conn.execute, self.conn.transaction

        def traced_execute(query: Any, params: Any = None, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(query, params, **kwargs)
            finally:
                self._took(" ".join(str(query).split())[:72], started)

        @contextlib.contextmanager
        def traced_transaction(*args: Any, **kwargs: Any) -> Iterator[Any]:
            block = transaction(*args, **kwargs)
            started = time.perf_counter()
            entered = block.__enter__()
            self._took("BEGIN", started)
            try:
                yield entered
            except BaseException as exc:
                if not block.__exit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                started = time.perf_counter()
                block.__exit__(None, None, None)
                self._took("COMMIT", started)

        self.conn.execute, self.conn.transaction = traced_execute, traced_transaction  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self.conn.execute, self.conn.transaction


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def as_json(result: Any) -> Any:
    """An action's result as DBOS stores it: plain JSON."""
    return result.model_dump(mode="json") if isinstance(result, BaseModel) else result


def context_of(job_id: uuid.UUID, consumer: str, action: Action, results: dict[str, Any]) -> ActionContext:
    """The context of an action's first attempt, with its stable key."""
    return ActionContext(
        job_id=job_id,
        tenant_id=TENANT,
        correlation_id=None,
        consumer=consumer,
        action=action.name,
        attempt=1,
        idempotency_key=idempotency_key(job_id, consumer, action.name),
        results=results,
    )


def checked_call(action: Action, payload: Any, ctx: ActionContext) -> Any:
    """The action's call, its answer checked against its output contract as the harness does."""
    result = as_json(action.call(payload, ctx))
    return action.output.model_validate(result) if action.output else result


def calls_in_handler(durable: Consumer, name: str) -> Consumer:
    """The baseline: a plain consumer whose handler makes ``durable``'s calls, then its final write."""

    def handler(conn: psycopg.Connection, payload: Any, ctx: JobContext) -> None:
        results: dict[str, Any] = {}
        for action in durable.actions:
            results[action.name] = checked_call(action, payload, context_of(ctx.job_id, name, action, results))
        durable.handler(conn, payload, dataclasses.replace(ctx, results=results))

    return Consumer(name=name, queue=name, payload_schema=durable.payload_schema, handler=handler)


@dataclass
class DbosJob:
    """DBOS launched: ``run(envelope)`` runs the job as a workflow; ``engines`` are DBOS's SQLAlchemy engines."""

    run: Callable[[Envelope], None]
    engines: dict[str, Any]


@contextlib.contextmanager
def counting(engines: dict[str, Any]) -> Iterator[Counter[str]]:
    """Statements and commits DBOS sends on its engines while the block runs (its background threads' too)."""
    import sqlalchemy

    counts: Counter[str] = Counter()
    listeners = []
    for label, engine in engines.items():

        def statement(*_args: Any, label: str = label) -> None:
            counts[f"{label}: statements"] += 1

        def commit(*_args: Any, label: str = label) -> None:
            counts[f"{label}: commits"] += 1

        listeners += [(engine, "before_cursor_execute", statement), (engine, "commit", commit)]
    for listener in listeners:
        sqlalchemy.event.listen(*listener)
    try:
        yield counts
    finally:
        for listener in listeners:
            sqlalchemy.event.remove(*listener)


@contextlib.contextmanager
def dbos_workflow(system_url: str, app_url: str, durable: Consumer, name: str) -> Iterator[DbosJob]:
    """DBOS launched in-process, the job registered as a workflow of 3 steps + a transaction."""
    import sqlalchemy  # DBOS's own dependency
    from dbos import DBOS, SetWorkflowID, SQLAlchemyDatasource

    dbos = DBOS(config={"name": "core-jobs-bench", "system_database_url": system_url, "log_level": "ERROR"})
    datasource = SQLAlchemyDatasource.create(sqlalchemy.make_url(app_url).render_as_string(hide_password=False))
    steps: dict[str, Callable[..., Any]] = {}
    for action in durable.actions:

        def step(payload: dict, job_id: str, results: dict, action: Action = action) -> Any:
            ctx = context_of(uuid.UUID(job_id), name, action, results)
            return as_json(checked_call(action, durable.payload_schema.model_validate(payload), ctx))

        steps[action.name] = DBOS.step(name=action.name)(step)

    @datasource.transaction(isolation_level="READ COMMITTED")
    def final_write(payload: dict, job_id: str, results: dict) -> None:
        conn = datasource.sql_session().connection().connection.driver_connection  # the transaction's psycopg one
        conn.execute(INSERT_FENCE, {"job_id": job_id, "consumer": name, "tenant_id": TENANT, "ttl": TTL}).fetchone()
        outputs = {
            a.name: a.output.model_validate(results[a.name]) if a.output else results[a.name] for a in durable.actions
        }
        ctx = JobContext(
            job_id=uuid.UUID(job_id),
            tenant_id=TENANT,
            correlation_id=None,
            attempt=1,
            queue=name,
            consumer=name,
            results=outputs,
        )
        durable.handler(conn, durable.payload_schema.model_validate(payload), ctx)

    @DBOS.workflow(name="ledger_points")
    def workflow(payload: dict, job_id: str) -> None:
        results: dict[str, Any] = {}
        for action in durable.actions:
            results[action.name] = steps[action.name](payload, job_id, results)
        final_write(payload, job_id, results)

    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.ERROR)

    def run(envelope: Envelope) -> None:
        with SetWorkflowID(str(envelope.job_id)):
            workflow(envelope.payload, str(envelope.job_id))

    engines = {"DBOS system database": dbos._sys_db.engine, "application database": datasource.engine}
    try:
        yield DbosJob(run=run, engines=engines)
    finally:
        DBOS.destroy(destroy_registry=True)


def measure(app_url: str, system_url: str, ledger: LoyaltyLedger, jobs: int, warm_up: int, breakdown_jobs: int) -> dict:
    """Per-job wall times in ms of the three variants, interleaved; the commit costs; what each left."""
    ours = make_consumer(ledger.url, name="bench.ours", queue="bench.ours")
    durable = ours  # its action functions (one HTTP client) are the baseline's and DBOS's too
    baseline = calls_in_handler(durable, "bench.baseline")
    metrics = HarnessMetrics(CollectorRegistry())
    policy = RetryPolicy()
    times: dict[str, list[float]] = {"baseline": [], "ours": [], "dbos": []}
    with connect(app_url, autocommit=True) as conn, dbos_workflow(system_url, app_url, durable, "bench.dbos") as dbos:

        def through_handle(consumer: Consumer) -> Callable[[Envelope], None]:
            def run(envelope: Envelope) -> None:
                delivery = Delivery(queue=consumer.queue, envelope=envelope, attempt=1)
                outcome = handle(conn, consumer, delivery, policy=policy, fence_ttl=TTL, metrics=metrics)
                assert outcome == Acked(), outcome

            return run

        variants = {"baseline": through_handle(baseline), "ours": through_handle(ours), "dbos": dbos.run}
        for i in range(warm_up + jobs):
            payload = {"member_id": f"m-{i % MEMBERS}", "points": 1}
            for name, run in variants.items():
                envelope = Envelope(job_id=uuid.uuid4(), payload=payload, tenant_id=TENANT)
                started = time.perf_counter()
                run(envelope)
                if i >= warm_up:
                    times[name].append((time.perf_counter() - started) * 1000)

        breakdown = {}
        for name in ("baseline", "ours"):
            traced = StatementTimes(conn)
            with traced.tracing():
                for i in range(breakdown_jobs):
                    payload = {"member_id": f"m-{i % MEMBERS}", "points": 1}
                    variants[name](Envelope(job_id=uuid.uuid4(), payload=payload, tenant_id=TENANT))
            breakdown[name] = traced
        with counting(dbos.engines) as dbos_counts:
            for i in range(breakdown_jobs):
                payload = {"member_id": f"m-{i % MEMBERS}", "points": 1}
                dbos.run(Envelope(job_id=uuid.uuid4(), payload=payload, tenant_id=TENANT))

        commits: dict[str, list[float]] = {"durable commit": [], "read-only round trip": []}
        for _ in range(max(200, jobs // 2)):
            started = time.perf_counter()
            with conn.transaction():
                conn.execute(DURABLE_COMMIT).fetchone()
            commits["durable commit"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            commits["read-only round trip"].append((time.perf_counter() - started) * 1000)
        fences = dict(conn.execute(COUNT_FENCES).fetchall())
        executions = conn.execute(COUNT_EXECUTIONS).fetchone()[0]
    effects = {endpoint: len(ledger.effects(endpoint=endpoint)) for endpoint in ("credits", "notify")}
    return {
        "times": times,
        "commits": commits,
        "breakdown": breakdown,
        "dbos_counts": dbos_counts,
        "fences": fences,
        "executions": executions,
        "effects": effects,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="measured jobs per variant (default 1000)")
    parser.add_argument("--warm-up", type=int, default=100, help="unmeasured jobs per variant first (default 100)")
    parser.add_argument(
        "--breakdown-jobs", type=int, default=200, help="jobs of (a) and (b) with every statement timed (default 200)"
    )
    args = parser.parse_args()
    configure_logging(level="ERROR")
    server = os.environ.get("HARNESS_BENCH_DATABASE_URL", DEFAULT_SERVER)

    with (
        scratch_database(server, prefix="core_jobs_bench") as app_url,
        scratch_database(server, prefix="core_jobs_bench_dbos") as system_url,
        LoyaltyLedger() as ledger,
    ):
        migrate.upgrade(app_url)
        found = measure(app_url, system_url, ledger, args.jobs, args.warm_up, args.breakdown_jobs)

    times = found["times"]
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"Durable actions, {args.jobs} jobs per variant after {args.warm_up} of warm-up, interleaved"
        " (3 HTTP calls to the local ledger + the final write with its fence; ms per job):"
    )
    for name, label in (
        ("baseline", "(a) baseline: calls in a plain handler"),
        ("ours", "(b) ours: durable consumer, handle()"),
        ("dbos", "(c) DBOS: workflow, 3 steps + transaction"),
    ):
        print(f"  {label:<44} median {medians[name]:7.3f}  p95 {percentile(times[name], 0.95):7.3f}")
    ours = medians["ours"] - medians["baseline"]
    dbos = medians["dbos"] - medians["baseline"]
    print(f"  checkpoint overhead (b) - (a): median {ours:+.3f} ms   target <= 1.5 ms")
    print(f"  DBOS overhead       (c) - (a): median {dbos:+.3f} ms   target: ours <= DBOS's")
    print(f"  ours / DBOS's overhead: {ours / dbos:.2f}" if dbos > 0 else "  DBOS's overhead is not positive")
    print("What a commit costs on this server (same connection, ms):")
    for name, values in found["commits"].items():
        print(f"  {name:<22} median {statistics.median(values):.3f}  p95 {percentile(values, 0.95):.3f}")
    for name, traced in found["breakdown"].items():
        n = args.breakdown_jobs
        trips = sum(len(v) for v in traced.times.values()) / n
        print(
            f"Round trips of ({'a' if name == 'baseline' else 'b'}) {name}, {n} jobs, each timed:"
            f" {trips:.1f} per job, {sum(sum(v) for v in traced.times.values()) / n:.3f} ms of them per job"
        )
        for statement, values in sorted(traced.times.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {len(values) / n:4.1f}/job  median {statistics.median(values):.3f}  {statement}")
    counts = found["dbos_counts"]
    print(
        f"(c) DBOS, {args.breakdown_jobs} more workflows, counted on its engines (its background polling included):"
        + "".join(f"\n  {counts[k] / args.breakdown_jobs:4.1f}/job  {k}" for k in sorted(counts))
    )
    timed = args.jobs + args.warm_up + args.breakdown_jobs  # each variant's
    print(
        f"Left behind: fences {found['fences']} (expected {timed} each), executions {found['executions']} (expected 0)"
    )
    print(f"  ledger effects {found['effects']} (expected {3 * timed} each: one per job and write)")


if __name__ == "__main__":
    main()
