"""Bearer tokens and permissions of the operations API (issue 11): who may do what."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from support.api_support import AUDIENCE, ISSUER, ApiClient, api_settings, public_jwk, serving
from support.factories import QUEUE, add_dead_letters

from maintenance.api.auth import DISCARD, READ, REPLAY
from maintenance.api.server import build_app
from maintenance.settings import ConfigError, Settings

BASE = "/v1/core/dead-letters"
ENDPOINTS = [
    ("GET", BASE, None, READ),
    ("GET", f"{BASE}/1", None, READ),
    ("POST", f"{BASE}/1/replay", {}, REPLAY),
    ("POST", f"{BASE}/1/discard", {"reason": "r"}, DISCARD),
    ("POST", f"{BASE}/replay", {"ids": [1]}, REPLAY),
    ("POST", f"{BASE}/discard", {"ids": [1], "reason": "r"}, DISCARD),
]


def call(api, method, path, body, headers=None):
    return api.request(method, path, json=body, headers=headers)


def assert_unauthenticated(response, description=None):
    assert response.status_code == 401, response.text
    assert response.json()["type"] == "urn:core-jobs:problem:unauthenticated"
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="core-jobs"')
    if description is not None:
        assert 'error="invalid_token"' in challenge and description in challenge


@pytest.mark.parametrize(("method", "path", "body", "_permission"), ENDPOINTS)
def test_every_endpoint_without_a_token_is_401_with_a_challenge(api, conn, method, path, body, _permission):
    """No Authorization header: 401 and WWW-Authenticate: Bearer realm=…, nothing else said."""
    assert_unauthenticated(call(api, method, path, body, headers={"Authorization": ""}))


@pytest.mark.parametrize(
    ("claims", "description"),
    [
        ({"expires_in": -120}, "expired"),
        ({"issuer": "https://evil.example/"}, "another issuer"),
        ({"audience": "some-other-api"}, "another audience"),
        ({"alg": "none"}, "algorithm is not accepted"),
        ({"alg": "HS256"}, "algorithm is not accepted"),
        ({"expires_in": None}, "lacks the exp claim"),
        ({"sub": None}, "lacks the sub claim"),
        ({"issuer": None}, "lacks the iss claim"),
        ({"audience": None}, "lacks the aud claim"),
        ({"nbf": 4_000_000_000}, "not valid yet"),
    ],
    ids=[
        "expired",
        "wrong-issuer",
        "wrong-audience",
        "alg-none",
        "hs256",
        "no-exp",
        "no-sub",
        "no-iss",
        "no-aud",
        "not-yet-valid",
    ],
)
def test_a_token_that_fails_verification_is_401(api, conn, tokens, claims, description):
    """Expired, foreign, unsigned, HS256-signed or incomplete tokens are refused with invalid_token and why."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    token = tokens.token(**claims)
    response = api.post(f"{BASE}/{letter}/replay", headers={"Authorization": f"Bearer {token}"})
    assert_unauthenticated(response, description)
    assert conn.execute("SELECT status FROM core.dead_letters").fetchone()[0] == "pending_review"


def test_a_token_signed_by_an_unpublished_key_is_401(api, conn, tokens, signing_keys):
    """The right kid but another key: the signature does not verify."""
    token = tokens.token(key=signing_keys.other_rsa, kid="rsa-1")
    assert_unauthenticated(api.get(BASE, headers={"Authorization": f"Bearer {token}"}), "signature does not verify")


@pytest.mark.parametrize("header", ["Bearer", "Bearer not.a.jwt", "Basic b3BzOnB3", "Bearer a.b"])
def test_a_malformed_authorization_header_is_401(api, conn, header):
    """Another scheme, an empty or unparseable token: 401 invalid_token."""
    assert_unauthenticated(api.get(BASE, headers={"Authorization": header}), "")


def test_a_token_within_the_leeway_is_accepted(api, conn, tokens):
    """A token that expired 10 s ago is still accepted (default leeway 30 s)."""
    token = tokens.token(expires_in=-10)
    assert api.get(BASE, headers={"Authorization": f"Bearer {token}"}).status_code == 200


@pytest.mark.parametrize(("method", "path", "body", "permission"), ENDPOINTS)
def test_a_tenant_token_is_403_naming_the_missing_permission(api, conn, method, path, body, permission):
    """A tenant's token (valid, but no core.dead_letters.* permission) gets 403 with the permission it lacks."""
    add_dead_letters(conn, QUEUE, 1)
    headers = api.as_operator("tenant:acme", permissions=("loyalty.points.read", "profile"))
    response = call(api, method, path, body, headers)
    assert response.status_code == 403
    problem = response.json()
    assert problem["type"] == "urn:core-jobs:problem:missing-permission" and problem["missing_permission"] == permission
    assert f'scope="{permission}"' in response.headers["www-authenticate"]
    assert conn.execute("SELECT status FROM core.dead_letters").fetchone()[0] == "pending_review"


