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

Every byte a request holds outside its counted body is bounded, and so is the time to send it
(:class:`BoundedHttpToolsProtocol`, uvicorn's httptools protocol, pinned so the
bounds do not depend on which parser happens to be installed). The answer is problem+json with
``Connection: close``, written as soon as a bound is crossed — without reading the rest, the app
stopped waiting (it sees a disconnect) — then at most :data:`MAX_LINGER_BYTES` more are discarded
for :data:`LINGER_SECONDS` (so the client can read the answer) and the connection is closed:

- the head (request line and headers) past :data:`MAX_HEADER_BYTES` or :data:`MAX_HEADERS`
  fields: **431** ``request-headers-too-large``;
- a chunked body's framing (chunk-size lines, extensions, CRLFs) and trailer fields past
  :data:`MAX_FRAMING_BYTES`: **431** in the trailers, **413** ``payload-too-large`` in the framing
  (so a body of tiny chunks is refused too). Trailer fields are discarded, never merged into the
  headers the app sees;
- a body past ``CORE_JOBS_API_MAX_BODY_BYTES``, even one the app answered without reading (e.g.
  a 401, or a 413 on its Content-Length): **413**, or only the close once the answer is out;
- a request the parser refuses (a malformed request line or header field): **400**
  ``malformed-request``, where uvicorn's own answer is plain text;
- a request not read whole within ``CORE_JOBS_API_READ_TIMEOUT`` (10 s) from the connection's
  opening or its first byte: **408** ``request-timeout``. An idle keep-alive connection is closed
  after uvicorn's ``timeout_keep_alive`` (5 s).

Unbounded, one unauthenticated request with a 64 MB ``Authorization`` header kept the event loop
busy for ~10 s and a ``/healthz`` probe meanwhile took 7.2 s; the same 64 MB as a trailer field,
5.1 s; and a head sent one header a second was held open as long as the client liked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any

import psycopg
import uvicorn
from fastapi import FastAPI
from psycopg import sql
from psycopg_pool import ConnectionPool
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from harness.pg import pin_primary_session, set_role
from maintenance.api.admin import load_admin
from maintenance.api.app import ApiMetrics, create_app
from maintenance.api.auth import JwksKeys, KeySource, PublicKeyFile, TokenVerifier
from maintenance.api.problems import PROBLEM_MEDIA_TYPE, Problem
from maintenance.runtime.db import read_stored_json
from maintenance.runtime.logs import get_logger
from maintenance.settings import ConfigError, Settings
from maintenance.settings.api import DEFAULT_API_MAX_BODY_BYTES, DEFAULT_API_READ_TIMEOUT

APPLICATION_NAME = "core-jobs-api"
# How long the pool retries one connection it could not open before it gives that attempt up (psycopg_pool's
# reconnect_timeout, default 5 min). Its waits double without a cap (1, 2, 4 … s), so after a 70 s outage the next
# try came 55 s after the database was back, every request a 503 meanwhile (measured); given up sooner, the next
# request opens a connection at once: the API is answering again within this after the database is.
POOL_RECONNECT_TIMEOUT_S = 5.0
MAX_HEADER_BYTES = 32 * 1024  # request line and headers of one request
MAX_HEADERS = 100
MAX_FRAMING_BYTES = 32 * 1024  # chunk-size lines, chunk extensions, CRLFs and trailer fields of one request
LINGER_SECONDS = 1.0
MAX_LINGER_BYTES = 1024 * 1024  # discarded after an answer, before the server stops reading


