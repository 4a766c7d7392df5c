"""Bearer-token authentication and per-action permissions of the operations API.

Every ``/v1`` request carries ``Authorization: Bearer <JWT>``. The token is verified with
PyJWT against the issuer's keys — a JWKS URL (:class:`JwksKeys`: PyJWKClient, the key set
cached for ``CORE_JOBS_API_JWKS_CACHE_LIFESPAN``, fetched again when a token names an unknown
``kid``, at most once per ``CORE_JOBS_API_JWKS_REFETCH_INTERVAL``) or a PEM public key file
(:class:`PublicKeyFile`). Only asymmetric algorithms are accepted (``CORE_JOBS_API_JWT_ALGORITHMS``,
default RS256 and ES256): ``alg=none`` and HS256 (a shared secret anyone holding the public key
could "sign" with) are refused before any key is looked up. ``exp``, ``iss``, ``aud`` and
``sub`` are required; ``iss`` and ``aud`` must equal the configured issuer and audience; ``exp``,
``nbf`` and ``iat`` are checked with ``CORE_JOBS_API_JWT_LEEWAY`` of clock skew.

Permissions are the union of the ``scope`` claim (space-separated, RFC 9068) and a
``permissions`` array (Auth0 style). Each endpoint needs one — ``core.dead_letters.read``,
``.replay`` or ``.discard``, ``core.executions.read`` — and a token without it gets 403 naming the permission. A tenant's
token carries none of them. The operator written to the audit ledger is the token's ``sub``,
never anything the client sends.

The resolution of executions (R-5, :mod:`maintenance.api.resources.resolutions`) needs a role and
business scopes instead of a permission: the ``roles`` array must contain
``EXECUTION_OPERATOR`` and the ``business_scopes`` array the execution's business scope.

401 answers carry ``WWW-Authenticate: Bearer realm="core-jobs"`` (with
``error="invalid_token"`` and a fixed description when a token was sent, RFC 6750), 403
answers ``error="insufficient_scope"``. The token itself is never logged or echoed.

A token longer than :data:`MAX_TOKEN_CHARS` (8 192 characters; a token of a few dozen
permissions is 1-2 KB) is refused with 401 before PyJWT sees it: nothing is decoded or cached
for it. The server bounds the headers as a whole (:mod:`maintenance.api.server`, 431).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi import Request

from maintenance.api.problems import Problem
from maintenance.api.threads import VERIFYING, run_on
from maintenance.runtime.logs import get_logger

READ = "core.dead_letters.read"
REPLAY = "core.dead_letters.replay"
DISCARD = "core.dead_letters.discard"
EXECUTIONS_READ = "core.executions.read"  # the durable-action executions
PERMISSIONS = (READ, REPLAY, DISCARD, EXECUTIONS_READ)

REALM = "core-jobs"
MAX_TOKEN_CHARS = 8192


class InvalidToken(Exception):
    """The token fails verification; the message is a fixed description, safe to send back."""


class KeysUnavailable(Exception):
    """The issuer's keys cannot be fetched (the JWKS endpoint is down): 503, not the client's fault."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's ``sub`` and the permissions it grants."""

    subject: str
    permissions: frozenset[str]
    roles: frozenset[str] = frozenset()  # the ``roles`` claim's strings (EXECUTION_OPERATOR, R-5)
    business_scopes: frozenset[str] = frozenset()  # the ``business_scopes`` claim's strings


class KeySource(Protocol):
    def key_for(self, kid: str | None) -> Any: ...


class PublicKeyFile:
    """One public key from a PEM file, read once at start; the token's ``kid`` is not needed."""

    def __init__(self, path: str | Path) -> None:
        try:
            key = load_pem_public_key(Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read a PEM public key from {path}: {exc}") from None
        if not isinstance(
            key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
        ):
            raise ValueError(f"{path}: an RSA, EC or Ed25519/Ed448 public key is needed, not {type(key).__name__}")
        self._key = key

    def key_for(self, kid: str | None) -> Any:
        return self._key


class JwksKeys:
    """The signing keys of a JWKS URL, cached; an unknown ``kid`` fetches the set again (rate-limited)."""

    def __init__(self, url: str, *, lifespan: float, refetch_interval: float, timeout: float) -> None:
        self.client = jwt.PyJWKClient(url, lifespan=lifespan, cooldown_duration=refetch_interval, timeout=timeout)

    def key_for(self, kid: str | None) -> Any:
        if not kid:
            raise InvalidToken("the token names no key (kid)")
        try:
            return self.client.get_signing_key(kid).key
        except jwt.PyJWKClientConnectionError:
            raise KeysUnavailable("the issuer's JWKS cannot be fetched") from None
        except jwt.PyJWKClientError:
            raise InvalidToken("no key of the issuer matches the token's kid") from None


_DESCRIPTIONS: list[tuple[type[Exception], str]] = [
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet"),
    (jwt.InvalidIssuerError, "the token is from another issuer"),
    (jwt.InvalidAudienceError, "the token is meant for another audience"),
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.InvalidAlgorithmError, "the token's algorithm is not accepted"),
    (jwt.InvalidKeyError, "the token's algorithm does not fit the issuer's key"),
    (jwt.DecodeError, "the token is not a well-formed JWT"),
]


