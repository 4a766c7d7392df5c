"""Every byte of a request that is not its counted body is bounded at the server, and so is the time to send it
(issue 17, item 5), over raw sockets; the bearer token is bounded before PyJWT.

One unauthenticated request with a 64 MB ``Authorization`` header used to keep the API busy for
~10 s, and a ``/healthz`` probe meanwhile took 7.2 s; after the head was bounded, the same 64 MB
sent as a chunked body's trailer field did it again (5.1 s), and a head sent one header a second
was held open for as long as the client liked. The tests stream such requests over a raw socket
(an HTTP client library would refuse to build them) and time the answers.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from support.api_support import api_settings, assert_problem, running_api

from maintenance.api.auth import MAX_TOKEN_CHARS
from maintenance.api.transport import MAX_FRAMING_BYTES, MAX_HEADER_BYTES, MAX_HEADERS

CHUNK = 64 * 1024


def address(client) -> tuple[str, int]:
    url = urlsplit(str(client.base_url))
    return url.hostname, url.port


def stream(client, start: bytes, padding: int = 0, pad: bytes = b"a" * CHUNK, end: bytes = b"") -> tuple[bytes, float]:
    """Send ``start``, then ``padding`` bytes of ``pad`` repeated (until the server answers or stops reading, as
    a client would), then ``end``; the answer's first bytes and the seconds from the first byte sent to the answer."""
    sock = socket.create_connection(address(client), timeout=30)
    started = time.perf_counter()
    try:
        sock.sendall(start)
        for _ in range(padding // len(pad)):
            if select.select([sock], [], [], 0)[0]:  # answered already: stop sending
                break
            sock.sendall(pad)
        sock.sendall(end)
    except OSError:
        pass
    try:
        answer = sock.recv(4096)
    except OSError:
        answer = b""
    finally:
        sock.close()
    return answer, time.perf_counter() - started


def send_head(client, head_lines: list[bytes], padding: int = 0) -> tuple[bytes, float]:
    """Send a GET /healthz with ``head_lines`` and ``padding`` more bytes of one header, streamed; as :func:`stream`."""
    start = b"GET /healthz HTTP/1.1\r\nHost: api\r\n" + b"".join(line + b"\r\n" for line in head_lines)
    if padding:
        return stream(client, start + b"X-Padding: ", padding, end=b"\r\n\r\n")
    return stream(client, start + b"\r\n")


CHUNKED_POST = (
    b"POST /v1/core/dead-letters/replay HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Type: application/json\r\n\r\n"
)


def probe_while(client, attack) -> tuple[Any, float]:
    """Run ``attack()`` in a thread and GET /healthz meanwhile; the attack's result and the probe's seconds."""
    result: list[Any] = []
    healthz = str(client.base_url).rstrip("/") + "/healthz"
    # The probe's client is made and its connection opened before the attack: the seconds are the server's answer,
    # not the making of an httpx client (an SSL context, tenths of a second on a loaded machine).
    with httpx.Client(timeout=30) as probing:
        probing.get(healthz).raise_for_status()
        flood = threading.Thread(target=lambda: result.append(attack()))
        flood.start()
        try:
            started = time.perf_counter()
            probe = probing.get(healthz)
            seconds = time.perf_counter() - started
        finally:
            flood.join(60)
    assert probe.status_code == 200
    return result[0], seconds


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",  # no method, target or version
        b"GET /healthz HTTP/9.9\r\nHost: api\r\n\r\n",  # an unknown version
        b"GET /healthz HTTP/1.1\r\nHost: api\r\nBad Header: x\r\n\r\n",  # a space in a field name
        b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Nul: a\x00b\r\n\r\n",  # a NUL in a field value
    ],
    ids=["request-line", "version", "field-name", "field-value"],
)
def test_a_malformed_request_is_answered_400_as_problem_json_and_closed(api, request_bytes):
    """What the parser refuses before the app sees it is a problem too (uvicorn's own 400 is plain text)."""
    answer, _ = stream(api, request_bytes)
    assert status_of(answer) == 400, answer[:300]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), head
    assert b"connection: close" in head.lower(), head
    assert json.loads(body)["type"] == "urn:core-jobs:problem:malformed-request", body


def test_refuses_a_64_mb_header_with_431_within_a_second(api):
    """A request whose headers grow to 64 MB is answered 431 as soon as they pass the bound, not after reading them."""
    answer, seconds = send_head(api, [], padding=64 * 1024 * 1024)
    assert status_of(answer) == 431, answer[:200]
    assert b"application/problem+json" in answer and b"request-headers-too-large" in answer
    assert seconds < 1.0, seconds


def test_refuses_headers_just_over_the_bound_and_accepts_those_within(api):
    """Headers one chunk over MAX_HEADER_BYTES are 431; a 4 KB header is served."""
    over, _ = send_head(api, [], padding=MAX_HEADER_BYTES + CHUNK)
    assert status_of(over) == 431, over[:200]
    within, _ = send_head(api, [b"X-Padding: " + b"a" * 4096])
    assert status_of(within) == 200, within[:200]


def test_refuses_too_many_headers_with_431(api):
    """More than MAX_HEADERS header lines, each small, are 431."""
    answer, _ = send_head(api, [b"X-N%d: 1" % n for n in range(MAX_HEADERS + 1)])
    assert status_of(answer) == 431, answer[:200]


def test_a_healthz_probe_stays_fast_while_a_64_mb_header_streams(api):
    """While one connection streams a 64 MB header, /healthz on another answers within 0.5 s."""
    _, seconds = probe_while(api, lambda: send_head(api, [], padding=64 * 1024 * 1024))
    assert seconds < 0.5, seconds