def test_each_permission_opens_only_its_own_actions(api, conn):
    """read lists but cannot replay; replay replays but cannot discard; permissions are per action."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    reader = api.as_operator("ops:reader", permissions=(READ,))
    assert api.get(BASE, headers=reader).status_code == 200
    assert api.post(f"{BASE}/{letter}/replay", headers=reader).json()["missing_permission"] == REPLAY
    replayer = api.as_operator("ops:replayer", permissions=(REPLAY,))
    assert api.post(f"{BASE}/{letter}/discard", json={"reason": "r"}, headers=replayer).status_code == 403
    assert api.get(BASE, headers=replayer).status_code == 403
    assert api.post(f"{BASE}/{letter}/replay", headers=replayer).status_code == 200


def test_permissions_may_come_as_a_permissions_array(api, conn, tokens):
    """A `permissions` claim (array) grants like a `scope` claim (space-separated string)."""
    token = tokens.token(permissions=[READ], style="permissions")
    assert api.get(BASE, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_an_es256_token_is_accepted(api, conn, tokens):
    """ES256 (the EC key of the JWKS) verifies like RS256."""
    assert api.get(BASE, headers={"Authorization": f"Bearer {tokens.token(alg='ES256')}"}).status_code == 200


def test_the_jwks_is_fetched_once_and_cached(api, conn, jwks, tokens):
    """Many requests, one JWKS fetch."""
    for _ in range(5):
        assert api.get(BASE, headers={"Authorization": f"Bearer {tokens.token()}"}).status_code == 200
    assert jwks.fetches == 1


def test_a_rotated_key_is_fetched_on_its_unknown_kid(api, conn, jwks, tokens, signing_keys):
    """After the issuer rotates to a new key, the first token naming its kid fetches the JWKS again and verifies."""
    assert api.get(BASE).status_code == 200
    jwks.publish(public_jwk(signing_keys.other_rsa, "rsa-2"))
    token = tokens.token(key=signing_keys.other_rsa, kid="rsa-2")
    assert api.get(BASE, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert jwks.fetches == 2


def test_unknown_kids_fetch_the_jwks_at_most_once_per_interval(database_url, jwks, tokens, signing_keys):
    """With a refetch interval, a stream of unknown kids does not hammer the issuer: refused, no new fetch."""
    settings = api_settings(database_url, jwks.url, api_jwks_refetch_interval=3600)
    app = build_app(settings)
    with serving(app, settings) as url, ApiClient(url, tokens, app) as client:
        assert client.get(BASE).status_code == 200
        for n in range(3):
            token = tokens.token(key=signing_keys.other_rsa, kid=f"forged-{n}")
            assert_unauthenticated(client.get(BASE, headers={"Authorization": f"Bearer {token}"}), "kid")
    assert jwks.fetches == 1


def test_an_unreachable_jwks_is_503_not_401(database_url, tokens):
    """When the issuer's keys cannot be fetched the fault is not the client's: 503 keys-unavailable."""
    settings = api_settings(database_url, "http://127.0.0.1:9/jwks.json")
    app = build_app(settings)
    with serving(app, settings) as url, ApiClient(url, tokens, app) as client:
        response = client.get(BASE)
    assert response.status_code == 503 and response.json()["type"] == "urn:core-jobs:problem:keys-unavailable"


def test_a_public_key_file_verifies_tokens_without_a_jwks(database_url, tokens, signing_keys, tmp_path):
    """CORE_JOBS_API_JWT_PUBLIC_KEY_FILE: tokens signed by its key pass, others fail."""
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(signing_keys.rsa.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    settings = Settings(
        database_url=database_url, api_jwt_public_key_file=str(pem), api_jwt_issuer=ISSUER, api_jwt_audience=AUDIENCE
    )
    app = build_app(settings)
    with serving(app, settings) as url, ApiClient(url, tokens, app) as client:
        assert client.get(BASE).status_code == 200
        forged = tokens.token(key=signing_keys.other_rsa)
        assert client.get(BASE, headers={"Authorization": f"Bearer {forged}"}).status_code == 401


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "exactly one of CORE_JOBS_API_JWKS_URL"),
        (
            {"api_jwks_url": "http://127.0.0.1:9/j", "api_jwt_audience": AUDIENCE},
            "CORE_JOBS_API_JWT_ISSUER is required",
        ),
        ({"api_jwks_url": "http://127.0.0.1:9/j", "api_jwt_issuer": ISSUER}, "CORE_JOBS_API_JWT_AUDIENCE is required"),
        (
            {"api_jwt_public_key_file": "/nonexistent.pem", "api_jwt_issuer": ISSUER, "api_jwt_audience": AUDIENCE},
            "cannot read a PEM public key",
        ),
    ],
)
def test_the_api_does_not_start_without_a_key_source_issuer_and_audience(database_url, values, message):
    """Incomplete auth settings are a configuration error naming what to set."""
    with pytest.raises(ConfigError, match=message):
        build_app(Settings(database_url=database_url, **values))


@pytest.mark.parametrize("algorithms", ["HS256", "none", "RS256,HS512"])
def test_only_asymmetric_algorithms_can_be_configured(clean_env, algorithms):
    """CORE_JOBS_API_JWT_ALGORITHMS refuses none and HS*."""
    from maintenance.settings import load_settings

    clean_env.setenv("CORE_JOBS_API_JWT_ALGORITHMS", algorithms)
    with pytest.raises(ConfigError, match="only asymmetric algorithms"):
        load_settings()


def test_tokens_never_reach_the_log(api, conn, tokens, logs):
    """Neither an accepted nor a refused token appears in any log line."""
    logs.at_level("DEBUG")
    good, expired = tokens.token(), tokens.token(expires_in=-600)
    api.get(BASE, headers={"Authorization": f"Bearer {good}"})
    api.get(BASE, headers={"Authorization": f"Bearer {expired}"})
    assert {"maintenance.api.request", "maintenance.api.token_refused"} <= set(logs.names())
    for token in (good, expired):
        assert token not in logs.text and token.split(".")[2] not in logs.text


class CountingKeys:
    """The session's RSA public key, counting how often a verification asks for it."""

    def __init__(self, key):
        self.key, self.asked = key, 0

    def key_for(self, kid):
        self.asked += 1
        return self.key


