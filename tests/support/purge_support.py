"""What the purge's tests share: the test TTL guard, the batch-duration target no test reaches, the rows they load and the parametrizations."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest

from maintenance.jobs.purge.job import HASHED_PENDING_LIMIT, Purger, on_the_batch_clock
from maintenance.jobs.purge.paths import fetch_limited
from maintenance.jobs.purge.settings import PurgeFields
from maintenance.jobs.purge.sql import (
    SET_BATCH_LIMITS,
)
from support.factories import CONSUMER, TENANT, add_dead_letter, add_fence
from support.harness_support import backdate_replay
from support.jobs import GUARD, env
from support.logcapture import LoggedEvents

WINDOW = GUARD.window
PROTECTED = 2 * WINDOW  # the test guard's margin x window: fences processed in the last 20 minutes stay
SECOND = timedelta(seconds=1)
# A target batch duration no test batch reaches, so the batch size only grows (up to the largest)
# and a loaded machine cannot change how many batches a test sees. Tests of the steering itself
# inject the batch durations instead.
UNHURRIED = timedelta(hours=1)


def add_old_expired_fences(conn: psycopg.Connection, now: datetime, count: int) -> list[uuid.UUID]:
    """Fences processed 10 days ago that expired 3 days ago, one second apart in expiry order."""
    return [
        add_fence(
            conn, processed_at=now - timedelta(days=10) + i * SECOND, expires_at=now - timedelta(days=3) + i * SECOND
        )
        for i in range(count)
    ]


def handled_at(conn: psycopg.Connection, job_id: uuid.UUID) -> datetime:
    """When the database stamped the handling of the replayed delivery of ``job_id``'s dead letter."""
    return conn.execute(
        "SELECT replay_handled_at FROM core.dead_letters WHERE job_id = %s AND status = 'replayed'", (job_id,)
    ).fetchone()[0]


def remaining(conn: psycopg.Connection) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("SELECT job_id FROM core.processed_jobs")}


# What a test may give purger() besides the purge's settings: the JobEnv's parts, and Purger's own keywords.
ENV_PARTS = ("guard", "stop", "monotonic", "sleep")
PURGER_KEYWORDS = ("batch_clock", "timed_by", "slow_start_batch_size", "hashed_pending_limit")


def purger(db, **given) -> Purger:
    """A purge with the test guard (support.jobs.env); the index path unless ``purge_strategy`` says otherwise;
    batches never too slow. ``given``: PurgeFields' fields, the env's parts and Purger's keywords, by name."""
    parts = {name: given.pop(name) for name in ENV_PARTS if name in given}
    keywords = {name: given.pop(name) for name in PURGER_KEYWORDS if name in given}
    fields = PurgeFields(**{"purge_strategy": "index", "purge_target_batch_duration": UNHURRIED} | given)
    return Purger(fields, env(db, **parts), **keywords)


# The rules of what is deleted hold for both access paths.
BOTH_PATHS = pytest.mark.parametrize("strategy", ["index", "sweep"])


# Both spellings of the replay guard: a hash of the pending job_ids, or an index probe per row.
REPLAY_GUARDS = pytest.mark.parametrize("hashed_pending_limit", [HASHED_PENDING_LIMIT, 0], ids=["hashed", "probed"])


def batch_clock(*durations_ms: float):
    """A batch clock under which the n-th batch takes ``durations_ms[n]`` ms (the last repeats)."""
    durations = itertools.chain(durations_ms, itertools.repeat(durations_ms[-1]))
    readings = itertools.chain.from_iterable((0.0, ms / 1000) for ms in durations)  # start, end of each batch
    return lambda: next(readings)


def steered(db, clock, **given) -> Purger:
    """An index-path purge aiming at 20 ms per batch, timed by ``clock``."""
    target = {"purge_target_batch_duration": timedelta(milliseconds=20)}
    return purger(db, **target | given, batch_clock=clock, timed_by=on_the_batch_clock)


def batch_sizes(events: LoggedEvents) -> list[tuple[int, int]]:
    """(batch size, rows deleted) of each batch, in order."""
    return [(e["batch_size"], e["num_deleted"]) for e in events.named("maintenance.purge.batch_deleted")]


