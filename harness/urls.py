"""The one URL masker: what a log event, an error, a repr, a span or the CLI shows of a URL or a libpq conninfo.

A queue URL (``amqp://user:password@host/vhost``) and a database URL or conninfo carry a password;
everything else in them (user, host, port, vhost or database, options) is what an operator needs
to see. :func:`redact_url` hides exactly the secrets, in a URL, a conninfo string or a text holding
either, replacing each by :data:`MASK`:

- the password of ``scheme://user:password@host``, read by hand rather than by a URL parser: a
  password (or user name) written unencoded may hold ``@``, ``:``, ``/``, ``?`` or ``#``, which a
  parser takes for the host, the port, the path, the query or the fragment — and then finds no
  password to hide, or an error of its own quotes it. The user part is everything up to the first
  ``:`` (so it may hold a raw ``@``: ``svc@team``), the password everything up to the last ``@``
  that a host follows, spaces and all; with no such ``@`` (a URL without a host,
  ``amqp://u:PW/vh``), whatever follows ``user:`` up to the path unless it is a numeric port
  (:data:`USERINFO_PASSWORD`); when in doubt more is hidden, never less;
- a query parameter whose name names a secret (``password``, ``sslpassword``, ``…token``,
  :func:`is_secret_parameter`), and a secret inside a query value that is itself a mapping
  (pika's ``ssl_options={'password': …}``, percent-encoded or not);
- a libpq ``key=value`` conninfo's ``password`` / ``sslpassword`` (quoted or not).

:func:`url_secrets` lists those secrets (as written and decoded), so a parser's error that quotes
one alone can be masked too. It lives in the harness because the harness's adapters show URLs and
the harness imports nothing of the bundle; the bundle uses it (``maintenance/fields/urls.py``, the
log redactor's credential detector ``maintenance/runtime/credentials.py``): one definition.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, unquote_plus

__all__ = ["MASK", "QUERY_PARAMETER", "USERINFO_PASSWORD", "is_secret_parameter", "redact_url", "url_secrets"]

MASK = "***"

# scheme://user:password — the user up to the first ":" (no "/", no "[": an IPv6 host); what follows it is the
# password unless it is a port (digits, then the authority's end), in this order:
# - up to the first "@" that a host (no "@", "/", "?", "#" or space) follows, no space in it;
# - not a port: up to the first such "@" across spaces (a password with a space) but no "/", "?", "#";
# - not a port: up to the last such "@" of its non-space run before another "://" (a password over 1024
#   characters; never past the next URL, so each start scans at most to it);
# - not a port and no "@" a host follows (a URL without a host: amqp://u:PW/vh): up to the authority's end ("/",
#   "?", "#" or the line's end), unless that is a mask already (masking twice changes nothing).
# The lazy ones are bounded, and a match is consumed whole, so a long text costs linear time.
_HOST_FOLLOWS = r"(?=@[^@\s/?#]*(?:[/?#\s]|$))"
USERINFO_PASSWORD = re.compile(
    r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://[^:/\s\[\]]{0,256}:"
    rf"(?P<secret>\S{{0,1024}}?{_HOST_FOLLOWS}"
    rf"|(?!\d{{1,5}}(?:[/?#,\s]|$))(?:[^/?#\n]{{0,1024}}?{_HOST_FOLLOWS}|(?:(?!://)\S)*{_HOST_FOLLOWS}"
    r"|(?!\*\*\*(?:[/?#\s]|$))[^/?#\n]+))",
    re.I,
)
# ?name=value or &name=value: a query parameter (its value is the secret when its name names one).
QUERY_PARAMETER = re.compile(r"[?&](?P<name>[^=&#?\s]{1,128})=(?P<secret>[^&#\s]*)")
# A libpq conninfo's key = value, the value quoted ('…', \' and \\ escaped) or up to a space.
_CONNINFO_SECRET = re.compile(
    r"(?<![\w.&?-])(?P<name>[A-Za-z_]*pass(?:word|wd)[A-Za-z_]*)\s*=\s*(?P<secret>'(?:[^'\\]|\\.)*'|[^\s']+)",
    re.I,
)
# Inside a query value that is a mapping (pika's ssl_options={'password': '…'}): a secret-named key's value.
_NESTED_SECRET = re.compile(
    r"""['"]?[\w.-]*(?:password|passwd|passphrase|secret|token)[\w.-]*['"]?\s*[:=]\s*(?P<secret>'[^']*'|"[^"]*"|[^,}\s]+)""",
    re.I,
)
_SECRET_NAME = re.compile(r"pass(?:word|wd|phrase)|secret|token|credential|api_?key", re.I)
_URL = re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://\S*", re.I)


def is_secret_parameter(match: re.Match[str]) -> bool:
    """A :data:`QUERY_PARAMETER` match whose name (percent-decoded) names a secret: ``password``, ``sslpassword``…"""
    return bool(_SECRET_NAME.search(unquote(match["name"])))


def _masked(secret: str) -> str:
    """:data:`MASK` in the quotes ``secret`` was written in."""
    return secret[0] + MASK + secret[0] if secret[:1] in ("'", '"') and len(secret) > 1 else MASK


def _unquoted(secret: str) -> str:
    """A conninfo's or a mapping's quoted value as the program reads it."""
    if secret[:1] in ("'", '"') and len(secret) > 1:
        return re.sub(r"\\(.)", r"\1", secret[1:-1])
    return secret


def _redacted(text: str) -> tuple[str, list[str]]:
    """``text`` with every secret masked, and the secrets found (as written)."""
    found: list[str] = []

    def hide(match: re.Match[str]) -> str:
        secret = match["secret"]
        if not secret or _unquoted(secret) == MASK:
            return match[0]
        found.append(secret)
        start, end = match.span("secret")
        return match[0][: start - match.start()] + MASK + match[0][end - match.start() :]

    def hide_parameter(match: re.Match[str]) -> str:
        if is_secret_parameter(match):
            return hide(match)
        value = unquote_plus(match["secret"])
        nested = list(_NESTED_SECRET.finditer(value))
        secrets = [m["secret"] for m in nested if _unquoted(m["secret"]) and _unquoted(m["secret"]) != MASK]
        if not secrets:
            return match[0]
        found.extend(secrets)
        for inner in reversed(nested):
            start, end = inner.span("secret")
            value = value[:start] + _masked(inner["secret"]) + value[end:]
        return match[0][: match.start("secret") - match.start()] + quote(value, safe="*")

    text = USERINFO_PASSWORD.sub(hide, text)
    text = QUERY_PARAMETER.sub(hide_parameter, text)
    urls = [m.span() for m in _URL.finditer(text)]

    def hide_conninfo(match: re.Match[str]) -> str:
        inside_a_url = any(start <= match.start() < end for start, end in urls)  # a query's: masked above
        return match[0] if inside_a_url else hide(match)

    return _CONNINFO_SECRET.sub(hide_conninfo, text), found


def redact_url(url: str) -> str:
    """``url`` (a URL, a conninfo string, or a text holding them) with every secret replaced by :data:`MASK`."""
    return _redacted(url)[0]


def url_secrets(url: str) -> list[str]:
    """The secrets :func:`redact_url` hides in ``url``: as written, unquoted and percent-decoded; none empty."""
    written = _redacted(url)[1]
    forms = [form for secret in written for form in (secret, _unquoted(secret), unquote(_unquoted(secret)))]
    return [form for form in dict.fromkeys(forms) if form and form != MASK]