@pytest.mark.parametrize("length", [MAX_TOKEN_CHARS + 1, 4 * 1024 * 1024])
def test_refuses_a_token_over_its_bound_with_401_before_verifying_it(api, length):
    """A bearer token longer than MAX_TOKEN_CHARS is 401 naming the bound (PyJWT never sees it); past the header bound, 431."""
    response = api.get("/v1/core/dead-letters", headers={"Authorization": "Bearer " + "a" * length})
    if length > MAX_HEADER_BYTES:  # the server's header bound answers first
        assert response.status_code == 431
        return
    body = assert_problem(response, 401, "unauthenticated")
    assert str(MAX_TOKEN_CHARS) in body["detail"]


def test_refuses_a_64_mb_trailer_with_431_while_healthz_stays_fast(api):
    """A chunked body's trailer field growing to 64 MB is 431 within a second, and /healthz answers within 0.5 s meanwhile."""
    (answer, seconds), probe = probe_while(
        api, lambda: stream(api, CHUNKED_POST + b"2\r\n{}\r\n0\r\nX-Trailer: ", 64 * 1024 * 1024, end=b"\r\n\r\n")
    )
    assert status_of(answer) == 431, answer[:200]
    assert b"application/problem+json" in answer and b"request-headers-too-large" in answer
    assert seconds < 1.0 and probe < 0.5, (seconds, probe)


def test_refuses_a_64_mb_chunk_extension_with_413(api):
    """A chunk-size line whose extension grows to 64 MB is 413 (framing is part of the body) within a second."""
    answer, seconds = stream(api, CHUNKED_POST + b"2;x=", 64 * 1024 * 1024, end=b"\r\n{}\r\n0\r\n\r\n")
    assert status_of(answer) == 413, answer[:200]
    assert b"payload-too-large" in answer and seconds < 1.0, (answer[:200], seconds)


def test_refuses_a_body_of_one_byte_chunks_once_its_framing_passes_the_bound(api):
    """A 200 KB body (within the body limit) sent as one-byte chunks is 413 once its framing passes MAX_FRAMING_BYTES."""
    answer, _ = stream(api, CHUNKED_POST, 200 * 1024 * 6, pad=b"1\r\n \r\n" * 1024, end=b"0\r\n\r\n")
    assert status_of(answer) == 413, answer[:200]
    within, _ = stream(api, CHUNKED_POST, MAX_FRAMING_BYTES // 2, pad=b"1\r\n \r\n" * 64, end=b"2\r\n{}\r\n0\r\n\r\n")
    assert status_of(within) == 401, within[:200]  # read whole, then refused for want of a token


def sent_before_cut_off(client, start: bytes) -> int:
    """Send ``start``, then up to 64 MB without reading the answer; how many bytes the socket took before the server
    closed (64 MB if it read them all). The loopback's socket buffers hold a few MB of them."""
    sock = socket.create_connection(address(client), timeout=30)
    sent = 0
    try:
        sock.sendall(start)
        for _ in range(64 * 1024 * 1024 // CHUNK):
            sock.sendall(b"a" * CHUNK)
            sent += CHUNK
    except OSError:
        pass
    finally:
        sock.close()
    return sent


def test_closes_a_connection_whose_unread_body_passes_the_body_limit(api):
    """A 64 MB body the app answered without reading (413 on its Content-Length) is not read on: the server closes."""
    head = b"POST /v1/core/dead-letters/replay HTTP/1.1\r\nHost: api\r\nContent-Length: 67108864\r\n\r\n"
    sent = sent_before_cut_off(api, head)
    assert sent < 16 * 1024 * 1024, sent


def test_a_refused_client_that_keeps_sending_is_read_for_at_most_a_mb_more(api):
    """After a 431, a client that ignores it and streams 64 MB more is cut off: the server discards at most
    MAX_LINGER_BYTES, then stops reading and closes."""
    sent = sent_before_cut_off(api, CHUNKED_POST + b"2\r\n{}\r\n0\r\nX-Trailer: ")
    assert sent < 16 * 1024 * 1024, sent


@pytest.fixture
def quick_api(database_url, jwks, tokens):
    """The API with a read timeout of half a second."""
    yield from running_api(api_settings(database_url, jwks.url, api_read_timeout=0.5), tokens)


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Slow: ", CHUNKED_POST + b"2\r\n{}\r\n0\r\nX-Trailer: 1\r\n"],
    ids=["nothing", "part-of-a-head", "part-of-the-trailers"],
)
def test_answers_408_and_closes_a_request_not_sent_within_the_read_timeout(quick_api, sent):
    """A connection that sent nothing, part of a head or part of the trailers is answered 408 and closed after
    CORE_JOBS_API_READ_TIMEOUT (0.5 s here), not held open."""
    sock = socket.create_connection(address(quick_api), timeout=5)  # the socket timeout is the test's wait
    started = time.perf_counter()
    try:
        sock.sendall(sent)
        answer = sock.recv(4096)
        closed = sock.recv(4096) == b""
    finally:
        sock.close()
    seconds = time.perf_counter() - started
    assert status_of(answer) == 408 and b"request-timeout" in answer and closed, answer[:200]
    assert 0.4 < seconds < 2.5, seconds


def test_a_slow_body_is_answered_408_after_the_read_timeout(quick_api):
    """A body sent slower than CORE_JOBS_API_READ_TIMEOUT allows (2 of 10 declared bytes) is answered 408 and closed."""
    sock = socket.create_connection(address(quick_api), timeout=5)
    try:
        sock.sendall(b'POST /v1/core/dead-letters/replay HTTP/1.1\r\nHost: api\r\nContent-Length: 10\r\n\r\n{"')
        answer = sock.recv(4096)
    finally:
        sock.close()
    assert status_of(answer) == 408, answer[:200]
