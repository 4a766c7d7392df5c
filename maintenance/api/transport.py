"""The operations API's HTTP transport: uvicorn's httptools protocol with every byte and second of a request bounded.

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
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from maintenance.api.problems import PROBLEM_MEDIA_TYPE, Problem
from maintenance.settings import Settings
from maintenance.settings.api import DEFAULT_API_MAX_BODY_BYTES, DEFAULT_API_READ_TIMEOUT

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
