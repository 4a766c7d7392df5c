"""Benchmark of operator resolutions (docs/spec.md NF-15): p95 under 8 concurrent operators, and of an idempotent replay.

    uv run python bench/resolution.py                       # defaults below
    uv run python bench/resolution.py --requests 200 --background 20000
    uv run python bench/resolution.py --baseline main   # main's API too, in interleaved rounds

1. A scratch database (server: ``API_BENCH_DATABASE_URL``, default the local test server) with
   ``--background`` executions awaiting resolution that nobody touches and a resolution ledger of
   as many rows (what a long-lived deployment accumulates), plus one execution per measured
   request: ``RECONCILIATION_REQUIRED`` with a SUCCEEDED ``lookup`` and an UNCERTAIN ``notify``.
   Walked through the transitions the database allows (no trigger set aside), then ANALYZE.
2. ``core-jobs api`` in admin mode in its own process (:func:`bench.api.start_api`: uvicorn, the
   default pool of 8, SET ROLE core_jobs_api), publishing this file's :data:`consumer`, logged in
   as a throwaway login granted ``core_jobs_api`` and nothing more (admin mode refuses any other,
   docs/api.md; dropped at the end); the clients are 8 processes, each its own HTTP connection
   and an operator's token.
3. Scenarios, ``--requests`` each (after 40 warm-up requests), spread over the 8 clients:
   - **resolve**: a RESUME of a different execution per request, each with its own
     Idempotency-Key (lock, idempotency lookup, definition check, new token, ledger row,
     checkpoint, state, event and re-queue in one transaction);
   - **list**: the first page (50) of the executions awaiting resolution (the 100 000 untouched
     ones), as an operator's console opens it;
   - **replay of a completed one**: the same requests again after every execution was taken and
     completed (deleted) as the worker does: each answered from the ledger.
   Target p95 ≤ 50 ms each.
4. ``--baseline REF``: the API of git ``REF`` (its ``maintenance`` and ``harness``, extracted to a
   temporary directory first on its path) runs beside this tree's, on the same database with its
   own executions, and each scenario alternates between the two in ``--rounds`` rounds (the order
   reversed every other round): on a shared, noisy machine only figures taken side by side
   compare. The ratios printed are this tree's over the baseline's.
5. ``--processes 1,2``: this tree's API once per count (``CORE_JOBS_API_PROCESSES``, its
   pre-fork), each on its own executions, in the same interleaved rounds; the API CPU per
   request is the parent's and its children's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import jwt
import psycopg
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from psycopg import sql
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import api as bench_api  # bench/api.py: the API process, the 8 client processes, the percentiles

from core_jobs_demo import scratch_database
from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.examples.points import CreditPoints
from maintenance.runtime import migrate

BENCH = Path(__file__).resolve().parent


class Member(BaseModel):
    member_id: str


class Sent(BaseModel):
    message_id: str


def _not_run(payload, ctx):
    raise AssertionError("a resolution runs no action")


# The published definition the API checks resolutions against (CORE_JOBS_ADMIN_CONSUMERS=resolution:consumer).
consumer = Consumer(
    name="bench.ledger",
    queue="bench.ledger",
    payload_schema=CreditPoints,
    business_scope="loyalty",
    actions=(
        Action(name="lookup", effect=Effect.READ_ONLY, call=_not_run, output=Member),
        Action(name="notify", effect=Effect.NON_IDEMPOTENT_WRITE, call=_not_run, output=Sent),
    ),
    handler=lambda conn, payload, ctx: None,
)

# Executions awaiting resolution, walked through the allowed transitions: PENDING, RUNNING (a take),
# the checkpoints, then RECONCILIATION_REQUIRED. `tag` marks the batch in the correlation id.
SEED_EXECUTIONS = """
INSERT INTO core.executions (job_id, consumer, queue, tenant_id, correlation_id, payload, business_scope)
SELECT gen_random_uuid(), 'bench.ledger', 'bench.ledger', '00000000-0000-4000-8000-000000000001',
       %(tag)s || '-' || n, jsonb_build_object('member_id', 'm-' || n, 'points', 10), 'loyalty'
  FROM generate_series(1, %(count)s) AS n;
UPDATE core.executions SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),
       lease_expires_at = now() + interval '1 minute', takes = 1
 WHERE status = 'PENDING' AND correlation_id LIKE %(tag)s || '-%%';
INSERT INTO core.execution_checkpoints (execution_id, action, position, effect, status, attempts, result,
                                        fencing_token, finished_at)
SELECT e.id, c.action, c.position, c.effect, c.status, 1, c.result, e.fencing_token, now()
  FROM core.executions AS e
 CROSS JOIN (VALUES ('lookup', 0, 'READ_ONLY', 'SUCCEEDED', jsonb_build_object('member_id', 'm')),
                    ('notify', 1, 'NON_IDEMPOTENT_WRITE', 'UNCERTAIN', NULL::jsonb))
       AS c(action, position, effect, status, result)
 WHERE e.status = 'RUNNING' AND e.correlation_id LIKE %(tag)s || '-%%';
