"""``core-jobs api``: the operations API on uvicorn, built from the settings, graceful on SIGTERM.

Start: the settings are checked (a key source, the issuer and the audience are required; exit
2 naming what is missing), the key file is read, the socket is bound (``--host``/``--port`` or
``CORE_JOBS_API_HOST``/``_PORT``; port 0 picks a free one) and ``maintenance.api.started`` is
logged with the address actually bound. The database pool opens in the background: the API
starts even while the database is down, and ``/readyz`` answers 503 until it is reachable —
except in admin mode (``CORE_JOBS_ADMIN_ENABLED``): then it first loads the published
definitions and checks, on one connection set up like the pool's, that it runs as the restricted
API role (:mod:`maintenance.api.admin`; exit 2 otherwise).

A lost database (a restart, a failover, a network cut) never stops the process: while it is
unreachable each request answers 503 ``database-unavailable`` (problem+json, no address or URL in
it; ``maintenance.api.database_unavailable`` logged, the 503 counted by route) and ``/readyz`` is
not ready; the pool reconnects in the background and checks each connection as a request takes it,
so a connection the database dropped while idle is replaced, never handed out: once the database
answers, requests do too, without a restart.

Stop: on SIGTERM (or SIGINT) ``maintenance.api.stopping`` is logged, the server stops accepting
connections, lets the requests in flight finish — each is one transaction, so none is cut in
half — for up to ``CORE_JOBS_API_SHUTDOWN_GRACE``, closes the pool, logs
``maintenance.api.stopped`` and exits 0.

Several processes (``CORE_JOBS_API_PROCESSES`` > 1): the parent does the above up to the bound
socket, then forks that many children serving it, each with its own pool; ``/metrics`` adds up all
of them; SIGTERM to the parent stops them all the same graceful way (:mod:`maintenance.api.processes`).

Every byte a request holds outside its counted body, and the time to send it, is bounded by
:mod:`maintenance.api.transport` (the HTTP hardening, apart from the server's assembly here).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import uvicorn
from fastapi import FastAPI
from psycopg import sql
from psycopg_pool import ConnectionPool

from harness.pg import pin_primary_session, set_role
from maintenance.api.admin import load_admin
from maintenance.api.app import ApiMetrics, create_app
from maintenance.api.auth import JwksKeys, KeySource, PublicKeyFile, TokenVerifier
from maintenance.api.processes import Supervisor, shared_metrics
from maintenance.api.transport import BoundedHttpToolsProtocol
from maintenance.runtime.db import read_stored_json
from maintenance.runtime.logs import get_logger
from maintenance.settings import ConfigError, Settings

APPLICATION_NAME = "core-jobs-api"
# How long the pool retries one connection it could not open before it gives that attempt up (psycopg_pool's
# reconnect_timeout, default 5 min). Its waits double without a cap (1, 2, 4 … s), so after a 70 s outage the next
# try came 55 s after the database was back, every request a 503 meanwhile (measured); given up sooner, the next
# request opens a connection at once: the API is answering again within this after the database is.
POOL_RECONNECT_TIMEOUT_S = 5.0


def session_setup(settings: Settings):
    """What every API connection runs first: the session settings every core-jobs connection pins
    (``harness.pg.pin_primary_session``: a resolution's or an operation's commit is durable whatever the
    database's ``synchronous_commit``; a standby, ``ServerInRecovery``, is refused), jsonb read without ever raising (``read_stored_json``),
    ``SET ROLE`` to the API role, a statement timeout."""
    role = settings.api_database_role
    timeout_ms = int(settings.api_statement_timeout.total_seconds() * 1000)

    def configure(conn: psycopg.Connection) -> None:
        pin_primary_session(conn)  # a standby's answer to a decision read would be behind the primary: refused
        read_stored_json(conn)  # no stored row can make a read fail (maintenance/runtime/db.py)
        if role:
            set_role(conn, role)
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(timeout_ms)))

    return configure


def build_pool(settings: Settings, conninfo: str | None = None) -> ConnectionPool:
    """A pool (not yet open) whose connections run as the API role, with a statement timeout."""
    configure = session_setup(settings)
    return ConnectionPool(
        conninfo or settings.conninfo(),
        min_size=settings.api_pool_min_size,
        max_size=settings.api_pool_max_size,
        timeout=settings.api_pool_timeout.total_seconds(),
        open=False,
        configure=configure,
        # Each connection is checked (one round trip) as a request takes it: one the database dropped while it idled
        # in the pool (a restart, a failover, a terminated backend) is replaced then, never handed to a request.
        check=ConnectionPool.check_connection,
        reconnect_timeout=POOL_RECONNECT_TIMEOUT_S,
        name="core-jobs-api",
        kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
    )


def build_verifier(settings: Settings) -> TokenVerifier:
    """The token verifier of the configured key source; ConfigError when the settings are incomplete."""
    problems = settings.api_problems()
    if problems:
        raise ConfigError("; ".join(problems))
    keys: KeySource
    if settings.api_jwks_url is not None:
        keys = JwksKeys(
            settings.api_jwks_url,
            lifespan=settings.api_jwks_cache_lifespan.total_seconds(),
            refetch_interval=settings.api_jwks_refetch_interval.total_seconds(),
            timeout=settings.api_jwks_timeout.total_seconds(),
        )
    else:
        try:
            keys = PublicKeyFile(settings.api_jwt_public_key_file or "")
        except ValueError as exc:
            raise ConfigError(f"CORE_JOBS_API_JWT_PUBLIC_KEY_FILE: {exc}") from None
    assert settings.api_jwt_issuer is not None and settings.api_jwt_audience is not None
    return TokenVerifier(
        keys,
        issuer=settings.api_jwt_issuer,
        audience=settings.api_jwt_audience,
        algorithms=list(settings.api_jwt_algorithms),
        leeway=settings.api_jwt_leeway.total_seconds(),
    )


def build_app(settings: Settings, conninfo: str | None = None, *, metrics: ApiMetrics | None = None) -> FastAPI:
    verifier = build_verifier(settings)
    admin = None
    if settings.admin_enabled:  # the published definitions and a restricted session, or ConfigError
        url, configure = conninfo or settings.conninfo(), session_setup(settings)

        @contextmanager
        def connect() -> Iterator[psycopg.Connection]:
            with psycopg.connect(url, autocommit=True, application_name=APPLICATION_NAME, connect_timeout=10) as conn:
                configure(conn)
                yield conn

        admin = load_admin(settings, connect)
    return create_app(
        pool=build_pool(settings, conninfo),
        verifier=verifier,
        max_body_bytes=settings.api_max_body_bytes,
        metrics=metrics,
        admin=admin,
        bulk_max=settings.dead_letters_bulk_max,
        worker_threads=settings.api_worker_threads,
    )


class Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM/SIGINT stops gracefully and then returns (exit 0) instead of re-raising."""

    announces_stop = True  # logs maintenance.api.stopping; not a child of several processes (its parent does)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if not self.should_exit and self.announces_stop:
                get_logger().info("maintenance.api.stopping", signal=signal.Signals(signum).name)
            self.handle_exit(signum, frame)

        previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._captured_signals.clear()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); ConfigError when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only then; without
    # it every response (headers and body written apart) waited ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def make_server(app: FastAPI, settings: Settings) -> Server:
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        server_header=False,
        http=BoundedHttpToolsProtocol.configured(settings),
        timeout_graceful_shutdown=int(settings.api_shutdown_grace.total_seconds()) or 1,
    )
    return Server(config)


