"""The one credential detector: what a credential looks like in free text, for the log masking and the evidence screening.

Two places must recognise a credential in text nobody controls: the log redactor
(``maintenance/runtime/logs.py``) masks it in every log string, and the screening of a
resolution's evidence (:func:`maintenance.operations.resolution.evidence_problems`) refuses it before it
reaches the append-only ledger. They use this module, so a shape the logs mask is a shape the
ledger refuses. It lives in ``harness/`` because the screening does, and ``harness/`` imports
nothing from ``maintenance/``; ``maintenance/`` imports it.

The shapes (:data:`SHAPES`; each names the part that is the secret, which :func:`mask_credentials`
replaces by :data:`MASK`):

- a URL with a password in its user part, any scheme (``postgresql://u:pw@host``,
  ``redis://:pw@host``): the password runs up to the last ``@`` before the host, so a raw ``@``
  in it leaves nothing visible; and a query parameter naming a secret (``?password=``,
  ``&sslpassword=``) — both the harness's one URL masker's patterns (``harness/urls.py``);
- an ``Authorization``/``Proxy-Authorization`` header's credentials, whatever the scheme;
  ``Bearer`` and ``Basic`` credentials anywhere (``Basic`` only when it decodes to
  ``user:password``, so "Basic checks" stays prose); a ``Digest`` header's parameters;
- a JWT (three base64url segments), a PEM block (``-----BEGIN …-----`` to its ``-----END``);
- the prefixes of common provider keys: AWS (``AKIA``/``ASIA``), GitHub (``ghp_``, ``gho_``,
  ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), Slack (``xox?-``, webhook URLs), Stripe
  (``sk_``/``rk_`` live or test, ``whsec_``), Google (``AIza``, ``ya29.``);
- the prefixes of more provider keys: GitLab (``glpat-`` …), npm, PyPI, Hugging Face, SendGrid,
  OpenAI/Anthropic (``sk-``);
- a pair whose **key names a secret**, whatever its prefix, suffix, case or quoting —
  ``key=value``, ``key: value``, JSON/YAML, ``'key' => 'value'``, ``<key>value</key>``: a key
  holding ``password``/``passwd``/``apikey``/``privatekey``…, or with a word ``pwd``, ``secret``,
  ``credential`` (``PGPASSWORD``, ``spring.datasource.password``, ``DB_PWD``); a key with a word
  ``token``, ``auth``, ``session``, ``cookie`` only when its value looks like one (8+ characters,
  a letter and a digit), so ``fencing_token=5`` and ``auth: required`` stay; a ``Cookie`` header;
- command lines: ``-u``/``--user user:password``, ``--password value``, ``mysql -pPASSWORD``,
  ``sshpass -p``.

Every shape is looked for in the text as written, **decoded** (backslash escapes such as JSON's
``\\"`` and ``\\/``, and percent-encoding, undone to a fixed point) and decoded **with its lines
joined** (a key split over two lines): an escaped or encoded credential is the same credential.
When one is visible only decoded, the masked text is the decoded one. The patterns start only
where a run starts, and unbounded parts are bounded, so a long log string costs linear time.

:func:`credential_kind` also names a **long random-looking run** (32 characters or more of a
base64 alphabet whose Shannon entropy exceeds :data:`HIGH_ENTROPY_BITS` per character): evidence
is a case reference and prose, so such a run there is a token of unknown shape. The log redactor
does not mask those: a log line legitimately carries ids, digests and cursors of that look, and
masking them would blind the operator; it masks the shapes, which are unambiguous.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from harness.urls import MASK, QUERY_PARAMETER, USERINFO_PASSWORD, is_secret_parameter

__all__ = [
    "HIGH_ENTROPY_BITS",
    "MASK",
    "QUERY_PASSWORD",
    "SHAPES",
    "URL_PASSWORD",
    "Shape",
    "credential_kind",
    "mask_credentials",
]


def _decodes_to_user_password(match: re.Match[str]) -> bool:
    """A ``Basic`` credential is base64 (or base64url) of ``user:password``; "Basic checks" is not."""
    candidate = match["secret"].rstrip("=")
    padded = candidate + "=" * (-len(candidate) % 4)
    for altchars in (b"+/", b"-_"):
        try:
            decoded = base64.b64decode(padded, altchars=altchars, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        if ":" in decoded and decoded.isprintable():
            return True
    return False


# A key names a secret when one of its words (split at _ . - and camelCase) is one of these, or
# when it holds one of the unambiguous ones anywhere (PGPASSWORD, MYSQL_ROOT_PASSWORD).
_SECRET_SUBSTRINGS = (
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "privatekey",
    "accesskey",
    "secretkey",
    "clientsecret",
)
_SECRET_WORDS = frozenset({"pwd", "secret", "secrets", "credential", "credentials", "creds"})
# Words that name a secret only with a value that looks like one (fencing_token=5, auth: required
# and session: closed are not): at least 8 characters, a letter and a digit.
_TOKEN_WORDS = frozenset({"token", "auth", "authorization", "session", "sessionid", "sid", "cookie", "jwt"})


def _key_words(key: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)
    return [word for word in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if word]


def _names_a_secret(match: re.Match[str]) -> bool:
    """The pair's key names a secret, and its value could be one (the value of a token word looks random)."""
    words = _key_words(match["key"])
    joined = "".join(words)
    if any(part in joined for part in _SECRET_SUBSTRINGS) or _SECRET_WORDS.intersection(words):
        return True
    value = match["secret"].strip("\"'")
    looks_random = len(value) >= 8 and any(c.isalpha() for c in value) and any(c.isdigit() for c in value)
    return looks_random and any(word.endswith(tuple(_TOKEN_WORDS)) for word in words)


