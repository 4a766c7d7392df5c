"""URLs: the one place that checks URL settings and hides what is secret in a URL.

- **Database URL** (:func:`normalize_database_url`): ``postgresql://``; the aliases
  ``postgresql+psycopg://``, ``postgresql+psycopg2://`` and ``postgres://`` are rewritten to it
  first, then every spelling takes the same check: libpq must parse it now, not at the first
  connection (a raw ``@``, ``/`` or ``:`` in the user name or password is refused: percent-encode it),
  and so must the values of its parameters (``sslmode``, a port 1-65535, ``connect_timeout`` a
  number, an ``options=-c statement_timeout=…`` PostgreSQL accepts): a value libpq or the server
  would refuse at the first connection is a configuration error at load, naming the parameter.
- **HTTP URLs** (:func:`check_http_url`: Better Stack, the heartbeat, the Pushgateway): parsed as
  httpx and urllib will use them — host, IPv6 brackets, port 1-65535, no credentials.
- **Masking**: :func:`redact_url` is the harness's one URL masker (``harness/urls.py``): the
  password of every ``scheme://user:password@`` URL in a text, up to the last ``@`` before the
  host (a raw ``@`` in the password or the user name leaves nothing of it visible), a secret query
  parameter (``?password=``, ``sslpassword=``, pika's ``ssl_options``) and a conninfo's
  ``password=``, each replaced by :data:`MASK`; :func:`mask_url_passwords` is the same function under
  its older name. The log redactor's credential detector (``maintenance/runtime/credentials.py``)
  takes its URL shapes from there too. :func:`url_passwords` lists a database URL's secrets so the
  redactor masks them wherever they appear alone.
  :func:`shown_url` is the origin-only display (``https://host/…``) of a URL whose path is a
  secret (the heartbeat token), used in log events.

No error message quotes the URL it refuses: it may hold a password or a token.

A URL written only of characters both parsers take literally (:data:`PLAIN_DATABASE_URL`,
:data:`PLAIN_HTTP_URL`: no percent-encoding, no query, a plain host name) is one libpq and
httpx parse as written, so it is accepted without importing either — psycopg and httpx were
a quarter of ``check-config``'s import time, and it uses neither otherwise. Any other URL is
parsed by libpq or httpx themselves; tests/maintenance/settings/test_plain_urls.py checks that they
accept every plain one.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from harness.urls import MASK, redact_url, url_secrets
from maintenance.fields.durations import PG_MAX_MILLISECONDS
from maintenance.runtime.imports import import_without

__all__ = ["MASK", "redact_url"]  # re-exported: the mask every redaction writes, the one URL masker

# Spellings of the scheme accepted besides libpq's own postgresql:// (SQLAlchemy's, Heroku's).
DATABASE_URL_SCHEME_ALIASES = ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://")


def normalize_database_url(url: str) -> str:
    """Accept ``postgresql://`` and its aliases (SQLAlchemy's ``+psycopg``, ``+psycopg2``, ``postgres://``); return libpq's.

    The scheme is rewritten first and then every spelling takes the same check, so an alias
    never lets through a URL that libpq would misread. Surrounding whitespace (a secret file's
    trailing newline) is not part of it, as for the http URL settings.
    """
    url = url.strip()
    for prefix in DATABASE_URL_SCHEME_ALIASES:
        if url.startswith(prefix):
            url = "postgresql://" + url[len(prefix) :]
            break
    if not url.startswith("postgresql://"):
        raise ValueError("must start with postgresql:// or postgresql+psycopg://")
    _check_libpq_parses(url)
    return url


# A database URL libpq parses as written, with nothing to check in it but its port: user,
# password, host and database name of unreserved characters only (no %-encoding), no query.
PLAIN_DATABASE_URL = re.compile(
    r"postgresql://(?:[A-Za-z0-9._~-]+(?::[A-Za-z0-9._~-]*)?@)?[A-Za-z0-9.-]+(?::(?P<port>[0-9]{1,5}))?"
    r"(?:/[A-Za-z0-9._-]*)?"
)


def _check_libpq_parses(url: str) -> None:
    """Refuse a URL libpq cannot use now, not at the first connection; libpq's own message may echo the password."""
    plain = PLAIN_DATABASE_URL.fullmatch(url)
    if plain and 1 <= int(plain["port"] or 5432) <= 65535:
        return  # libpq would parse it as written: no psycopg to import (the module docstring)
    _check_with_libpq(url)