UPDATE core.executions SET status = 'RECONCILIATION_REQUIRED', lease_expires_at = NULL, leased_by = NULL,
       reason = 'notify: the worker was lost while the request may have been sent', reason_action = 'notify'
 WHERE status = 'RUNNING' AND correlation_id LIKE %(tag)s || '-%%'"""

# What a long-lived deployment's ledger holds: past resolutions (of executions long completed).
SEED_LEDGER = """
INSERT INTO core.execution_resolutions
       (execution_id, job_id, consumer, business_scope, idempotency_key, operator, command, command_body,
        command_fingerprint, evidence_kind, evidence_reference, evidence_reason, checkpoints_before, fencing_token,
        status_after, response_status, response_body)
SELECT -n, gen_random_uuid(), 'bench.ledger', 'loyalty', 'old-' || n, 'ops:bench', 'RESUME', '{}', md5(n::text),
       'RESULT_VERIFIED', 'CASE-' || n, 'bench', '[]', nextval('core.execution_fencing_seq'), 'PENDING', 200, '{}'
  FROM generate_series(1, %(count)s) AS n"""

# The worker's take and success: RUNNING with a new token, then deleted in the fence's transaction.
COMPLETE = """
UPDATE core.executions SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),
       lease_expires_at = now() + interval '1 minute'
 WHERE status = 'PENDING';
