"""`core-jobs api` as a process, its probes and its metrics (issue 11)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from support.api_support import AUDIENCE, ISSUER, ApiClient, api_settings, serving
from support.factories import QUEUE, add_dead_letters
from support.waiting import wait_until

from maintenance.api.server import build_app

BASE = "/v1/core/dead-letters"


def api_process(database_url: str, jwks_url: str, **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")} | {
        "CORE_JOBS_DATABASE_URL": database_url,
        "CORE_JOBS_API_JWKS_URL": jwks_url,
        "CORE_JOBS_API_JWT_ISSUER": ISSUER,
        "CORE_JOBS_API_JWT_AUDIENCE": AUDIENCE,
        "CORE_JOBS_LOG_FORMAT": "json",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "maintenance", "api", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_event(process: subprocess.Popen, name: str) -> dict:
    """Read the process's log lines until event ``name`` (a blocking read, not a timed wait)."""
    for line in process.stdout:
        event = json.loads(line)
        if event["event"] == name:
            return event
    raise AssertionError(f"{name} never logged; stderr: {process.stderr.read()}")


def api_lock_waiter(conn) -> int | None:
    """The pid of an API connection to this test's database waiting on a row lock, if one is (not another session's)."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'core-jobs-api' AND wait_event_type = 'Lock'"
        " AND datname = current_database()"
    ).fetchone()
    return row[0] if row else None


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(database_url, jwks, tokens, conn):
    """SIGTERM during a replay: the replay completes (200, committed), the process logs stopping/stopped and exits 0."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    process = api_process(database_url, jwks.url)
    try:
        started = read_event(process, "maintenance.api.started")
        url = f"http://127.0.0.1:{started['port']}"
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        answers: list[httpx.Response] = []
        with conn.transaction():
            conn.execute("SELECT 1 FROM core.dead_letters WHERE id = %s FOR UPDATE", (letter,))
            request = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(
                        f"{url}{BASE}/{letter}/replay",
                        headers={"Authorization": f"Bearer {tokens.token()}"},
                        timeout=30,
                    )
                )
            )
            request.start()
            wait_until(lambda: api_lock_waiter(conn), what="the replay waiting on the row lock")
            process.send_signal(signal.SIGTERM)
            assert read_event(process, "maintenance.api.stopping")["signal"] == "SIGTERM"
        request.join(30)
        assert process.wait(30) == 0
        assert [a.status_code for a in answers] == [200]
        assert conn.execute("SELECT status FROM core.dead_letters").fetchone()[0] == "replayed"
        assert read_event(process, "maintenance.api.stopped")["port"] == started["port"]
    finally:
        process.kill()
        process.wait()


def test_api_without_auth_settings_exits_2_naming_them(database_url):
    """`core-jobs api` with no key source, issuer or audience: exit 2 before listening, naming what to set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")} | {
        "CORE_JOBS_DATABASE_URL": database_url
    }
    done = subprocess.run(
        [sys.executable, "-m", "maintenance", "api", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "CORE_JOBS_API_JWKS_URL" in done.stderr and "CORE_JOBS_API_JWT_ISSUER is required" in done.stderr


def test_readyz_is_503_while_the_database_is_unreachable(jwks, tokens):
    """/healthz answers while the database is down; /readyz and the endpoints answer 503 database-unavailable."""
    settings = api_settings("postgresql://nobody@127.0.0.1:9/none?connect_timeout=1", jwks.url, api_pool_timeout=1)
    app = build_app(settings)
    with serving(app, settings) as url, ApiClient(url, tokens, app) as client:
        assert client.get("/healthz").status_code == 200
        for path in ("/readyz", BASE):
            response = client.get(path)
            assert response.status_code == 503, response.text
            assert response.json()["type"] == "urn:core-jobs:problem:database-unavailable"


def test_readyz_is_200_with_the_database(api):
    """/readyz answers 200 once the database answers."""
    assert api.get("/readyz").json() == {"status": "ready"}


def test_metrics_count_requests_and_latency_per_route_and_status(api, conn):
    """core_jobs_api_requests_total and the latency histogram are labelled by route template and status."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    api.post(f"{BASE}/{letter}/replay")
    api.post(f"{BASE}/{letter}/replay")
    api.get("/no/such/path")
    text = api.get("/metrics").text
    replay = 'method="POST",route="/v1/core/dead-letters/{id}/replay"'
    assert f'core_jobs_api_requests_total{{{replay},status="200"}} 1.0' in text
    assert f'core_jobs_api_requests_total{{{replay},status="409"}} 1.0' in text
    assert 'core_jobs_api_requests_total{method="GET",route="unmatched",status="404"} 1.0' in text
    assert f'core_jobs_api_request_duration_seconds_count{{{replay},status="200"}} 1.0' in text