class TokenVerifier:
    """Verifies bearer tokens and returns who is calling (:class:`Principal`).

    A verified token is remembered for at most :data:`CACHE_SECONDS` (and never past its ``exp``):
    an operator's client sends the same token with every request, and verifying it again each
    time was a third of a list request's CPU. A key withdrawn from the JWKS stops a cached token
    within that minute; a refused token is never cached.
    """

    CACHE_SECONDS = 60.0
    CACHE_SIZE = 1024

    def __init__(
        self, keys: KeySource, *, issuer: str, audience: str, algorithms: list[str], leeway: float, clock=time.time
    ) -> None:
        self.keys, self.issuer, self.audience, self.algorithms, self.leeway = keys, issuer, audience, algorithms, leeway
        self.clock = clock
        self._verified: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Principal | None:
        """The principal of ``token`` when it was verified and its cache time has not passed; else None.

        A dictionary lookup, no I/O and no cryptography: the API answers a known token on its
        event loop and verifies any other in a worker thread (:func:`authenticate`).
        """
        if len(token) > MAX_TOKEN_CHARS:
            return None
        with self._lock:
            cached = self._verified.get(token)
        return cached[1] if cached is not None and cached[0] > self.clock() else None

    def verify(self, token: str) -> Principal:
        if len(token) > MAX_TOKEN_CHARS:  # before the cache and PyJWT: nothing is decoded
            raise InvalidToken(f"the token is longer than {MAX_TOKEN_CHARS} characters")
        cached = self.cached(token)
        if cached is not None:
            return cached
        now = self.clock()
        principal, expires = self._verify(token)
        with self._lock:
            if len(self._verified) >= self.CACHE_SIZE:
                self._verified = {t: c for t, c in self._verified.items() if c[0] > now}
                if len(self._verified) >= self.CACHE_SIZE:
                    self._verified.clear()
            self._verified[token] = (min(expires, now + self.CACHE_SECONDS), principal)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        if algorithm not in self.algorithms:  # none, HS*: refused before any key is looked up
            raise InvalidToken(f"the token's algorithm is not accepted (accepted: {', '.join(self.algorithms)})")
        kid = header.get("kid")
        key = self.keys.key_for(kid if isinstance(kid, str) else None)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=self.issuer,
                audience=self.audience,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"the token lacks the {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(
                next((text for kind, text in _DESCRIPTIONS if isinstance(exc, kind)), "the token does not verify")
            ) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip():
            raise InvalidToken("the token's sub is not a non-blank string")
        principal = Principal(
            subject=subject.strip(),
            permissions=permissions_of(claims),
            roles=strings_of(claims, "roles"),
            business_scopes=strings_of(claims, "business_scopes"),
        )
        return principal, float(claims["exp"])


def permissions_of(claims: dict[str, Any]) -> frozenset[str]:
    """The ``scope`` claim's words (RFC 9068) and the ``permissions`` array's strings, together."""
    granted: set[str] = set()
    scope = claims.get("scope")
    if isinstance(scope, str):
        granted.update(scope.split())
    listed = claims.get("permissions")
    if isinstance(listed, list):
        granted.update(p for p in listed if isinstance(p, str))
    return frozenset(granted)


def strings_of(claims: dict[str, Any], name: str) -> frozenset[str]:
    """The strings of an array claim (anything else in it, or a claim that is no array, grants nothing)."""
    listed = claims.get(name)
    return frozenset(v for v in listed if isinstance(v, str)) if isinstance(listed, list) else frozenset()


def _unauthenticated(description: str | None) -> Problem:
    challenge = f'Bearer realm="{REALM}"'
    if description is not None:
        challenge += f', error="invalid_token", error_description="{description}"'
    detail = description or "send Authorization: Bearer <token>"
    return Problem(401, "unauthenticated", detail, headers={"WWW-Authenticate": challenge})


async def authenticate(request: Request) -> Principal:
    """The caller of ``request``, or a 401 problem; the route's permission is checked by :func:`require`.

    Async, so FastAPI runs it on the event loop: a token verified in the last minute is a
    dictionary lookup there (:meth:`TokenVerifier.cached`). Any other is verified in a worker
    thread — a signature check, and a JWKS fetch when its ``kid`` is new, must not hold the loop.
    As a sync dependency every request paid a thread handoff there and back for a lookup; under
    8 clients on 2 cores each handoff cost 2-5 ms at the median, up to 60 ms at p95.
    """
    header = request.headers.get("authorization")
    if header is None:
        raise _unauthenticated(None)
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthenticated("the Authorization header is not Bearer <token>")
    verifier: TokenVerifier = request.app.state.verifier
    token = token.strip()
    try:
        principal = verifier.cached(token)
        if principal is None:
            principal = await run_on(VERIFYING, verifier.verify, token)  # never an endpoint's thread
        request.state.subject = principal.subject  # for the request log
        return principal
    except InvalidToken as exc:
        get_logger().info("maintenance.api.token_refused", reason=str(exc), route=_route(request))
        raise _unauthenticated(str(exc)) from None
    except KeysUnavailable as exc:
        get_logger().warning("maintenance.api.keys_unavailable", error=str(exc))
        raise Problem(503, "keys-unavailable", str(exc)) from None


def require(permission: str):
    """A FastAPI dependency: the caller, when its token grants ``permission``; else 401 or 403."""

    async def dependency(request: Request) -> Principal:
        principal = await authenticate(request)
        if permission not in principal.permissions:
            get_logger().info(
                "maintenance.api.permission_refused",
                subject=principal.subject,
                permission=permission,
                route=_route(request),
            )
            raise Problem(
                403,
                "missing-permission",
                f"this action needs the permission {permission}",
                missing_permission=permission,
                headers={
                    "WWW-Authenticate": f'Bearer realm="{REALM}", error="insufficient_scope", scope="{permission}"'
                },
            )
        return principal

    dependency.__name__ = f"require_{permission.rsplit('.', 1)[-1]}"
    return dependency


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path_format", request.url.path)
