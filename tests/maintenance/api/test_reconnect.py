"""The operations API's pool outlives its database (maintenance/api/server.py ``build_pool``): while the database is
unreachable a request gets 503 database-unavailable and /readyz is not ready; once it is back, requests recover without
restarting the process. Through the TCP proxy (tests/support/tcp_proxy.py), with real JWTs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.api_support import ApiClient, api_settings, assert_problem, running_api
from support.factories import QUEUE, add_dead_letters
from support.tcp_proxy import TcpProxy, proxy_of, through
from support.waiting import wait_until

from maintenance.api.server import APPLICATION_NAME, POOL_RECONNECT_TIMEOUT_S, build_pool

BASE = "/v1/core/dead-letters"


@pytest.fixture
def proxy(database_url) -> Iterator[TcpProxy]:
    with proxy_of(database_url) as proxy:
        yield proxy


@pytest.fixture
def api(database_url, proxy, jwks, tokens) -> Iterator[ApiClient]:
    """The API on this test's database through the proxy; a request waits at most 1 s for a pooled connection."""
    yield from running_api(api_settings(through(database_url, proxy), jwks.url, api_pool_timeout=1), tokens)


def listed(api: ApiClient) -> int:
    response = api.get(BASE, params={"queue": QUEUE})
    assert response.status_code == 200, response.text
    return len(response.json()["items"])


def test_requests_get_503_naming_the_database_while_it_is_unreachable_and_recover_once_it_is_back(
    api, conn, proxy, database_url
):
    add_dead_letters(conn, QUEUE, 2)
    assert listed(api) == 2
    proxy.cut()
    for path in (BASE, f"{BASE}?queue={QUEUE}", "/readyz"):
        response = api.get(path)
        problem = assert_problem(response, 503, "database-unavailable")
        assert "database" in problem["detail"]
        for leak in ("127.0.0.1", str(proxy.port), "postgresql://", database_url):
            assert leak not in response.text
    assert api.get("/healthz").status_code == 200  # the process is up: not restarted
    proxy.restore()
    wait_until(lambda: api.get("/readyz").status_code == 200, what="/readyz ready again")
    assert listed(api) == 2


def test_pooled_connections_lost_while_idle_cost_no_request_a_failure(api, conn):
    """The database restarted (here: the API's backends terminated) while the pool's connections idled: the next
    requests are answered, not given the dead connections."""
    add_dead_letters(conn, QUEUE, 1)
    assert listed(api) == 1
    wait_until(
        lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()"
            " AND state = 'idle' AND query <> ''",
            (APPLICATION_NAME,),
        ).fetchone()[0],
        what="an idle pooled connection",
    )
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
        " AND datname = current_database()",
        (APPLICATION_NAME,),
    )
    assert [listed(api) for _ in range(3)] == [1, 1, 1]
    assert api.get("/readyz").status_code == 200


def test_the_pool_gives_up_a_failing_connection_attempt_soon_so_recovery_never_waits_out_a_long_backoff(jwks):
    """psycopg_pool doubles its wait between tries without a cap until reconnect_timeout (default 5 min): after a
    70 s outage the API answered again only 55 s after the database did (measured). The API's pool gives an attempt
    up within POOL_RECONNECT_TIMEOUT_S; the next request then opens a connection at once."""
    pool = build_pool(api_settings("postgresql://nobody@127.0.0.1:9/none", jwks.url))
    assert pool.reconnect_timeout == POOL_RECONNECT_TIMEOUT_S <= 5
    assert pool._check is not None  # each connection checked as a request takes it (psycopg_pool's check=)