def test_a_token_is_verified_once_a_minute_not_per_request(tokens, signing_keys):
    """The same token again within 60 s is answered from the cache; after 60 s it is verified again."""
    from maintenance.api.auth import TokenVerifier

    now = [time.time()]
    keys = CountingKeys(signing_keys.rsa.public_key())
    verifier = TokenVerifier(
        keys, issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256"], leeway=0, clock=lambda: now[0]
    )
    token = tokens.token(expires_in=3600)  # valid on PyJWT's own clock throughout
    for _ in range(3):
        assert verifier.verify(token).subject == "ops:ana@example.com"
    assert keys.asked == 1
    now[0] += 61
    verifier.verify(token)
    assert keys.asked == 2


def test_a_cached_token_is_not_accepted_past_its_exp(tokens, signing_keys):
    """The cache never outlives the token: at exp it is verified again, and refused once expired."""
    from maintenance.api.auth import InvalidToken, TokenVerifier

    keys = CountingKeys(signing_keys.rsa.public_key())
    real_now = time.time()
    now = [real_now]
    verifier = TokenVerifier(
        keys, issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256"], leeway=0, clock=lambda: now[0]
    )
    token = tokens.token(expires_in=5)
    verifier.verify(token)
    now[0] = real_now + 6  # past exp for the cache; PyJWT's own clock still says valid
    verifier.verify(token)
    assert keys.asked == 2
    expired = tokens.token(expires_in=-1)
    with pytest.raises(InvalidToken, match="expired"):
        verifier.verify(expired)


def test_the_cache_answers_only_a_token_verified_and_not_yet_past_its_cache_time(tokens, signing_keys):
    """cached() gives the principal of a verified token until its cache time, and None for one never verified or refused."""
    from maintenance.api.auth import InvalidToken, TokenVerifier

    now = [time.time()]
    keys = CountingKeys(signing_keys.rsa.public_key())
    verifier = TokenVerifier(
        keys, issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256"], leeway=0, clock=lambda: now[0]
    )
    token, expired = tokens.token(expires_in=3600), tokens.token(expires_in=-1)
    assert verifier.cached(token) is None  # never verified: the caller verifies it (off the event loop)
    verifier.verify(token)
    assert verifier.cached(token) == verifier.verify(token)
    with pytest.raises(InvalidToken):
        verifier.verify(expired)
    assert verifier.cached(expired) is None
    assert verifier.cached("x" * 9000) is None
    now[0] += 61
    assert verifier.cached(token) is None
    assert keys.asked == 2  # the lookups verified nothing
