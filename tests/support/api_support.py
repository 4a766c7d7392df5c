"""Fixtures of the operations API tests (loaded by conftest.py): keys, a JWKS server, tokens, the API itself.

- ``signing_keys``: an RSA and an EC (secp256r1) key pair generated for the session (never on disk
  but for the key-file test).
- ``jwks``: the issuer's JWKS served by a real local HTTP server (pytest-httpserver), with the
  session's public keys; ``jwks.publish(...)`` rotates them, ``jwks.fetches`` counts requests.
- ``tokens``: mints real RS256/ES256 tokens (:class:`Minter`) — any claims, expired, foreign,
  ``alg=none``, HS256.
- ``as_api_role``: a connection of the test's database as the API role ``core_jobs_api``.
- ``login_role``: makes LOGIN roles for the test (``login_role("IN ROLE core_jobs_api")``) and
  gives a URL of this test's database that logs in as each; dropped after the test (roles are
  cluster-wide: each name is random).
- ``api``: the app built from the settings like ``core-jobs api`` builds it, served by uvicorn on
  a free port of 127.0.0.1 in a thread, against this test's database; an :class:`ApiClient`
  (httpx) with ``as_operator(...)`` to send a token; ``admin_api`` the same in admin mode
  (issue 13), an :class:`AdminClient` with ``operator(...)`` for a resolver's token.
- :func:`assert_problem`: an answer is the problem+json of that status and type.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from maintenance.api.auth import DISCARD, EXECUTIONS_READ, READ, REPLAY

ISSUER = "https://id.ops.example/"
AUDIENCE = "core-jobs-api"
OPERATOR = "ops:ana@example.com"
PROBLEM = "urn:core-jobs:problem:"
ALL_PERMISSIONS = (READ, REPLAY, DISCARD, EXECUTIONS_READ)
READER_SCOPES = ("loyalty", "billing")  # the default token's business_scopes: the executions it may read


@dataclass(frozen=True)
class SigningKeys:
    rsa: rsa.RSAPrivateKey
    ec: ec.EllipticCurvePrivateKey
    other_rsa: rsa.RSAPrivateKey  # a key the issuer never published


@pytest.fixture(scope="session")
def signing_keys() -> SigningKeys:
    return SigningKeys(
        rsa=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec=ec.generate_private_key(ec.SECP256R1()),
        other_rsa=rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def public_jwk(private_key: Any, kid: str) -> dict[str, Any]:
    if isinstance(private_key, rsa.RSAPrivateKey):
        jwk = json.loads(RSAAlgorithm.to_jwk(private_key.public_key()))
        jwk["alg"] = "RS256"
    else:
        jwk = json.loads(ECAlgorithm.to_jwk(private_key.public_key()))
        jwk["alg"] = "ES256"
    return {**jwk, "kid": kid, "use": "sig"}


@dataclass
class Jwks:
    """The issuer's key set on a real local HTTP endpoint."""

    server: HTTPServer
    keys: list[dict[str, Any]] = field(default_factory=list)
    fetches: int = 0
    path: str = "/.well-known/jwks.json"

    @property
    def url(self) -> str:
        return self.server.url_for(self.path)

    def publish(self, *jwks: dict[str, Any]) -> None:
        self.keys = list(jwks)

    def _handle(self, request: Request) -> Response:
        self.fetches += 1
        return Response(json.dumps({"keys": self.keys}), content_type="application/json")


@pytest.fixture
def jwks(httpserver: HTTPServer, signing_keys: SigningKeys) -> Jwks:
    served = Jwks(httpserver)
    served.publish(public_jwk(signing_keys.rsa, "rsa-1"), public_jwk(signing_keys.ec, "ec-1"))
    httpserver.expect_request(served.path).respond_with_handler(served._handle)
    return served


@dataclass
class Minter:
    keys: SigningKeys

    def token(
        self,
        *,
        permissions: tuple[str, ...] | list[str] = ALL_PERMISSIONS,
        sub: str | None = OPERATOR,
        style: str = "scope",
        alg: str = "RS256",
        kid: str | None = None,
        key: Any = None,
        issuer: str | None = ISSUER,
        audience: str | None = AUDIENCE,
        expires_in: float | None = 300,
        **claims: Any,
    ) -> str:
        """A signed token; ``style`` puts the permissions in ``scope`` (space-separated) or ``permissions``."""
        now = int(time.time())
        body: dict[str, Any] = {"iat": now}
        for name, value in (("sub", sub), ("iss", issuer), ("aud", audience)):
            if value is not None:
                body[name] = value
        if expires_in is not None:
            body["exp"] = now + int(expires_in)
        if style == "scope":
            body["scope"] = " ".join(permissions)
        else:
            body["permissions"] = list(permissions)
        body.update(claims)
        if alg == "none":
            return jwt.encode(body, None, algorithm="none", headers={"kid": kid or "rsa-1"})
        if alg.startswith("HS"):
            return jwt.encode(
                body, key or "a-shared-secret-of-32-bytes-len!", algorithm=alg, headers={"kid": kid or "rsa-1"}
            )
        signer = key or (self.keys.ec if alg.startswith("ES") else self.keys.rsa)
        default_kid = "ec-1" if alg.startswith("ES") else "rsa-1"
        return jwt.encode(body, signer, algorithm=alg, headers={"kid": kid or default_kid})