def _check_with_libpq(url: str) -> None:
    """:func:`_check_libpq_parses` by libpq itself (through psycopg)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        raise ValueError(
            "libpq cannot parse it: percent-encode special characters of the password"
            " (@ as %40, % as %25) and use only libpq's query parameters"
        ) from None
    # libpq ends the user part at the first @ (or /): the rest of a raw @ or / lands in host or port.
    host, port_list = str(params.get("host") or ""), str(params.get("port") or "")
    if "@" in host + port_list:
        raise ValueError("its user name or password contains an unencoded @: write it as %40")
    if not all(port.isdigit() for port in port_list.split(",") if port):
        raise ValueError(
            "its port is not a number: percent-encode special characters of the user name and password"
            " (/ as %2F, : as %3A, @ as %40)"
        )
    _check_libpq_values(params)


# libpq's parameters whose values libpq checks only when it connects (then the error is a
# "database error", exit 1, though the mistake is the configuration's): the allowed words, and
# the integer ones. conninfo_to_dict has already refused an unknown parameter name.
_LIBPQ_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "ssl_min_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "ssl_max_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "keepalives": ("0", "1"),
    "sslcompression": ("0", "1"),
    "sslsni": ("0", "1"),
}
_LIBPQ_INTEGERS = ("connect_timeout", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")
# Server parameters in milliseconds that a URL's options=-c name=value may set: PostgreSQL's
# integer-with-unit syntax, at most 2 147 483 647 ms; a bad value fails every connection.
_SERVER_TIMEOUTS = (
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "transaction_timeout",
)
_PG_TIME = re.compile(r"^(\d+)\s*(us|ms|s|min|h|d)?$")
_PG_UNIT_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _check_libpq_values(params: dict) -> None:
    """Refuse a libpq parameter value that libpq or the server would refuse at the first connection; name it, never its value."""
    for name, allowed in _LIBPQ_CHOICES.items():
        if name in params and str(params[name]) not in allowed:
            raise ValueError(f"its parameter {name} must be one of {', '.join(allowed)}")
    for name in _LIBPQ_INTEGERS:
        if name in params and not re.fullmatch(r"-?\d+", str(params[name]).strip()):
            raise ValueError(f"its parameter {name} must be a whole number")
    for port in str(params.get("port") or "").split(","):
        if port and not 1 <= int(port) <= 65535:
            raise ValueError("its port must be 1-65535")
    _check_server_options(str(params.get("options") or ""))


def _check_server_options(options: str) -> None:
    """``options``: each ``-c name=value`` (or ``--name=value``) well formed, and a timeout's value one PostgreSQL accepts."""
    words = options.split()
    settings = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "-c" and index + 1 < len(words):
            settings.append(words[index + 1])
            index += 2
            continue
        if word.startswith(("-c", "--")):
            settings.append(word[2:])
        index += 1  # another server flag is the server's to judge
    for setting in settings:
        name, equals, value = setting.partition("=")
        if not equals or not name:
            raise ValueError("its parameter options must be -c name=value settings")
        if name.replace("-", "_") in _SERVER_TIMEOUTS:
            match = _PG_TIME.match(value)
            if match is None or int(match[1]) * _PG_UNIT_MS[match[2]] > PG_MAX_MILLISECONDS:
                raise ValueError(
                    f"its parameter options sets {name} to a value PostgreSQL refuses:"
                    f" a whole number with a unit (ms, s, min, h, d), at most {PG_MAX_MILLISECONDS} ms"
                )


def url_passwords(url: str) -> list[str]:
    """The secrets in a libpq URL or conninfo (user part, query, ``password=``): as written and percent-decoded."""
    return url_secrets(url)


mask_url_passwords = redact_url  # the name the settings exported first


def shown_url(url: str) -> str:
    """The URL without its path (the token): ``https://uptime.betterstack.com/…``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"


# An http(s) URL httpx parses as written: a host name of letters, digits, - and . (with a letter:
# httpx checks a dotted-digits one as an IPv4 address; no xn-- anywhere: httpx decodes an IDNA
# label when the host is read), an optional port, a path of unreserved characters.
PLAIN_HTTP_URL = re.compile(
    r"https?://(?!.*xn--)(?P<host>(?=[A-Za-z0-9.-]*[A-Za-z])[A-Za-z0-9.-]+)(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?",
    re.I,
)


class _PlainUrl(NamedTuple):
    """What :func:`check_http_url` reads of an ``httpx.URL``, for a plain URL."""

    host: str
    userinfo: bytes


def _httpx_url(text: str) -> Any:
    """``httpx.URL(text)``, its InvalidURL a ValueError; for a plain URL, its host and user info without httpx."""
    plain = PLAIN_HTTP_URL.fullmatch(text)
    if plain:
        return _PlainUrl(plain["host"].lower(), b"")  # as httpx reads it (the module docstring)
    # httpx without its command-line client's click, rich and pygments (maintenance/runtime/imports.py).
    httpx: Any = import_without("httpx", hidden=("click", "rich", "pygments"))
    try:
        return httpx.URL(text)
    except httpx.InvalidURL:
        raise ValueError("httpx cannot parse it") from None


def check_http_url(value: str, *, credentials_hint: str = "") -> str:
    """``value`` (stripped, no trailing ``/``) if httpx and urllib can both use it as an http(s) URL; else ValueError.

    Parsed the way the clients will: urllib (the Pushgateway push, the masked form in log events)
    and httpx (Better Stack). A URL either cannot use would fail only later, after the jobs ran.
    The messages never quote the URL: a heartbeat URL's path is a token.
    """
    text = value.strip()
    if not re.match(r"^https?://", text, re.I):
        raise ValueError("must be an http:// or https:// URL")
    if any(ch.isspace() for ch in text):
        raise ValueError("must not contain spaces")
    try:
        parts = urlsplit(text)
        port = parts.port  # reading it checks it: a number in 0-65535
        url = _httpx_url(text)
    except ValueError:  # an unclosed [ of an IPv6 host, a bad port, an invalid IDNA host name
        raise ValueError(
            "is not a URL httpx can use: check the host (an IPv6 address in [ ]) and the port (1-65535)"
        ) from None
    if not url.host or not parts.hostname:
        raise ValueError("has no host")
    if port == 0:
        raise ValueError("its port must be 1-65535")
    if parts.username is not None or parts.password is not None or url.userinfo:
        raise ValueError("must not carry credentials (user:password@)" + credentials_hint)
    return text.rstrip("/")