# --- the two access paths, and auto's choice ---------------------------------------------------
# Fences loaded in one statement: :rows of them, :expired_share of them processed 10 days ago and
# expired 3 days ago, the rest processed a day ago and expiring in 6 days; in expiry order, or
# in random physical order.
LOAD_FENCES = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(), t.processed_at, t.processed_at + interval '7 days'
  FROM generate_series(1, %(rows)s) AS g
 CROSS JOIN LATERAL (SELECT CASE WHEN g <= %(rows)s * %(expired_share)s
                                 THEN %(now)s - interval '10 days' + g * interval '1 second'
                                 ELSE %(now)s - interval '1 day' + g * interval '1 second' END AS processed_at) AS t
 ORDER BY {layout}"""


def load_fences(conn: psycopg.Connection, now: datetime, rows: int, expired_share: float, *, shuffled: bool) -> None:
    layout = "random()" if shuffled else "t.processed_at"
    conn.execute(LOAD_FENCES.format(layout=layout), {"rows": rows, "expired_share": expired_share, "now": now})
    conn.execute("VACUUM (ANALYZE) core.processed_jobs")


def table_blocks(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT pg_relation_size('core.processed_jobs') / current_setting('block_size')::int"
    ).fetchone()[0]


def add_mixed_fences(conn: psycopg.Connection, now: datetime) -> None:
    """Fences on both sides of every cutoff, in random physical order, over several pages."""
    load_fences(conn, now, 1500, 0.5, shuffled=True)
    cases = []
    for _ in range(20):
        cases += [
            # expires_at one second on either side of the cutoff
            (now - timedelta(days=8), now - SECOND),
            (now - timedelta(days=8), now + SECOND),
            # short-TTL fences processed just outside and just inside margin x window
            (now - PROTECTED - SECOND, now - PROTECTED + timedelta(minutes=1)),
            (now - PROTECTED + SECOND, now - PROTECTED + timedelta(minutes=1)),
        ]
    for processed_at, expires_at in cases:
        add_fence(conn, processed_at=processed_at, expires_at=expires_at)
    held = conn.execute(
        "SELECT job_id FROM core.processed_jobs WHERE expires_at < %s AND processed_at < %s ORDER BY random() LIMIT 60",
        (now, now - PROTECTED),
    ).fetchall()
    for i, (job_id,) in enumerate(held):
        kind = i % 4
        add_dead_letter(
            conn,
            job_id=job_id,
            status=("pending_review", "replayed", "discarded", "replayed")[kind],
            handled="duplicate" if kind == 1 else None,
        )
        if kind == 1:  # replayed deliveries handled a second either side of margin x window before the cutoff
            backdate_replay(
                conn, job_id, now - PROTECTED + (SECOND if (i // 4) % 2 else -SECOND), stamp="replay_handled_at"
            )
        if kind == 3:  # replays a month old whose deliveries are still outstanding
            backdate_replay(conn, job_id, now - timedelta(days=30))


def expected_after_purge(conn: psycopg.Connection, now: datetime) -> set[uuid.UUID]:
    """The fences the rules keep, computed here row by row."""
    pending = {
        r[0]
        for r in conn.execute(
            "SELECT job_id FROM core.dead_letters WHERE status = 'pending_review'"
            " OR (status = 'replayed' AND (replay_handled_at IS NULL OR replay_handled_at >= %s))",
            (now - PROTECTED,),
        )
    }
    rows = conn.execute("SELECT job_id, processed_at, expires_at FROM core.processed_jobs").fetchall()
    return {
        job_id
        for job_id, processed_at, expires_at in rows
        if expires_at >= now or processed_at >= now - PROTECTED or job_id in pending
    }


# --- durable executions ----------------------------------------------------------------------
def executions(conn: psycopg.Connection) -> dict[uuid.UUID, str]:
    return dict(conn.execute("SELECT job_id, status FROM core.executions").fetchall())


TTL = GUARD.ttl


# --- a table without statistics, or with stale ones (a restore, a bulk load, autovacuum behind) ---
# Fences loaded in one statement with autovacuum kept off the table. Never analyzed: the planner
# has no row count (reltuples -1) and no histogram. Stale: analyzed while it held 2 000 fresh
# fences (processed now, expiring within a week), then the expired ones bulk loaded — the
# histograms say no row is old enough to delete, so an index on the time guards looks free.
LOAD_UNANALYZED = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(),
       %(now)s - interval '10 days' + g * interval '1 ms', %(now)s - interval '3 days' + g * interval '1 ms'
  FROM generate_series(1, %(rows)s) AS g"""
LOAD_FRESH = """
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'points.credit', gen_random_uuid(), %(now)s, %(now)s + random() * interval '7 days'
  FROM generate_series(1, 2000)"""
STATISTICS = pytest.mark.parametrize("statistics", ["never", "stale"], ids=["never-analyzed", "stale"])


def planner_statistics(conn: psycopg.Connection, table: str) -> tuple[float, int]:
    """The planner's row count of ``core.<table>`` and how many of its columns pg_stats describes."""
    return conn.execute(
        "SELECT c.reltuples, (SELECT count(*) FROM pg_stats WHERE schemaname = 'core' AND tablename = %(t)s)"
        "  FROM pg_class AS c WHERE c.oid = ('core.' || %(t)s)::regclass",
        {"t": table},
    ).fetchone()