@contextmanager
def running(app: FastAPI, settings: Settings, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``app`` served by uvicorn in a background thread for the block (the demo, the tests); its base URL.

    The socket listens before the server starts, so a first request waits in the backlog instead
    of the caller waiting for the server. The block's end stops it gracefully.
    """
    sock = bind(host, port)
    server = make_server(app, settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="core-jobs-api", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    """Run the API until SIGTERM; 0 after a graceful stop. Several processes when ``CORE_JOBS_API_PROCESSES`` > 1."""
    if settings.api_processes > 1:
        with shared_metrics() as directory:  # this served process only, for this run (maintenance/api/processes.py)
            app = build_app(settings, metrics=ApiMetrics(multiprocess_directory=directory))
            return _serve(app, settings, host, port, metrics_directory=directory)
    return _serve(build_app(settings), settings, host, port)


def _serve(app: FastAPI, settings: Settings, host: str | None, port: int | None, metrics_directory: str = "") -> int:
    sock = bind(host or settings.api_host, settings.api_port if port is None else port)
    bound_host, bound_port = sock.getsockname()[:2]
    log = get_logger()
    processes = settings.api_processes
    log.info(
        "maintenance.api.started",
        host=bound_host,
        port=bound_port,
        pid=os.getpid(),
        processes=processes,
        metrics_directory=metrics_directory or None,  # several processes: their metrics' files, removed at exit
        key_source="jwks" if settings.api_jwks_url else "public_key_file",
        database_role=settings.api_database_role,
    )
    code = 0
    try:
        if processes == 1:
            make_server(app, settings).run(sockets=[sock])
        else:

            def serve_child(slot: int) -> None:
                get_logger().info("maintenance.api.process_started", pid=os.getpid(), slot=slot)
                server = make_server(app, settings)
                server.announces_stop = False
                server.run(sockets=[sock])

            code = Supervisor(
                count=processes,
                serve_child=serve_child,
                grace_s=settings.api_shutdown_grace.total_seconds(),
                metrics_directory=metrics_directory,
                on_stopping=sock.close,  # the children keep theirs until each has stopped accepting
            ).run()
    finally:
        sock.close()
    log.info("maintenance.api.stopped", host=bound_host, port=bound_port)
    return code