@pytest.fixture
def tokens(signing_keys: SigningKeys) -> Minter:
    return Minter(signing_keys)


class ApiClient(httpx.Client):
    """An HTTP client of the running API, with a default token of every permission."""

    def __init__(self, base_url: str, minter: Minter, app: Any) -> None:
        super().__init__(base_url=base_url, timeout=30)
        self.minter, self.app = minter, app
        self.headers["Authorization"] = f"Bearer {minter.token(business_scopes=list(READER_SCOPES))}"

    def as_operator(self, sub: str = OPERATOR, permissions: tuple[str, ...] = ALL_PERMISSIONS, **claims: Any) -> dict:
        """Headers with a token of ``sub`` granting ``permissions`` (business scopes READER_SCOPES unless given)."""
        claims = {"business_scopes": list(READER_SCOPES)} | claims
        return {"Authorization": f"Bearer {self.minter.token(sub=sub, permissions=permissions, **claims)}"}


def api_settings(database_url: str, jwks_url: str, **overrides: Any):
    from maintenance.settings import Settings

    values = {
        "database_url": database_url,
        "api_jwks_url": jwks_url,
        "api_jwt_issuer": ISSUER,
        "api_jwt_audience": AUDIENCE,
        "api_jwks_refetch_interval": 0,
    } | overrides
    return Settings(**values)


def serving(app: Any, settings: Any):
    """``app`` on uvicorn on a free port of 127.0.0.1, in a thread, for a ``with`` block; yields its base URL."""
    from maintenance.api.server import running

    return running(app, settings)


@pytest.fixture
def as_api_role(database_url: str) -> Iterator[Any]:
    """A connection of this test's database switched to the API role, as every API connection is."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("SET ROLE core_jobs_api")
        yield connection


@pytest.fixture
def login_role(database_url: str) -> Iterator[Any]:
    """``make(options)``: a new LOGIN role created ``WITH LOGIN <options>``; a URL of this test's database as it."""
    import secrets
    from urllib.parse import urlsplit

    import psycopg
    from psycopg import sql

    made: list[str] = []

    def make(options: str = "") -> str:
        name = f"core_jobs_login_{secrets.token_hex(4)}"
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} WITH LOGIN ").format(sql.Identifier(name)) + sql.SQL(options))
        made.append(name)
        url = urlsplit(database_url)
        return url._replace(netloc=f"{name}@{url.hostname}:{url.port or 5432}").geturl()

    yield make
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(name)))


def running_api(settings: Any, tokens: Minter, client_class: type[ApiClient] = ApiClient) -> Iterator[ApiClient]:
    """The app ``core-jobs api`` builds from ``settings``, served for the test; a ``client_class`` of it."""
    from maintenance.api.server import build_app

    app = build_app(settings)
    with serving(app, settings) as url, client_class(url, tokens, app) as client:
        yield client


@pytest.fixture
def api(database_url: str, jwks: Jwks, tokens: Minter) -> Iterator[ApiClient]:
    """The API on this test's database, served over real HTTP; a client with a token of every permission."""
    yield from running_api(api_settings(database_url, jwks.url), tokens)


# --- admin mode: operator resolution of executions (issue 13) ----------------------------------
PUBLISHED_CONSUMERS = ["support.resolution_consumers:ledger_points"]
SERVED_SCOPES = ["loyalty", "billing"]
OPERATOR_ROLE = "EXECUTION_OPERATOR"


def admin_settings(database_url: str, jwks_url: str, **overrides: Any):
    """The API's settings in admin mode: the tests' published definition, scopes loyalty and billing."""
    admin = {"admin_enabled": True, "admin_consumers": PUBLISHED_CONSUMERS, "admin_business_scopes": SERVED_SCOPES}
    return api_settings(database_url, jwks_url, **(admin | overrides))


class AdminClient(ApiClient):
    """A client of the API in admin mode; its default token is an operator of scope loyalty."""

    def __init__(self, base_url: str, minter: Minter, app: Any) -> None:
        super().__init__(base_url, minter, app)
        self.headers.update(self.operator())

    def operator(
        self, sub: str = OPERATOR, roles: tuple[str, ...] = (OPERATOR_ROLE,), scopes: tuple[str, ...] = ("loyalty",)
    ) -> dict:
        """Headers with a token of ``sub`` carrying ``roles`` and ``business_scopes``."""
        token = self.minter.token(sub=sub, permissions=(), roles=list(roles), business_scopes=list(scopes))
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def restricted_login_url(login_role: Any) -> str:
    """A URL of this test's database logging in as a new login granted core_jobs_api and nothing else."""
    return login_role("IN ROLE core_jobs_api")


@pytest.fixture
def admin_api(restricted_login_url: str, jwks: Jwks, tokens: Minter) -> Iterator[ApiClient]:
    """The API in admin mode on this test's database as a restricted login, over real HTTP; an operator's client."""
    yield from running_api(admin_settings(restricted_login_url, jwks.url), tokens, AdminClient)


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """``response`` is an application/problem+json answer of ``status`` and type ``slug``; its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == PROBLEM + slug and body["status"] == status
    return body
