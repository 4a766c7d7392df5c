"""``core-jobs api``: the operations API on uvicorn, built from the settings, graceful on SIGTERM.

Start: the settings are checked (a key source, the issuer and the audience are required; exit
2 naming what is missing), the key file is read, the socket is bound (``--host``/``--port`` or
``CORE_JOBS_API_HOST``/``_PORT``; port 0 picks a free one) and ``maintenance.api.started`` is
logged with the address actually bound. The database pool opens in the background: the API
starts even while the database is down, and ``/readyz`` answers 503 until it is reachable —
except in admin mode (``CORE_JOBS_ADMIN_ENABLED``): then it first loads the published
definitions and checks, on one connection set up like the pool's, that it runs as the restricted
API role (:mod:`maintenance.api.admin`; exit 2 otherwise).

Stop: on SIGTERM (or SIGINT) ``maintenance.api.stopping`` is logged, the server stops accepting
connections, lets the requests in flight finish — each is one transaction, so none is cut in
half — for up to ``CORE_JOBS_API_SHUTDOWN_GRACE``, closes the pool, logs
``maintenance.api.stopped`` and exits 0.

Request heads are bounded (issue 17): one request's request line and headers may hold at most
:data:`MAX_HEADER_BYTES` bytes and :data:`MAX_HEADERS` header fields. Past either, the server
answers **431** ``request-headers-too-large`` (problem+json, ``Connection: close``) as soon as the
bound is crossed — without reading the rest, without running the app — discards what the client
still sends for at most :data:`LINGER_SECONDS` (so the client can read the answer) and closes.
Unbounded, one unauthenticated request with a 64 MB ``Authorization`` header kept the event loop
busy for ~10 s and a ``/healthz`` probe meanwhile took 7.2 s. The parser is pinned
(:class:`BoundedHttpToolsProtocol`, uvicorn's httptools protocol with the bounds), so the bound
does not depend on which parser happens to be installed.
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
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from harness.pg import pin_session
from maintenance.api.admin import load_admin
from maintenance.api.app import ApiMetrics, create_app
from maintenance.api.auth import JwksKeys, KeySource, PublicKeyFile, TokenVerifier
from maintenance.api.problems import PROBLEM_MEDIA_TYPE, Problem
from maintenance.runtime.logs import get_logger
from maintenance.settings import ConfigError, Settings

APPLICATION_NAME = "core-jobs-api"
MAX_HEADER_BYTES = 32 * 1024  # request line and headers of one request
MAX_HEADERS = 100
LINGER_SECONDS = 1.0


class _HeadTooLarge(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that answers 431 to a request head past :data:`MAX_HEADER_BYTES` or
    :data:`MAX_HEADERS` fields, before the app runs and before the rest is read."""

    head_bytes = 0  # bytes received while the current request's head is incomplete
    in_head = True
    too_large: str | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head, self.head_bytes = True, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if len(self.headers) > MAX_HEADERS:
            self.too_large = f"a request may have at most {MAX_HEADERS} header fields"
            raise _HeadTooLarge  # out of feed_data as a parser error: send_400_response answers 431

    def on_headers_complete(self) -> None:
        self.in_head = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > MAX_HEADER_BYTES:  # a head that arrived in one read: refused before the app starts
            self.too_large = f"the request's headers exceed {MAX_HEADER_BYTES} bytes"
            raise _HeadTooLarge
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self.too_large is not None:  # answered: what the client still sends is discarded
            return
        super().data_received(data)
        if self.too_large is None and self.in_head:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEADER_BYTES:
                self.too_large = f"the request's headers exceed {MAX_HEADER_BYTES} bytes"
                self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        if self.too_large is None:  # a malformed request: uvicorn's own 400
            super().send_400_response(msg)
            return
        body = Problem(431, "request-headers-too-large", self.too_large).response().body
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            + b"content-type: "
            + PROBLEM_MEDIA_TYPE.encode()
            + b"\r\n"
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\n"
            + b"connection: close\r\n\r\n"
        )
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then end of stream: the client reads it
        self.loop.call_later(LINGER_SECONDS, self.transport.close)  # and may send for a moment more


def session_setup(settings: Settings):
    """What every API connection runs first: the session settings every core-jobs connection pins
    (``harness.pg.pin_session``: a resolution's or an operation's commit is durable whatever the
    database's ``synchronous_commit``), ``SET ROLE`` to the API role, a statement timeout."""
    role = settings.api_database_role
    timeout_ms = int(settings.api_statement_timeout.total_seconds() * 1000)

    def configure(conn: psycopg.Connection) -> None:
        pin_session(conn)
        if role:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
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
    )


class Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM/SIGINT stops gracefully and then returns (exit 0) instead of re-raising."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if not self.should_exit:
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
        http=BoundedHttpToolsProtocol,
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
    """Run the API until SIGTERM; 0 after a graceful stop."""
    app = build_app(settings)
    sock = bind(host or settings.api_host, settings.api_port if port is None else port)
    bound_host, bound_port = sock.getsockname()[:2]
    log = get_logger()
    log.info(
        "maintenance.api.started",
        host=bound_host,
        port=bound_port,
        pid=os.getpid(),
        key_source="jwks" if settings.api_jwks_url else "public_key_file",
        database_role=settings.api_database_role,
    )
    try:
        make_server(app, settings).run(sockets=[sock])
    finally:
        sock.close()
    log.info("maintenance.api.stopped", host=bound_host, port=bound_port)
    return 0
