"""Request headers are bounded at the server and the bearer token before PyJWT (issue 17, item 5), over raw sockets.

One unauthenticated request with a 64 MB ``Authorization`` header used to keep the API busy for
~10 s, and a ``/healthz`` probe meanwhile took 7.2 s. The tests stream such headers over a raw
socket (an HTTP client library would refuse to build them) and time the answers.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from api_support import assert_problem

from maintenance.api.auth import MAX_TOKEN_CHARS
from maintenance.api.server import MAX_HEADER_BYTES, MAX_HEADERS

CHUNK = 64 * 1024


def address(client) -> tuple[str, int]:
    url = urlsplit(str(client.base_url))
    return url.hostname, url.port


def send_head(client, head_lines: list[bytes], padding: int = 0) -> tuple[bytes, float]:
    """Send a GET /healthz with ``head_lines`` and ``padding`` more bytes of one header, streamed; the
    answer's first bytes and the seconds from the first byte sent to the answer."""
    sock = socket.create_connection(address(client), timeout=30)
    started = time.perf_counter()
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n" + b"".join(line + b"\r\n" for line in head_lines))
        if padding:
            sock.sendall(b"X-Padding: ")
            for _ in range(padding // CHUNK):
                if select.select([sock], [], [], 0)[0]:  # answered already: stop sending, as a client would
                    break
                sock.sendall(b"a" * CHUNK)
        sock.sendall(b"\r\n\r\n")
    except OSError:
        pass
    try:
        answer = sock.recv(4096)
    except OSError:
        answer = b""
    finally:
        sock.close()
    return answer, time.perf_counter() - started


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


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
    flood = threading.Thread(target=send_head, args=(api, []), kwargs={"padding": 64 * 1024 * 1024})
    flood.start()
    try:
        started = time.perf_counter()
        probe = httpx.get(str(api.base_url).rstrip("/") + "/healthz", timeout=30)
        seconds = time.perf_counter() - started
    finally:
        flood.join(60)
    assert probe.status_code == 200 and seconds < 0.5, seconds


@pytest.mark.parametrize("length", [MAX_TOKEN_CHARS + 1, 4 * 1024 * 1024])
def test_refuses_a_token_over_its_bound_with_401_before_verifying_it(api, length):
    """A bearer token longer than MAX_TOKEN_CHARS is 401 naming the bound (PyJWT never sees it); past the header bound, 431."""
    response = api.get("/v1/core/dead-letters", headers={"Authorization": "Bearer " + "a" * length})
    if length > MAX_HEADER_BYTES:  # the server's header bound answers first
        assert response.status_code == 431
        return
    body = assert_problem(response, 401, "unauthenticated")
    assert str(MAX_TOKEN_CHARS) in body["detail"]