@dataclass(frozen=True)
class Shape:
    """A credential shape: the pattern's ``secret`` group is what is masked (the whole match without one)."""

    name: str
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] | None = None  # a further check of the match

    def secrets(self, text: str) -> list[tuple[int, int]]:
        """The spans of this shape's secrets in ``text`` (one already masked is not a secret)."""
        spans = []
        for match in self.pattern.finditer(text):
            group = "secret" if "secret" in self.pattern.groupindex else 0
            if match[group] and match[group].strip("\"'") != MASK and (self.accept is None or self.accept(match)):
                spans.append(match.span(group))
        return spans


# The URL shapes are the harness's one URL masker's (harness/urls.py): scheme://user:password@host, the user part
# up to its first ":" (it may hold a raw @), the password up to the last @ before the host; a query parameter whose
# name names a secret (?password=, &sslpassword=).
URL_PASSWORD = Shape("a URL with a password", USERINFO_PASSWORD)
QUERY_PASSWORD = Shape("a password in a URL's query", QUERY_PARAMETER, is_secret_parameter)

SHAPES: tuple[Shape, ...] = (
    URL_PASSWORD,
    QUERY_PASSWORD,
    # Any scheme's credentials after the header name; a Digest header's parameters are the next shape's.
    Shape(
        "an Authorization header",
        re.compile(
            r"\b(?:proxy-)?authorization\s*[:=]\s*(?!digest\s)(?:(?:basic|bearer|token)\s+)?(?P<secret>[^\s,;\"']+)",
            re.I,
        ),
    ),
    Shape("a Bearer credential", re.compile(r"\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)", re.I)),
    Shape(
        "a Basic credential",
        re.compile(r"\bbasic\s+(?P<secret>[A-Za-z0-9+/_-]{6,}={0,2})", re.I),
        _decodes_to_user_password,
    ),
    Shape(
        "a Digest credential",
        re.compile(r"\bdigest\s+(?P<secret>\w+=(?:\"[^\"]*\"|[^\s,]+)(?:\s*,\s*\w+=(?:\"[^\"]*\"|[^\s,]+))*)", re.I),
    ),
    # Its payload may be as short as e30 ({}).
    Shape("a JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")),
    Shape(
        "a JWT (three base64url segments)",
        re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ),
    # To its END line, or to the end of the text when it was cut.
    Shape("a PEM key", re.compile(r"-----BEGIN [0-9A-Z ]*-----[\s\S]*?(?:-----END [0-9A-Z ]*-----|$)")),
    Shape("an AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    Shape("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    Shape("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    Shape("a Slack webhook", re.compile(r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9/_-]{10,})", re.I)),
    Shape("a Stripe key", re.compile(r"\b(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}|whsec_[A-Za-z0-9]{16,})")),
    Shape("a GitLab token", re.compile(r"\bgl(?:pat|dt|rt|ptt|cbt)-[A-Za-z0-9_-]{20,}")),
    Shape("an npm or PyPI token", re.compile(r"\b(?:npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{50,})")),
    Shape("a Hugging Face token", re.compile(r"\bhf_[A-Za-z]{30,}")),
    Shape("a SendGrid key", re.compile(r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}")),
    Shape(
        "an OpenAI or Anthropic key",
        re.compile(r"\bsk-(?:proj-|ant-(?:api\d+-)?)?(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,}"),
    ),
    Shape("a Google key", re.compile(r"\b(?:AIza[0-9A-Za-z_-]{30,}|ya29\.[0-9A-Za-z_-]{16,})")),
    # key=value, key: value, "key": "value", 'key' => 'value', <key>value</key> — the value, quoted
    # or up to a separator, when the key names a secret whatever its prefix or case (PGPASSWORD,
    # spring.datasource.password, X-Auth-Token, apiToken); see _names_a_secret.
    Shape(
        "a credential",
        re.compile(
            r"(?<![A-Za-z0-9_.-])(?P<key>[A-Za-z0-9_.-]+)[\"']?\s*(?:[:=]>?)\s*"
            r"(?P<secret>\"[^\"]+\"|'[^']+'|[^\s&,;\"'<>]+)",
        ),
        _names_a_secret,
    ),
    Shape("a credential element", re.compile(r"<(?P<key>[\w.-]+)>(?P<secret>[^<]+)</(?P=key)>"), _names_a_secret),
    # A Cookie header: every name=value in it is a session's credential.
    Shape("a Cookie header", re.compile(r"\b(?:set-)?cookie\s*:\s*(?P<secret>[^\s=;]+=[^\r\n]*)", re.I)),
    # Command lines: curl's -u/--user user:password, a password flag's separate value, mysql's
    # -pPASSWORD (attached; -p alone prompts) and sshpass -p.
    Shape("a password on a command line", re.compile(r"(?<!\S)(?:-u|--user)\s*[^\s:]+:(?P<secret>\S+)")),
    Shape(
        "a password flag",
        re.compile(
            r"(?<!\S)--?[A-Za-z0-9-]*(?:password|passwd|passphrase|secret|token|api-?key)\s+(?P<secret>[^\s-]\S*)", re.I
        ),
    ),
    Shape("a mysql password", re.compile(r"\bmysql\w*\b[^\n;|&]{0,200}?\s-p(?P<secret>[^\s-]\S*)")),
    Shape("an sshpass password", re.compile(r"\bsshpass\s+-p\s*(?P<secret>\S+)")),
)

