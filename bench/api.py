"""Benchmark of the operations API at a million dead letters, under 8 concurrent clients.

    uv run python bench/api.py                          # defaults below
    uv run python bench/api.py --rows 200000 --requests 200

1. A scratch database (server: ``API_BENCH_DATABASE_URL``, default the local test server) with
   ``--rows`` dead letters (default 1 000 000), a realistic mix: 94 % replayed, 4 % discarded,
   2 % pending review; 40 queues of Zipf-like sizes, 200 tenants, written over 90 days. Plus
   ``--bulk-rounds`` queues of exactly 10 000 pending dead letters each, for the bulk replay.
   Seeded with the lifecycle triggers set aside (``session_replication_role = replica``), then
   VACUUM ANALYZE.
2. ``core-jobs api`` in its own process (uvicorn, the default pool of 8), with a throwaway RSA
   key as its public-key file; the clients in this process, 8 threads, each its own HTTP
   connection, a token of every permission.
3. Per scenario ``--requests`` requests (after 40 warm-up requests), spread over the 8 clients —
   8 processes, so that they do not share one interpreter's GIL — the latency of each from the
   client (localhost round trip included): p50 / p95 / p99.
   Scenarios: the default list (first page; page 100 by cursor), a filtered list (one queue,
   status replayed), the detail, replay and discard of single dead letters (each request a
   different pending one). Target p95 ≤ 50 ms each (the spec's budget: 1 s).
4. The baseline the keyset replaces, in the same run: the default list's page 100 through
   ``OFFSET 4950 LIMIT 50``, against the same query by keyset cursor, both straight in SQL
   (``maintenance.operations.dead_letters.LIST_PAGE``; the OFFSET form adds only the OFFSET), 8 connections at once.
5. The bulk replay of 10 000 dead letters (one queue's pending ones, by filter) over HTTP, once
   per bulk round: seconds per request. Target ≤ 2 s (SQS redrive moves ≤ 500 messages/s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import httpx
import jwt
import psycopg
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core_jobs_demo import scratch_database
from maintenance.operations.dead_letters import LIST_PAGE
from maintenance.runtime import migrate

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
ISSUER, AUDIENCE = "https://bench.invalid/", "core-jobs-api"
CLIENTS = 8
BASE = "/v1/core/dead-letters"

# 1 M rows in one statement: ~2 % pending, 4 % discarded, the rest replayed; queue q00 the largest.
SEED = """
INSERT INTO core.dead_letters (job_id, queue, consumer, payload, attempts, last_error, status, discard_reason,
                               correlation_id, created_at, tenant_id, status_changed_at)
SELECT gen_random_uuid(), q.queue, q.queue,
       jsonb_build_object('member_id', 'm-' || (n %% 50000), 'points', n %% 500, 'order', 'o-' || n),
       CASE WHEN n %% 7 = 0 THEN 1 ELSE 5 END,
       CASE WHEN n %% 7 = 0 THEN 'PoisonMessage: payload failed schema validation: points must be >= 0'
            ELSE 'ProviderUnavailable: HTTP 503 from loyalty ledger' END,
       s.status, CASE WHEN s.status = 'discarded' THEN 'bench: superseded' END,
       'corr-' || n, now() - interval '90 days' * (1 - n::float8 / %(rows)s),
       ('00000000-0000-4000-8000-' || lpad((n %% 200)::text, 12, '0'))::uuid,
       CASE WHEN s.status <> 'pending_review' THEN now() - interval '1 day' END
  FROM generate_series(1, %(rows)s) AS n
 CROSS JOIN LATERAL (SELECT 'bench.q' || lpad(floor(40 * power((hashint4(n)::bigint & 1048575) / 1048576.0, 2.5))::int::text,
                                     2, '0') AS queue) AS q
 CROSS JOIN LATERAL (SELECT CASE WHEN n %% 50 = 0 THEN 'pending_review' WHEN n %% 25 = 1 THEN 'discarded'
                                 ELSE 'replayed' END AS status) AS s
"""

SEED_BULK = """
INSERT INTO core.dead_letters (job_id, queue, consumer, payload, attempts, last_error, correlation_id, created_at,
                               tenant_id)
