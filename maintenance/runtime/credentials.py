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
  in it leaves nothing visible; and a ``?password=`` query parameter;
- an ``Authorization``/``Proxy-Authorization`` header's credentials, whatever the scheme;
  ``Bearer`` and ``Basic`` credentials anywhere (``Basic`` only when it decodes to
  ``user:password``, so "Basic checks" stays prose); a ``Digest`` header's parameters;
- a JWT (three base64url segments), a PEM block (``-----BEGIN …-----`` to its ``-----END``);
- the prefixes of common provider keys: AWS (``AKIA``/``ASIA``), GitHub (``ghp_``, ``gho_``,
  ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), Slack (``xox?-``, webhook URLs), Stripe
  (``sk_``/``rk_`` live or test, ``whsec_``), Google (``AIza``, ``ya29.``);
- a ``password=``/``secret:``/``token=``/``api_key=`` … pair (the value after it).

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

MASK = "***"


def _decodes_to_user_password(candidate: str) -> bool:
    """A ``Basic`` credential is base64 of ``user:password``; "Basic checks" is not."""
    try:
        decoded = base64.b64decode(candidate + "=" * (-len(candidate) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


@dataclass(frozen=True)
class Shape:
    """A credential shape: the pattern's ``secret`` group is what is masked (the whole match without one)."""

    name: str
    pattern: re.Pattern[str]
    accept: Callable[[str], bool] | None = None  # a further check of the secret part

    def secrets(self, text: str) -> list[tuple[int, int]]:
        """The spans of this shape's secrets in ``text``."""
        spans = []
        for match in self.pattern.finditer(text):
            group = "secret" if "secret" in self.pattern.groupindex else 0
            if match[group] and (self.accept is None or self.accept(match[group])):
                spans.append(match.span(group))
        return spans


_TOKEN68 = r"[A-Za-z0-9._~+/-]+=*"
_PAIR_KEYS = (
    r"password|passwd|pwd|secret|client[_-]?secret|api[_-]?key|x-api-key|apikey|access[_-]?key|"
    r"(?:aws[_-]?)?secret[_-]?access[_-]?key|private[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|token"
)

# scheme://user:password@host — the user part may hold a raw @ too; the password runs up to the
# last @ before the host (the first @ not followed by another one before the host ends).
URL_PASSWORD = Shape(
    "a URL with a password",
    re.compile(r"[a-z][a-z0-9+.-]*://[^:/\s]*:(?P<secret>[^\s]*?)@(?=[^@\s/?#]*(?:[/?#\s]|$))", re.I),
)
# A libpq ?password= (or &password=) query parameter.
QUERY_PASSWORD = Shape("a password in a URL's query", re.compile(r"[?&]password=(?P<secret>[^&#\s]+)", re.I))

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
        re.compile(r"\bbasic\s+(?P<secret>[A-Za-z0-9+/]{6,}={0,2})", re.I),
        _decodes_to_user_password,
    ),
    Shape(
        "a Digest credential",
        re.compile(r"\bdigest\s+(?P<secret>\w+=(?:\"[^\"]*\"|[^\s,]+)(?:\s*,\s*\w+=(?:\"[^\"]*\"|[^\s,]+))*)", re.I),
    ),
    Shape("a JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),
    Shape(
        "a JWT (three base64url segments)",
        re.compile(r"[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ),
    # To its END line, or to the end of the text when it was cut.
    Shape("a PEM key", re.compile(r"-----BEGIN [0-9A-Z ]*-----[\s\S]*?(?:-----END [0-9A-Z ]*-----|$)")),
    Shape("an AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    Shape("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    Shape("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    Shape("a Slack webhook", re.compile(r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9/_-]{10,})", re.I)),
    Shape("a Stripe key", re.compile(r"\b(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}|whsec_[A-Za-z0-9]{16,})")),
    Shape("a Google key", re.compile(r"\b(?:AIza[0-9A-Za-z_-]{30,}|ya29\.[0-9A-Za-z_-]{16,})")),
    # key=value, key: value, "key": "value" — the value, quoted or up to a separator. The key stands
    # alone (fencing_token=5 is not a token); one already masked is left as it is.
    Shape(
        "a credential",
        re.compile(
            rf"(?<![A-Za-z0-9_.-])(?:{_PAIR_KEYS})[\"']?\s*[:=]\s*(?P<secret>\"[^\"]+\"|'[^']+'|[^\s&,;\"']+)",
            re.I,
        ),
        lambda value: value.strip("\"'") != MASK,
    ),
)

_LONG_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
HIGH_ENTROPY_BITS = 4.2  # per character; hex (a UUID, a digest) cannot exceed 4.09 with its dashes


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def credential_kind(text: str) -> str | None:
    """What credential ``text`` holds (``"a JWT"``, …), or None; a long random-looking run counts too."""
    for shape in SHAPES:
        if shape.secrets(text):
            return shape.name
    if any(_entropy(run) > HIGH_ENTROPY_BITS for run in _LONG_RUN.findall(text)):
        return "a long random-looking token"
    return None


def mask_credentials(text: str, shapes: tuple[Shape, ...] = SHAPES) -> str:
    """``text`` with the secret part of every credential of ``shapes`` replaced by :data:`MASK` (runs are left).

    In order: a shape masked first (a URL's password) is not seen again by a later one.
    """
    for shape in shapes:
        spans = shape.secrets(text)
        for start, end in reversed(spans):
            text = text[:start] + MASK + text[end:]
    return text