_LONG_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
HIGH_ENTROPY_BITS = 4.2  # per character; hex (a UUID, a digest) cannot exceed 4.09 with its dashes


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|x([0-9A-Fa-f]{2})|([\\\"'/nrt]))")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_ESCAPED_CHARS = {"n": "\n", "r": "\r", "t": "\t"}


def _unescaped(match: re.Match[str]) -> str:
    code = match[1] or match[2]
    if code:
        return chr(int(code, 16))
    return _ESCAPED_CHARS.get(match[3], match[3])


def _decoded(text: str) -> str:
    """``text`` with backslash escapes (JSON's ``\\"``, ``\\/``, ``\\u0077``) and percent-encoding undone, to a fixed point.

    A credential escaped inside JSON, or encoded in a URL's query (twice, even), is the same
    credential; the shapes are matched on what it decodes to. A few rounds, so nesting is bounded.
    """
    for _ in range(4):
        before = text
        text = _ESCAPE.sub(_unescaped, text)
        if _PERCENT.search(text):
            text = unquote(text, errors="surrogateescape")
        if text == before:
            break
    return text


def _joined(text: str) -> str:
    """``text`` with line breaks (and a backslash continuation) removed: a key split over two lines."""
    return re.sub(r"\\?[ \t]*\r?\n[ \t]*", "", text)


def _views(text: str) -> tuple[str, ...]:
    """What a credential in ``text`` may be seen in: the text, decoded, and decoded with its lines joined."""
    decoded = _decoded(text)
    return tuple(dict.fromkeys((text, decoded, _joined(decoded))))


def _found(text: str, shapes: tuple[Shape, ...]) -> str | None:
    return next((shape.name for shape in shapes if shape.secrets(text)), None)


def credential_kind(text: str) -> str | None:
    """What credential ``text`` holds (``"a JWT"``, …), or None; a long random-looking run counts too.

    The shapes are looked for in the text as written, decoded and with its lines joined; a random
    run in the text and decoded (not joined: two lines of ids would make one long run).
    """
    views = _views(text)
    for view in views:
        kind = _found(view, SHAPES)
        if kind is not None:
            return kind
    for view in views[:2]:
        if any(_entropy(run) > HIGH_ENTROPY_BITS for run in _LONG_RUN.findall(view)):
            return "a long random-looking token"
    return None


def _masked(text: str, shapes: tuple[Shape, ...]) -> str:
    for shape in shapes:
        spans = shape.secrets(text)
        for start, end in reversed(spans):
            text = text[:start] + MASK + text[end:]
    return text


def mask_credentials(text: str, shapes: tuple[Shape, ...] = SHAPES) -> str:
    """``text`` with the secret part of every credential of ``shapes`` replaced by :data:`MASK` (runs are left).

    In order: a shape masked first (a URL's password) is not seen again by a later one. When a
    credential is visible only once the text is decoded or its lines joined, the masked text is that
    view of it (decoded, joined): the escaped or split form cannot be masked in place safely.
    """
    masked = _masked(text, shapes)
    for view in _views(masked)[1:]:
        if _found(view, shapes) is not None:
            masked = _masked(view, shapes)
    return masked