DELETE FROM core.executions WHERE status = 'RUNNING'"""


def run_statements(conn: psycopg.Connection, script: str, params: dict) -> None:
    for statement in script.split(";"):
        conn.execute(statement, params if "%(" in statement else None)


@contextmanager
def restricted_login(url: str) -> Iterator[str]:
    """``url`` as a new login granted ``core_jobs_api`` and nothing more (what admin mode requires); dropped after."""
    name = f"core_jobs_bench_login_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE core_jobs_api").format(sql.Identifier(name)))
    try:
        parts = urlsplit(url)
        yield parts._replace(netloc=f"{name}@{parts.hostname}:{parts.port or 5432}").geturl()
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(name)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per scenario")
    parser.add_argument("--background", type=int, default=100_000, help="untouched executions and ledger rows")
    parser.add_argument("--clients", type=int, default=bench_api.CLIENTS, help="concurrent operators (default 8)")
    parser.add_argument("--baseline", help="a git ref: its API measured too, in rounds interleaved with this tree's")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per scenario (default 4)")
    parser.add_argument(
        "--processes", default="1", help="CORE_JOBS_API_PROCESSES of this tree's API, e.g. 1,2: one API per count"
    )
    args = parser.parse_args()
    bench_api.CLIENTS = args.clients
    server = os.environ.get("API_BENCH_DATABASE_URL", bench_api.DEFAULT_SERVER)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    args.processes = [int(p) for p in args.processes.split(",")]
    n = (args.requests + 40) * (len(args.processes) + (1 if args.baseline else 0))
    with tempfile.TemporaryDirectory() as tmp, scratch_database(server, "core_jobs_bench_resolution") as url:
        if args.baseline:
            args.baseline_dir = baseline_source(args.baseline, str(Path(tmp)))
        key_file = Path(tmp, "issuer.pem")
        key_file.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
        migrate.upgrade(url)
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            run_statements(conn, SEED_EXECUTIONS, {"tag": "background", "count": args.background})
            with conn.transaction():  # past rows of executions long gone: their event trigger set aside
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute(SEED_LEDGER, {"count": args.background})
            run_statements(conn, SEED_EXECUTIONS, {"tag": "target", "count": n})
            conn.execute("ANALYZE")
            targets = [
                r[0] for r in conn.execute("SELECT id FROM core.executions WHERE correlation_id LIKE 'target-%'")
            ]
        print(
            f"seeded {args.background:,} + {n} executions and {args.background:,} ledger rows in "
            f"{time.perf_counter() - started:.1f} s"
        )
        token = jwt.encode(
            {
                "sub": "ops:bench",
                "iss": bench_api.ISSUER,
                "aud": bench_api.AUDIENCE,
                "exp": int(time.time()) + 3600,
                "scope": "core.executions.read",
                "roles": ["EXECUTION_OPERATOR"],
                "business_scopes": ["loyalty"],
            },
            key,
            algorithm="RS256",
        )
        admin = {
            "CORE_JOBS_ADMIN_ENABLED": "true",
            "CORE_JOBS_ADMIN_CONSUMERS": "resolution:consumer",
            "CORE_JOBS_ADMIN_BUSINESS_SCOPES": "loyalty",
            "PYTHONPATH": os.pathsep.join([str(BENCH.parent), str(BENCH)]),
        }
        with restricted_login(url) as login_url:
            return measure_all(url, login_url, str(key_file), token, admin, targets, args)


def baseline_source(ref: str, into: str) -> str:
    """The ``maintenance`` and ``harness`` packages of git ``ref``, extracted under ``into``: the baseline API's code."""
    archive = subprocess.run(
        ["git", "-C", str(BENCH.parent), "archive", ref, "maintenance", "harness"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def merged(name: str, rounds: list[dict]) -> dict:
    """One API's figures over its interleaved rounds."""
    latencies = [ms for r in rounds for ms in r["latencies"]]
    server = [ms for r in rounds for ms in r["server"]]
    p50, p95, p99 = bench_api.percentiles(latencies)
    s50, s95, _ = bench_api.percentiles(server) if len(server) > 1 else (float("nan"),) * 3
    cpu = sum(r["cpu_ms"] * r["n"] for r in rounds) / len(latencies)
    rps = len(latencies) / sum(r["n"] / r["rps"] for r in rounds)
    return {"scenario": name, "p50": p50, "p95": p95, "p99": p99, "s50": s50, "s95": s95, "rps": rps, "cpu_ms": cpu}


def measure_all(url, login_url, key_file, token, admin, targets, args) -> int:
    """The scenarios against each API (this tree's, and the baseline's if asked), in interleaved rounds; the figures printed."""
    many = len(args.processes) > 1
    sources = {(f" [{p} process{'es' if p > 1 else ''}]" if many else ""): (None, p) for p in args.processes}
    sources |= {f" [{args.baseline}]": (args.baseline_dir, 1)} if args.baseline else {}
    apis = {}
    try:
        for label, (source, processes) in sources.items():
            env = dict(admin) | {"CORE_JOBS_API_PROCESSES": str(processes)}
            if source is not None:  # the baseline's packages first on the path, before this tree's
                env["PYTHONPATH"] = os.pathsep.join([source, admin["PYTHONPATH"]])
            apis[label] = bench_api.start_api(login_url, key_file, env, cwd=source)
        body = {
            "command": "RESUME",
            "results": [{"action": "notify", "result": {"message_id": "msg-bench"}}],
            "evidence": {"reference": "CASE-BENCH-1", "reason": "seen sent in the provider's console"},
        }
        share = len(targets) // len(apis)
        requests = {
            label: [
                ("POST", f"/v1/core/executions/{i}/resolve", None, body, {"Idempotency-Key": f"bench-{i}"})
                for i in targets[k * share : (k + 1) * share]
            ]
            for k, label in enumerate(apis)
        }
        listing = [("GET", "/v1/core/executions", None, None)] * share

        def interleaved(scenario: str, of) -> list[dict]:
            rounds: dict[str, list[dict]] = {label: [] for label in apis}
            for r in range(args.rounds):
                for label in list(apis) if r % 2 == 0 else list(apis)[::-1]:
                    process, api_url = apis[label]
                    bench_api.API_PID[:] = [process.pid]
                    chunk = of(label)[40:]
                    size = len(chunk) // args.rounds
                    warmup = of(label)[:40] if r == 0 else []
                    part = warmup + chunk[r * size : (r + 1) * size]
                    rounds[label].append(bench_api.measure(scenario, "http", api_url, token, part, len(warmup)))
            return [merged(scenario + label, rounds[label]) for label in apis]

        resolve = interleaved("resolve (RESUME, distinct executions)", requests.__getitem__)
        listed = interleaved("list awaiting resolution (first page, 50)", lambda label: listing)
        with psycopg.connect(url, autocommit=True) as conn:
            run_statements(conn, COMPLETE, {})
            left = conn.execute("SELECT count(*) FROM core.executions WHERE correlation_id LIKE 'target-%'")
            assert left.fetchone()[0] == 0
        replay = interleaved("idempotent replay of a completed one", requests.__getitem__)
    finally:
        for process, _ in apis.values():
            process.terminate()
            process.wait(30)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nresolutions under {bench_api.CLIENTS} concurrent operators, {args.requests} requests per scenario and API"
        f" in {args.rounds} interleaved rounds (ms; load average {load} on {os.cpu_count()} cores):"
    )
    print(
        f"  {'scenario':<58} {'p50':>7} {'p95':>7} {'p99':>7}  {'server p50':>10} {'p95':>6}  {'req/s':>6}"
        f"  {'API CPU/req':>11}  target p95 <= 50 ms"
    )
    for group in (resolve, replay, listed):
        for r in group:
            print(
                f"  {r['scenario']:<58} {r['p50']:7.2f} {r['p95']:7.2f} {r['p99']:7.2f}  {r['s50']:10.2f} {r['s95']:6.2f}"
                f"  {r['rps']:6.0f}  {r['cpu_ms']:8.2f} ms  {'ok' if r['p95'] <= 50 else 'MISSED'}"
            )
        if len(group) == 2:
            print(
                f"  {'':<58} p50 ratio {group[0]['p50'] / group[1]['p50']:.2f}, p95 ratio {group[0]['p95'] / group[1]['p95']:.2f}"
                f" ({'first / second' if len(args.processes) > 1 else 'this tree / baseline'})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
