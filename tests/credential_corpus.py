"""A corpus of credentials and of ordinary evidence, for the credential detector (maintenance/runtime/credentials.py).

``CREDENTIALS``: ``(id, text, secret)`` — text an operator might paste, holding a credential of a
common shape; ``secret`` is the part that must never be stored or logged. ``ORDINARY``: ``(id,
text)`` — what evidence normally is (ticket ids, provider reference numbers, URLs without
credentials, prose): accepted as it is. Every value here is made up for the tests.
"""

from __future__ import annotations

# Made-up values, assembled so that no scanner mistakes this file for a leak.
_B64 = "Qm9iIHNlbnQgYSBzZWNyZXQgdG9rZW4gaGVyZQx7Yz9K"
_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
_BASIC = "YWxpY2U6czNjcjN0LXB3"  # base64("alice:s3cr3t-pw")

CREDENTIALS: tuple[tuple[str, str, str], ...] = (
    ("postgresql-url", "checked on postgresql://app:Hunter2pw@db.internal:5432/core", "Hunter2pw"),
    ("postgres-alias-url", "postgres://report:pa55word@10.0.0.7/core?sslmode=require", "pa55word"),
    ("https-url", "callback https://svc:tok3n-x1@api.provider.example/v1/refunds", "tok3n-x1"),
    ("amqp-url", "broker amqp://guest:rabbit-pw@mq:5672/", "rabbit-pw"),
    ("redis-url", "redis://:r3dis-secret@cache:6379/0", "r3dis-secret"),
    ("basic-header", f"Authorization: Basic {_BASIC}", _BASIC),
    ("basic-alone", f"sent with basic {_BASIC} to the provider", _BASIC),
    (
        "bearer-header",
        "Authorization: Bearer 8f14e45fceea167a5a36dedd4bea2543xyz",
        "8f14e45fceea167a5a36dedd4bea2543xyz",
    ),
    ("bearer-short", "Bearer abcdefghijklmnop", "abcdefghijklmnop"),
    (
        "digest-header",
        'Authorization: Digest username="ops", realm="api", nonce="dcd98b7102dd2f0e", response="6629fae49393a053"',
        "6629fae49393a053",
    ),
    ("proxy-authorization", "Proxy-Authorization: Zm9vOmJhcg-x", "Zm9vOmJhcg-x"),
    ("jwt", f"token was {_JWT}", _JWT),
    ("jwt-no-eyj", "AbCdEfGhIjKlMnOpQr.StUvWxYzAbCdEfGhIj.KlMnOpQrStUvWxYz12", "StUvWxYzAbCdEfGhIj"),
    (
        "pem-private-key",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    ),
    (
        "pem-rsa-key",
        "-----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEA7xq -----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA7xq",
    ),
    ("aws-access-key", "key AKIAIOSFODNN7EXAMPLE in the console", "AKIAIOSFODNN7EXAMPLE"),
    ("aws-temporary-key", "ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    ("github-token", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    (
        "github-fine-grained",
        "github_pat_" + "11ABCDEFG0123456789_abcdefghij",
        "github_pat_" + "11ABCDEFG0123456789_abcdefghij",
    ),
    (
        "slack-token",
        "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKl",
        "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKl",
    ),
    (
        "slack-webhook",
        "posted to https://hooks.slack.com/services/T0000000/B0000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    ("stripe-secret", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"),
    ("stripe-restricted", "rk_test_" + "51H8xYzAbCdEfGh", "rk_test_" + "51H8xYzAbCdEfGh"),
    (
        "stripe-webhook-secret",
        "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
    ("google-api-key", "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
    (
        "google-oauth-token",
        "ya29." + "a0AfH6SMBx-long-oauth-access-token",
        "ya29." + "a0AfH6SMBx-long-oauth-access-token",
    ),
    ("password-pair", "case 12, password=hunter2", "hunter2"),
    ("password-colon", "db Password: Winter2024!", "Winter2024!"),
    ("secret-pair", "client_secret=s3cr3tValue", "s3cr3tValue"),
    ("token-pair", "token = abc123def456", "abc123def456"),
    ("api-key-pair", 'x-api-key: "k-9f8e7d6c"', "k-9f8e7d6c"),
    ("query-password", "https://db.example/x?user=u&password=qwerty77", "qwerty77"),
    ("high-entropy", f"see {_B64}", _B64),
)

ORDINARY: tuple[tuple[str, str], ...] = (
    ("ticket-id", "CASE-2026-1201"),
    ("jira", "OPS-4711"),
    ("servicenow", "INC0012345"),
    ("provider-case", "provider case 00482913, Stripe dashboard"),
    ("stripe-object-id", "refund re_3MtwBwLkdIwHu7ix28a3tqPa"),
    ("uuid", "provider case 5f2b8c1e-9a7d-4e3b-8c21-0d6f4a9b7e12"),
    ("sha256-digest", "receipt 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
    ("url-without-credentials", "https://status.provider.example/incidents/2026-03-01?tab=details#log"),
    ("url-with-user-only", "https://ops@tickets.example/browse/OPS-4711"),
    ("url-with-port", "https://api.provider.example:8443/v1/messages/msg-9"),
    ("email", "confirmed by ana@example.com on the provider's console"),
    ("prose", "The provider's console shows message msg-9 sent at 08:02; the charge was not created."),
    ("prose-basic", "Basic checks done: the bearer of the ticket confirmed the token was never used."),
    ("prose-password", "The member reset their password yesterday; no secret was shared."),
    ("idempotency-key", "looked up 3f0c7c8e-2a44-4d4f-9d52-8f6c7b1a2e90:points.ledger:notify at the provider"),
    ("timestamps", "2026-03-01T08:02:11Z to 2026-03-01T08:05:40Z, 3 retries, HTTP 504"),
)