def test_the_metrics_live_on_the_apps_own_registry(api):
    """prometheus_client's global registry knows nothing of the API's metrics."""
    from prometheus_client import REGISTRY, generate_latest

    api.get("/healthz")
    assert b"core_jobs_api_requests_total" not in generate_latest(REGISTRY)
    assert api.app.state.metrics.registry is not REGISTRY


@pytest.mark.parametrize(
    ("method", "path", "slug", "status"),
    [
        ("GET", "/v1/core/nothing", "not-found", 404),
        ("DELETE", f"{BASE}/1", "method-not-allowed", 405),
        ("GET", f"{BASE}/abc", "not-found", 404),
    ],
)
def test_unknown_routes_and_methods_are_problems_too(api, method, path, slug, status):
    """404 and 405 are application/problem+json like every other error."""
    response = api.request(method, path)
    assert response.status_code == status and response.json()["type"] == f"urn:core-jobs:problem:{slug}"


def _server_side_of(client: socket.socket) -> socket.socket:
    """The socket this process accepted for ``client``'s connection (the server runs in a thread here)."""
    wanted = (client.getpeername(), client.getsockname())
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            candidate = socket.socket(fileno=os.dup(fd))
            try:
                if (
                    candidate.type == socket.SOCK_STREAM
                    and (candidate.getsockname(), candidate.getpeername()) == wanted
                ):
                    return candidate
            except OSError:
                pass
            candidate.close()
    raise AssertionError(f"no accepted socket for {wanted}")


def test_accepted_connections_have_tcp_nodelay(api):
    """The server's side of an accepted connection has TCP_NODELAY set, so a response written in two parts is not held ~40 ms for a delayed ACK."""
    host, port = httpx.URL(str(api.base_url)).host, httpx.URL(str(api.base_url)).port
    with socket.create_connection((host, port)) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        with _server_side_of(client) as accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_metrics_are_negotiated_text_or_openmetrics(api):
    """/metrics answers Prometheus text by default and OpenMetrics (ending in # EOF) to a scraper that asks for it."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    api.get("/healthz")
    text = api.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    negotiated = api.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert negotiated.headers["content-type"].startswith("application/openmetrics-text")
    assert negotiated.text.endswith("# EOF\n")
    names = {family.name for family in openmetrics_families(negotiated.text)}
    assert "core_jobs_api_requests" in names


@pytest.mark.parametrize("threads", [2, 4])
def test_the_served_api_runs_endpoints_on_as_many_worker_threads_as_set(database_url, jwks, threads):
    """CORE_JOBS_API_WORKER_THREADS is the size of the served event loop's worker-thread limiter, which runs every sync endpoint."""
    import anyio.to_thread

    settings = api_settings(database_url, jwks.url, api_worker_threads=threads)
    app = build_app(settings)

    @app.get("/_worker_threads")
    async def worker_threads() -> int:  # read on the server's own event loop
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    with serving(app, settings) as url:
        assert httpx.get(f"{url}/_worker_threads").json() == threads


def test_the_worker_threads_default_to_four_and_refuse_zero(clean_env):
    """Unset: 4 worker threads; CORE_JOBS_API_WORKER_THREADS=0 is a configuration error naming the variable."""
    from maintenance.settings import ConfigError, load_settings

    assert load_settings().api_worker_threads == 4
    clean_env.setenv("CORE_JOBS_API_WORKER_THREADS", "0")
    with pytest.raises(ConfigError, match="CORE_JOBS_API_WORKER_THREADS"):
        load_settings()


def test_probes_and_metrics_answer_while_every_worker_thread_waits_on_the_database(database_url, jwks, tokens, conn):
    """CORE_JOBS_API_WORKER_THREADS=1, its thread blocked on a locked dead letter: /healthz, /readyz and /metrics still answer; the replay then completes."""
    import psycopg
    from support.api_support import running_api

    letter = add_dead_letters(conn, QUEUE, 1)[0]
    settings = api_settings(database_url, jwks.url, api_worker_threads=1)
    with psycopg.connect(database_url) as locker, contextlib.contextmanager(running_api)(settings, tokens) as api:
        locker.execute("SELECT 1 FROM core.dead_letters WHERE id = %s FOR UPDATE", (letter,))  # held until rollback
        replies: list[httpx.Response] = []
        replay = threading.Thread(target=lambda: replies.append(api.post(f"{BASE}/{letter}/replay")))
        replay.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'core-jobs-api' AND wait_event_type = 'Lock'"
        )
        wait_until(lambda: conn.execute(waiting).fetchone()[0] == 1, what="the replay waiting on the row lock")
        with httpx.Client(base_url=api.base_url, timeout=5) as probe:
            assert [probe.get(path).status_code for path in ("/healthz", "/readyz", "/metrics")] == [200, 200, 200]
        locker.rollback()
        replay.join(10)
    assert [r.status_code for r in replies] == [200]