SELECT gen_random_uuid(), %(queue)s, %(queue)s, jsonb_build_object('member_id', 'm-' || n, 'points', 1), 5,
       'ProviderTimeout: loyalty ledger did not answer in 10 s', 'bulk-' || n, now() - interval '1 hour',
       '00000000-0000-4000-8000-000000000001'
  FROM generate_series(1, 10000) AS n
"""

OFFSET_PAGE = LIST_PAGE.replace("LIMIT %(limit)s", "LIMIT %(limit)s OFFSET %(offset)s")


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    qs = statistics.quantiles(samples, n=100, method="inclusive")
    return qs[49], qs[94], qs[98]


SERVER_MS: list[float] = []  # duration_ms of every request the API logged, in order
API_PID: list[int] = []  # the API process, whose CPU time per request is reported


def _cpu_seconds(pid: int) -> float:
    """CPU time of the API process and of its children (CORE_JOBS_API_PROCESSES > 1: a pre-fork)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            tail = stat.read_text().rsplit(")", 1)[1]
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = tail.split()
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # the process, or a child of it
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _read_request_log(process: subprocess.Popen) -> None:
    for line in process.stdout:
        if '"maintenance.api.request"' in line:
            SERVER_MS.append(json.loads(line)["duration_ms"])


def _client(job: tuple) -> list[float]:
    """One client process: its share of the requests, one at a time; their latencies in ms.

    Processes, not threads: 8 client threads in one interpreter would share its GIL and time
    each other's JSON parsing, not the server. Each keeps one HTTP/1.1 connection and speaks it
    through ``http.client``, not httpx: the clients share the API's 2 cores, and httpx's own
    work per request (~1.5 ms of CPU a request across 8 clients, a quarter of the machine at
    ~200 requests/s) was CPU taken from the API and PostgreSQL and counted in their latency.
    ``CLIENT=httpx`` in the environment measures with httpx again (docs/performance.md).
    """
    kind, target, auth, requests = job
    latencies = []
    if kind == "sql":
        with psycopg.connect(target, autocommit=True) as conn:
            for query, params in requests:
                started = time.perf_counter()
                conn.execute(query, params, prepare=False).fetchall()
                latencies.append((time.perf_counter() - started) * 1000)
        return latencies
    if os.environ.get("CLIENT") == "httpx":
        with httpx.Client(base_url=target, headers={"Authorization": f"Bearer {auth}"}, timeout=60) as client:
            for method, path, params, body, *headers in requests:  # headers: optional, per request
                started = time.perf_counter()
                response = client.request(
                    method, path, params=params, json=body, headers=headers[0] if headers else None
                )
                latencies.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, response.text[:300]
        return latencies
    address = urlsplit(target)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    base = {"Authorization": f"Bearer {auth}"}
    try:
        for method, path, params, body, *headers in requests:  # headers: optional, per request
            url = f"{path}?{urlencode(params)}" if params else path
            sent = base | (headers[0] if headers else {})
            content = None
            if body is not None:
                content = json.dumps(body).encode()
                sent = sent | {"Content-Type": "application/json"}
            started = time.perf_counter()
            connection.request(method, url, body=content, headers=sent)
            reply = connection.getresponse()
            answer = reply.read()
            latencies.append((time.perf_counter() - started) * 1000)
            assert reply.status == 200, answer[:300]
    finally:
        connection.close()
    return latencies


def measure(name: str, kind: str, target: str, auth: str, requests: list, warmup: int = 40) -> dict:
    """``requests`` spread over CLIENTS processes at once (after ``warmup`` of them alone); p50/p95/p99 in ms."""
    _client((kind, target, auth, requests[:warmup]))
    rest = requests[warmup:]
    shares = [(kind, target, auth, rest[i::CLIENTS]) for i in range(CLIENTS)]
    with multiprocessing.Pool(CLIENTS) as pool:
        time.sleep(1)  # the pool's processes start before the clock does
        logged, cpu, started = len(SERVER_MS), _cpu_seconds(API_PID[0]), time.perf_counter()
        latencies = [ms for share in pool.map(_client, shares) for ms in share]
        wall, cpu = time.perf_counter() - started, _cpu_seconds(API_PID[0]) - cpu
    time.sleep(0.5)  # the last request lines reach the log reader
    server = SERVER_MS[logged : logged + len(latencies)] if kind == "http" else []
    p50, p95, p99 = percentiles(latencies)
    s50, s95, _ = percentiles(server) if len(server) > 1 else (float("nan"),) * 3
    return {
        "scenario": name,
        "n": len(latencies),
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "s50": s50,
        "s95": s95,
        "rps": len(latencies) / wall,
        "latencies": latencies,  # each, for a caller that merges interleaved rounds
        "server": server,
        "cpu_ms": 1000 * cpu / len(latencies) if kind == "http" else float("nan"),
    }