def load_unanalyzed_fences(conn: psycopg.Connection, now: datetime, rows: int, statistics: str = "never") -> None:
    """``rows`` expired fences in expiry order, on a table never analyzed or analyzed before the load (``statistics``)."""
    conn.execute("ALTER TABLE core.processed_jobs SET (autovacuum_enabled = false)")
    if statistics == "stale":
        conn.execute(LOAD_FRESH, {"now": now})
        conn.execute("ANALYZE core.processed_jobs")
    conn.execute(LOAD_UNANALYZED, {"now": now, "rows": rows})
    reltuples, described = planner_statistics(conn, "processed_jobs")
    assert (reltuples, described == 0) == ((-1, True) if statistics == "never" else (2000, False))


def plan_nodes(plan: dict) -> Iterator[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


def rows_read(
    conn: psycopg.Connection, statement: str, params: dict, table: str, limits: str = SET_BATCH_LIMITS
) -> tuple[int, set[str]]:
    """Run ``statement`` as the purge sends it (under ``limits``), under EXPLAIN ANALYZE: the rows its scans of ``table`` read (the TID scan of the DELETE aside), and the node types."""
    (explained,) = fetch_limited(conn, "5s", f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params, limits)
    nodes = list(plan_nodes(explained[0]["Plan"]))
    scans = [n for n in nodes if n.get("Relation Name") == table and n["Node Type"] not in ("Tid Scan", "ModifyTable")]
    return sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans), {n["Node Type"] for n in nodes}


# Executions in their final state, one tuple each, as a restore or a bulk load leaves them: a table
# with no dead versions, as small as its rows. (add_execution's updates leave three dead versions
# per row, and how many of them pruning reclaims depends on the transactions open on the whole
# server at the time: the table's size, which the planner weighs, varied from run to run.)
LOAD_EXECUTIONS = """
ALTER TABLE core.executions DISABLE TRIGGER executions_guard;
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, payload, status, lease_expires_at, leased_by, takes,
                             reason, reason_action, created_at, status_changed_at)
SELECT gen_random_uuid(), %(consumer)s, %(consumer)s, %(tenant)s, '{"member_id": "m-1", "points": 10}', %(status)s,
       CASE WHEN %(status)s = 'RUNNING' THEN now() + interval '30 seconds' END,
       CASE WHEN %(status)s = 'RUNNING' THEN 'factory' END, 1,
       CASE WHEN %(status)s = 'FAILED' THEN 'notify: the ledger refused the request' END,
       CASE WHEN %(status)s = 'FAILED' THEN 'notify' END,
       now() - %(age)s::interval, now() - %(age)s::interval + g * interval '1 millisecond'
  FROM generate_series(1, %(rows)s) AS g;
ALTER TABLE core.executions ENABLE TRIGGER executions_guard"""


def load_executions(conn: psycopg.Connection, status: str, rows: int, age: str = "0 seconds") -> None:
    """``rows`` executions in ``status``, entered ``age`` ago, one tuple each (LOAD_EXECUTIONS)."""
    params = {"consumer": CONSUMER, "tenant": TENANT, "status": status, "age": age, "rows": rows}
    for statement in LOAD_EXECUTIONS.split(";"):
        conn.execute(statement, params if "%(" in statement else None)


# --- the operations API's idempotency keys ----------------------------------------------------
ADD_IDEMPOTENCY_KEY = """
INSERT INTO core.api_idempotency_keys (idempotency_key, operator, method, route, request_fingerprint,
                                       response_status, response_body, created_at)
VALUES (%(key)s, 'ops:ana@example.com', 'POST', '/v1/core/dead-letters/{id}/replay', 'f', 200, '{}', %(created_at)s)"""


RESOLUTION_400_DAYS_AGO = """
INSERT INTO core.execution_resolutions
       (execution_id, job_id, consumer, business_scope, idempotency_key, operator, command, command_body,
        command_fingerprint, evidence_kind, evidence_reference, evidence_reason, checkpoints_before, fencing_token,
        status_after, response_status, response_body, resolved_at)
SELECT id, job_id, consumer, business_scope, 'resolution-key', 'ops:test', 'RESUME', '{}', 'f', 'RESULT_VERIFIED',
       'CASE-1', 'checked', '[]', 1, 'PENDING', 200, '{}', now() - interval '400 days'
  FROM core.executions WHERE id = %(id)s"""


def idempotency_keys(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT idempotency_key FROM core.api_idempotency_keys")}
