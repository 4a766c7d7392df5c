"""The operations API's part of ``core-jobs demo``: list and replay over HTTP, with a throwaway key.

The demo generates an RSA key that lives only in memory and in a temporary public-key file,
starts the API (``maintenance.api``) on a free port of 127.0.0.1 against the demo's database,
mints a token that expires in 10 minutes, and then — over real HTTP — lists the pending dead
letters of points.credit, replays one with an ``Idempotency-Key``, sends the same request again
(the recorded answer, nothing replayed twice), and shows that a token without the replay
permission gets 403. It ends with the ``curl`` lines an operator would type against a real
deployment (``$TOKEN``: a token of your issuer; the demo's own is never printed).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TextIO

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from maintenance.api.auth import DISCARD, READ, REPLAY
from maintenance.api.server import build_app, running
from maintenance.settings import Settings

ISSUER = "https://demo.core-jobs.invalid/"
AUDIENCE = "core-jobs-api"
OPERATOR = "demo-operator@ops"
QUEUE = "points.credit"


def mint(key: rsa.RSAPrivateKey, permissions: tuple[str, ...], *, sub: str = OPERATOR, lifetime: int = 600) -> str:
    now = int(time.time())
    return jwt.encode(
        {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + lifetime, "scope": " ".join(permissions)},
        key,
        algorithm="RS256",
        headers={"kid": "demo"},
    )


def walk_through(settings: Settings, out: TextIO) -> None:
    """Run the HTTP story on the demo's (migrated, seeded) database, one line per step to ``out``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with tempfile.TemporaryDirectory(prefix="core-jobs-demo-key-") as folder:
        key_file = Path(folder, "issuer.pem")
        key_file.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
        api_settings = settings.model_copy(
            update={
                "api_jwt_public_key_file": str(key_file),
                "api_jwks_url": None,
                "api_jwt_issuer": ISSUER,
                "api_jwt_audience": AUDIENCE,
            }
        )
        app = build_app(api_settings)
        with running(app, api_settings) as url, httpx.Client(base_url=url, timeout=30) as http:
            _story(http, url, key, out)


def _story(http: httpx.Client, url: str, key: rsa.RSAPrivateKey, out: TextIO) -> None:
    def say(line: str) -> None:
        out.write(f"  {line}\n")

    operator = {"Authorization": f"Bearer {mint(key, (READ, REPLAY, DISCARD))}"}
    say(f"1. core-jobs api on {url} (a throwaway RSA key; a token for {OPERATOR}, valid 10 minutes)")
    page = http.get("/v1/core/dead-letters", params={"queue": QUEUE, "limit": 5}, headers=operator)
    items = page.json()["items"]
    say(
        f"2. GET /v1/core/dead-letters?queue={QUEUE}&limit=5 -> {page.status_code}: {len(items)} pending, newest "
        f"first (ids {', '.join(str(i['id']) for i in items)}); next_cursor {'set' if page.json()['next_cursor'] else 'null'}"
    )
    letter = items[-1]["id"]
    path, keyed = f"/v1/core/dead-letters/{letter}/replay", operator | {"Idempotency-Key": f"demo-replay-{letter}"}
    reason = {"reason": "ledger outage over, INC-88"}
    first = http.post(path, json=reason, headers=keyed)
    body = first.json()
    say(
        f"3. POST /v1/core/dead-letters/{letter}/replay (Idempotency-Key demo-replay-{letter}) -> {first.status_code}: "
        f"status {body['status']}, job {body['job_id']} republished with the same job_id"
    )
    again = http.post(path, json=reason, headers=keyed)
    say(
        f"4. the same request again -> {again.status_code}, Idempotent-Replayed: "
        f"{again.headers.get('idempotent-replayed')}, the same body: {again.content == first.content}"
    )
    plain = http.post(f"/v1/core/dead-letters/{letter}/replay", json={"reason": "once more"}, headers=operator)
    say(
        f"5. without the key -> {plain.status_code} {plain.json()['type']} (current_status "
        f"{plain.json().get('current_status')})"
    )
    reader = {"Authorization": f"Bearer {mint(key, (READ,), sub='demo-reader@ops')}"}
    refused = http.post(f"/v1/core/dead-letters/{items[0]['id']}/replay", headers=reader)
    say(f"6. a read-only token replaying -> {refused.status_code}: missing {refused.json()['missing_permission']}")
    detail = http.get(f"/v1/core/dead-letters/{letter}", headers=operator).json()
    for action in detail["actions"]:
        say(f"   audit: {action['operator']} {action['action']} {letter}: {action['reason']}")
    say(
        "   against a deployment (API: its address; TOKEN: a token of your issuer with core.dead_letters.* permissions):"
    )
    for line in (
        f"API={url}  # here, the demo's; it stops with the demo",
        f'curl -s -H "Authorization: Bearer $TOKEN" "$API/v1/core/dead-letters?queue={QUEUE}&limit=50"',
        f'curl -s -H "Authorization: Bearer $TOKEN" $API/v1/core/dead-letters/{letter}',
        f"curl -s -X POST -H \"Authorization: Bearer $TOKEN\" -H 'Idempotency-Key: '$(uuidgen) "
        f"-H 'Content-Type: application/json' -d '{{\"reason\": \"INC-88\"}}' "
        f"$API/v1/core/dead-letters/{letter}/replay",
        "curl -s -X POST -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' "
        '-d \'{"reason": "negative points, OPS-2001"}\' $API/v1/core/dead-letters/ID/discard',
    ):
        say(f"   $ {line}")