def seed(url: str, rows: int, bulk_rounds: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")  # born in their final status
            conn.execute(SEED, {"rows": rows})
            for r in range(bulk_rounds):
                conn.execute(SEED_BULK, {"queue": f"bench.bulk{r}"})
        conn.execute("VACUUM ANALYZE core.dead_letters")
        counts = dict(conn.execute("SELECT status, count(*) FROM core.dead_letters GROUP BY 1").fetchall())
        print(
            f"seeded {sum(counts.values()):,} dead letters in {time.perf_counter() - started:.1f} s: "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
        )


def start_api(
    url: str, key_file: str, extra_env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[subprocess.Popen, str]:
    """``core-jobs api`` in its own process, run from ``cwd`` (``-m`` puts it first on the path); its base URL."""
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
        | (extra_env or {})
        | {
            "CORE_JOBS_DATABASE_URL": url,
            "CORE_JOBS_API_JWT_PUBLIC_KEY_FILE": key_file,
            "CORE_JOBS_API_JWT_ISSUER": ISSUER,
            "CORE_JOBS_API_JWT_AUDIENCE": AUDIENCE,
            "CORE_JOBS_LOG_FORMAT": "json",
        }
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "maintenance", "api", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    for line in process.stdout:
        event = json.loads(line)
        if event.get("event") == "maintenance.api.started":
            # Keep reading its request log (a full pipe would block the server): each request's
            # duration_ms as the server measured it, from its first byte in to its last byte out.
            threading.Thread(target=_read_request_log, args=(process,), daemon=True).start()
            return process, f"http://127.0.0.1:{event['port']}"
    raise SystemExit("core-jobs api did not start")


def main() -> int:
    global CLIENTS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=400, help="per scenario")
    parser.add_argument("--bulk-rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=CLIENTS, help="concurrent clients (default 8)")
    args = parser.parse_args()
    CLIENTS = args.clients
    server = os.environ.get("API_BENCH_DATABASE_URL", DEFAULT_SERVER)

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with tempfile.TemporaryDirectory() as tmp, scratch_database(server, "core_jobs_bench_api") as url:
        key_file = Path(tmp, "issuer.pem")
        key_file.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
        migrate.upgrade(url)
        seed(url, args.rows, args.bulk_rounds)
        token = jwt.encode(
            {
                "sub": "bench",
                "iss": ISSUER,
                "aud": AUDIENCE,
                "exp": int(time.time()) + 3600,
                "scope": "core.dead_letters.read core.dead_letters.replay core.dead_letters.discard",
            },
            key,
            algorithm="RS256",
        )
        # the bulk scenario replays 10 000 letters by one filter: above the default cap of one bulk action (1 000)
        process, api_url = start_api(url, str(key_file), {"CORE_JOBS_DEAD_LETTERS_BULK_MAX": "10000"})
        API_PID.append(process.pid)
        try:
            return run(url, api_url, token, args)
        finally:
            process.terminate()
            process.wait(30)


def run(url: str, api_url: str, token: str, args: argparse.Namespace) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        pending = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM core.dead_letters WHERE status = 'pending_review' AND queue LIKE 'bench.q%' ORDER BY id"
            )
        ]
        all_ids = conn.execute("SELECT max(id) FROM core.dead_letters").fetchone()[0]
        busiest = conn.execute(
            "SELECT queue FROM core.dead_letters GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()[0]
    random.seed(7)
    random.shuffle(pending)
    n = args.requests + 40  # 40 warm-up requests, then the measured ones
    to_replay, to_discard = pending[:n], pending[n : 2 * n]

    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        cursor = None
        for _ in range(99):  # the cursor of page 100 of the default list
            cursor = http.get(BASE, params={"cursor": cursor} if cursor else {}).json()["next_cursor"]

    def gets(path: str, params: dict | None = None) -> list:
        return [("GET", path, params, None)] * n

    http_args = (api_url, token)
    results = [
        measure("list, first page (default: pending, 50)", "http", *http_args, gets(BASE)),
        measure("list, page 100 by cursor", "http", *http_args, gets(BASE, {"cursor": cursor})),
        measure(
            f"list filtered (queue {busiest}, status replayed)",
            "http",
            *http_args,
            gets(BASE, {"queue": busiest, "status": "replayed"}),
        ),
        measure(
            "detail (random id)",
            "http",
            *http_args,
            [("GET", f"{BASE}/{random.randint(1, all_ids)}", None, None) for _ in range(n)],
        ),
        measure(
            "replay one",
            "http",
            *http_args,
            [("POST", f"{BASE}/{i}/replay", None, {"reason": "bench"}) for i in to_replay],
        ),
        measure(
            "discard one",
            "http",
            *http_args,
            [("POST", f"{BASE}/{i}/discard", None, {"reason": "bench: superseded"}) for i in to_discard],
        ),
    ]

    # The baseline: page 100 by OFFSET against the same page by keyset, straight in SQL, 8 connections.
    filters = {
        "status": "pending_review",
        "queue": None,
        "consumer": None,
        "tenant_id": None,
        "job_id": None,
        "correlation_id": None,
        "created_after": None,
        "created_before": None,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            OFFSET_PAGE, filters | {"limit": 1, "offset": 99 * 50 - 1, "after_created_at": None, "after_id": None}
        ).fetchone()
    keyset = filters | {"limit": 51, "after_created_at": row[11], "after_id": row[0]}
    offset = filters | {"limit": 51, "offset": 99 * 50, "after_created_at": None, "after_id": None}
    sql_results = [
        measure("SQL page 100 by keyset", "sql", url, "", [(LIST_PAGE, keyset)] * n),
        measure("SQL page 100 by OFFSET 4950 (baseline)", "sql", url, "", [(OFFSET_PAGE, offset)] * n),
    ]

    bulk = []
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        for r in range(args.bulk_rounds):
            started = time.perf_counter()
            response = http.post(f"{BASE}/replay", json={"filter": {"queue": f"bench.bulk{r}"}, "reason": "bench"})
            bulk.append(time.perf_counter() - started)
            assert response.status_code == 200 and response.json()["count"] == 10_000, response.text[:300]

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nAPI under {CLIENTS} concurrent clients, {args.requests} requests per scenario (ms; load average {load}"
        f" on {os.cpu_count()} cores):"
    )
    print(
        f"  {'scenario':<52} {'p50':>7} {'p95':>7} {'p99':>7}  {'server p50':>10} {'p95':>6}  {'req/s':>6}"
        f"  {'API CPU/req':>11}  target p95 <= 50 ms"
    )
    for r in results:
        print(
            f"  {r['scenario']:<52} {r['p50']:7.2f} {r['p95']:7.2f} {r['p99']:7.2f}  {r['s50']:10.2f} {r['s95']:6.2f}"
            f"  {r['rps']:6.0f}  {r['cpu_ms']:8.2f} ms  {'ok' if r['p95'] <= 50 else 'MISSED'}"
        )
    print(
        "  (p50-p99: from the client, round trip included; server: the API's own duration_ms of the same requests;"
        " API CPU/req: the API process's CPU time per request)"
    )
    print(f"\nThe keyset against the OFFSET it replaces, default list page 100, {CLIENTS} connections (ms, SQL only):")
    for r in sql_results:
        print(f"  {r['scenario']:<52} {r['p50']:8.2f} {r['p95']:8.2f} {r['p99']:8.2f}")
    print(f"  OFFSET / keyset at p50: {sql_results[1]['p50'] / sql_results[0]['p50']:.1f}x")
    print(
        "\nBulk replay of 10 000 dead letters by filter, one request each: "
        + ", ".join(f"{s:.2f} s" for s in bulk)
        + f"; median {statistics.median(bulk):.2f} s  target <= 2 s: "
        + ("ok" if statistics.median(bulk) <= 2 else "MISSED")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