class _Refused(Exception):
    """Raised from a parser callback: ``feed_data`` stops there and ``send_400_response`` answers the refusal."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that bounds every byte it reads outside a counted body, and the time to read
    a request: 431 past :data:`MAX_HEADER_BYTES`/:data:`MAX_HEADERS` in the head or :data:`MAX_FRAMING_BYTES` in
    the trailers, 413 past it in the chunk framing or past ``max_body_bytes`` of body, 408 past ``read_timeout``.

    A request's non-body bytes are counted per read: what a read held less the body bytes the parser
    gave out of it. (A read that ends one pipelined request and starts the next counts its non-body
    bytes to the next: conservative, never short.) Trailer fields are read within the bound and
    discarded — never merged into the headers the app sees.
    """

    max_body_bytes = DEFAULT_API_MAX_BODY_BYTES
    read_timeout = DEFAULT_API_READ_TIMEOUT.total_seconds()

    refusal: Problem | None = None  # set once: the answer, then the connection closes
    in_head = True  # the current request's head is incomplete
    reading = False  # a request has begun and is not yet read whole
    head_size = 0  # the current request's head, as parsed (its request line and header fields)
    non_body = 0  # bytes of the current request read outside its body: its head, then its framing and trailers
    body_bytes = 0  # the current request's body, as the parser gave it
    fed_body = 0  # body bytes given out of the read being parsed
    in_trailers = (
        False  # the last chunk header had no data after it: the last chunk's trailers (or a chunk's data) follow
    )
    deadline: asyncio.TimerHandle | None = None
    lingered = 0  # bytes discarded since the refusal

    @classmethod
    def configured(cls, settings: Settings) -> type[BoundedHttpToolsProtocol]:
        """This protocol with the settings' body limit and read timeout."""
        return type(
            cls.__name__,
            (cls,),
            {"max_body_bytes": settings.api_max_body_bytes, "read_timeout": settings.api_read_timeout.total_seconds()},
        )

    # -- the read timeout: from the connection's opening or a request's first byte to the request read whole
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.deadline is None:
            self.deadline = self.loop.call_later(self.read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _timed_out(self) -> None:
        self.deadline = None
        if self.transport.is_closing() or self.refusal is not None:
            return
        previous = self.cycle if self.in_head else None
        if self.flow.read_paused or (not self.reading and previous is not None and not previous.response_complete):
            self._arm()  # the server holds the read (a request before this one is in flight): not the client's time
            return
        self._refuse(
            Problem(408, "request-timeout", f"the request was not received whole within {self.read_timeout:g} s")
        )

    # -- parser callbacks: the head, the body and the chunks, counted
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head, self.reading, self.in_trailers = True, True, False
        self.head_size = self.non_body = self.body_bytes = 0
        self._arm()

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.in_head:  # a trailer field: counted with the framing, discarded (RFC 9110 6.5.1)
            self.in_trailers = True
            return
        super().on_header(name, value)
        if len(self.headers) > MAX_HEADERS:
            self._refusing(431, "request-headers-too-large", f"a request may have at most {MAX_HEADERS} header fields")

    def on_headers_complete(self) -> None:
        self.in_head = False
        method = self.parser.get_method()
        self.head_size = len(method) + len(self.url) + 12 + sum(len(n) + len(v) + 4 for n, v in self.headers) + 2
        if self.head_size > MAX_HEADER_BYTES:  # a head that arrived in one read: refused before the app starts
            self._refusing(431, "request-headers-too-large", f"the request's headers exceed {MAX_HEADER_BYTES} bytes")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.fed_body += len(body)
        self.body_bytes += len(body)
        self.in_trailers = False
        if self.body_bytes > self.max_body_bytes:  # also a body the app answered without reading
            self._refusing(413, "payload-too-large", f"the request body exceeds {self.max_body_bytes} bytes")
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self.in_trailers = True

    def on_chunk_complete(self) -> None:
        self.in_trailers = False

    def on_message_complete(self) -> None:
        self.reading = False
        self._disarm()
        super().on_message_complete()

    def _refusing(self, status: int, slug: str, detail: str) -> None:
        self.refusal = Problem(status, slug, detail)
        raise _Refused  # out of feed_data as a parser error: send_400_response answers it

    # -- each read: parsed, then its non-body bytes counted against the bounds
    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:  # answered: what the client still sends is discarded, a bounded amount
            self.lingered += len(data)
            if self.lingered > MAX_LINGER_BYTES and not self.transport.is_closing():
                self.transport.pause_reading()  # the client's sends block until the close
            return
        self._arm()  # any byte starts the clock of the request it belongs to
        self.fed_body = 0
        super().data_received(data)
        if self.refusal is not None or self.transport.is_closing():
            return
        self.non_body += len(data) - self.fed_body
        if self.in_head and self.non_body > MAX_HEADER_BYTES:
            self._refuse(
                Problem(431, "request-headers-too-large", f"the request's headers exceed {MAX_HEADER_BYTES} bytes")
            )
        elif not self.in_head and self.non_body - self.head_size > MAX_FRAMING_BYTES:
            if self.in_trailers:
                detail = f"the request's chunk framing and trailer fields exceed {MAX_FRAMING_BYTES} bytes"
                self._refuse(Problem(431, "request-headers-too-large", detail))
            else:
                detail = f"the request body's chunk framing exceeds {MAX_FRAMING_BYTES} bytes (chunks too small?)"
                self._refuse(Problem(413, "payload-too-large", detail))

    def send_400_response(self, msg: str) -> None:
        # A malformed request (the parser refused it): a problem too, where uvicorn's own 400 is plain text.
        self._refuse(self.refusal or Problem(400, "malformed-request", msg))

    def _refuse(self, problem: Problem) -> None:
        """Answer ``problem`` (Connection: close) unless this request's response has begun or one before it is in
        flight — then only close —, discard what the client still sends (at most :data:`MAX_LINGER_BYTES`) for :data:`LINGER_SECONDS`, and close."""
        self.refusal = problem
        self._disarm()
        current = None if self.in_head else self.cycle
        before = self.cycle if self.in_head else None
        if (current is not None and current.response_started) or (before is not None and not before.response_complete):
            self.transport.close()
            return
        if current is not None:  # the app may be waiting for the body: it gets a disconnect, its answer is dropped
            current.disconnected = True
            current.message_event.set()
        body = problem.response().body
        head = (
            f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}\r\n".encode()
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
