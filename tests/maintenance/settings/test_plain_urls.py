"""Plain URLs are accepted without libpq or httpx only because both parse them as written (maintenance/fields/urls.py).

check-config imports neither psycopg nor httpx for a URL of unreserved characters (issue 20);
these tests hold the two parsers to that shortcut: every plain URL, of many generated from the
shortcut's own grammar plus its edge cases, is accepted by libpq's own check (through psycopg)
and read by httpx with the same host and no credentials.
"""

from __future__ import annotations

import random

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict

from maintenance.fields.urls import (
    PLAIN_DATABASE_URL,
    PLAIN_HTTP_URL,
    _check_libpq_parses,
    _check_with_libpq,
    _httpx_url,
    check_http_url,
)

pytestmark = pytest.mark.pure

UNRESERVED = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-"
HOST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-"
DATABASE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
PATH = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~/-"
EDGE_PORTS = ["", ":1", ":5432", ":65535", ":00080", ":99"]


def word(rng: random.Random, alphabet: str, least: int = 1, most: int = 12) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(least, most)))


def plain_database_urls(count: int = 2000) -> list[str]:
    """Database URLs of PLAIN_DATABASE_URL's grammar, edge cases first, then random ones (seeded)."""
    urls = [
        "postgresql://h",
        "postgresql://h/",
        "postgresql://u@h",
        "postgresql://u:@h/d",
        "postgresql://-:-@-:1/-",
        "postgresql://u.s~e_r:p~a.s-s@db-1.internal:5432/core_jobs",
        "postgresql://app:secret@127.0.0.1:5432/core",
        "postgresql://.../...",
    ]
    rng = random.Random(20)
    while len(urls) < count:
        user = ""
        if rng.random() < 0.8:
            password = f":{word(rng, UNRESERVED, 0)}" if rng.random() < 0.7 else ""
            user = f"{word(rng, UNRESERVED)}{password}@"
        port = rng.choice([*EDGE_PORTS, f":{rng.randint(1, 65535)}"])
        path = rng.choice(["", "/", f"/{word(rng, DATABASE)}"])
        urls.append(f"postgresql://{user}{word(rng, HOST)}{port}{path}")
    return urls


def plain_http_urls(count: int = 2000) -> list[str]:
    """http(s) URLs of PLAIN_HTTP_URL's grammar, edge cases first, then random ones (seeded)."""
    urls = [
        "https://uptime.betterstack.com",
        "https://uptime.betterstack.com/api/v3/",
        "http://pushgateway:9091",
        "HTTPS://A.B",
        "http://x-:1/~",
        "https://1.2.3.4.a",
        "http://a..b//",
        "http://xn-a.xn-/",
    ]
    rng = random.Random(20)
    while len(urls) < count:
        host = word(rng, HOST) + rng.choice("abcXYZ") + rng.choice(["", word(rng, HOST, 0)])
        port = rng.choice([*EDGE_PORTS, f":{rng.randint(1, 65535)}"]).replace(":99", ":0")
        path = rng.choice(["", "/", f"/{word(rng, PATH)}"])
        url = f"{rng.choice(['http', 'https', 'HTTP'])}://{host}{port}{path}"
        if "xn--" not in url.lower():  # an IDNA label is not plain: httpx decodes it
            urls.append(url)
    return urls


def test_every_plain_database_url_is_one_libpq_accepts_with_the_parts_as_written():
    """Each plain database URL passes libpq's own check, and libpq reads its host, port, user, password and database as written."""
    for url in plain_database_urls():
        assert PLAIN_DATABASE_URL.fullmatch(url), url
        _check_with_libpq(url)  # raises if libpq refuses it
        rest = url.removeprefix("postgresql://")
        userinfo, _, location = rest.rpartition("@")
        hostport, _, database = location.partition("/")
        host, _, port = hostport.partition(":")
        user, _, password = userinfo.partition(":")
        written = {"host": host, "port": port, "user": user, "password": password, "dbname": database}
        parsed = conninfo_to_dict(url)
        assert {k: parsed.get(k, "") for k in written} == written, url


def test_a_database_url_that_is_not_plain_still_goes_to_libpq():
    """A port out of range, %-encoding or a query parameter is not plain: libpq's check runs and refuses what it refused before."""
    for url in [
        "postgresql://h:0/d",
        "postgresql://h:65536/d",
        "postgresql://u:p%40@h/d",
        "postgresql://h/d?sslmode=x",
    ]:
        match = PLAIN_DATABASE_URL.fullmatch(url)
        assert not match or not 1 <= int(match["port"]) <= 65535, url
    with pytest.raises(ValueError, match="sslmode"):
        _check_libpq_parses("postgresql://h/d?sslmode=x")
    with pytest.raises(ValueError, match="port"):
        _check_libpq_parses("postgresql://h:65536/d")


def test_every_plain_http_url_is_read_by_httpx_with_its_host_and_no_credentials():
    """For each plain http(s) URL, httpx reads the host the shortcut reads and no user info, and check_http_url gives what it gave before."""
    for url in plain_http_urls():
        assert PLAIN_HTTP_URL.fullmatch(url), url
        parsed, shortcut = httpx.URL(url), _httpx_url(url)
        assert (shortcut.host, shortcut.userinfo) == (parsed.host, parsed.userinfo), url
        try:
            checked = check_http_url(url)
        except ValueError as exc:  # only a port of 0, which urllib reads and check_http_url refuses
            assert str(exc) == "its port must be 1-65535", url
        else:
            assert checked == url.rstrip("/")


def test_an_http_url_that_is_not_plain_still_goes_to_httpx():
    """An IPv4-like host, an IDNA host (or its xn-- form) or %-encoding is not plain: httpx parses it, and refuses a bad address as before."""
    for url in ["http://999.1.1.1/", "https://bücher.example/", "https://h/%41", "http://xn--zz/", "http://a.XN--b/"]:
        assert not PLAIN_HTTP_URL.fullmatch(url), url
    with pytest.raises(ValueError, match="not a URL httpx can use"):
        check_http_url("http://999.1.1.1/")
