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
    # Issue 17's second review: a key that names a secret, whatever its prefix, case or quoting.
    ("pgpassword-env", "ran it with PGPASSWORD=hunter2pw set", "hunter2pw"),
    ("db-password-env", "DB_PASSWORD=hunter2pw", "hunter2pw"),
    ("java-properties", "spring.datasource.password=hunter2pw", "hunter2pw"),
    ("api-token-pair", "api_token=abc123def456", "abc123def456"),
    ("x-auth-token-header", "X-Auth-Token: abc123def456", "abc123def456"),
    ("private-token-header", "PRIVATE-TOKEN: glpat-" + "xYz12AbC34dEf56gHi78", "xYz12AbC34dEf56gHi78"),
    ("camel-case-token", 'apiToken: "9f8e7d6c5b4a"', "9f8e7d6c5b4a"),
    ("yaml-secret", "db:\n  user: app\n  db_pwd: Winter2024", "Winter2024"),
    ("php-array", "'password' => 'hunter2pw'", "hunter2pw"),
    ("xml-element", "<password>hunter2pw</password>", "hunter2pw"),
    ("cookie-header", "Cookie: sessionid=a8f5f167f44f4964e6c998dee827110c", "a8f5f167f44f4964e6c998dee827110c"),
    ("session-pair", "session_id=k3j4h5g6f7d8s9a0", "k3j4h5g6f7d8s9a0"),
    ("credential-pair", "aws_credentials: Xy7-Zq9-Wv3", "Xy7-Zq9-Wv3"),
    # Escaped or encoded: JSON inside JSON, a URL inside a URL.
    ("json-escaped-password", '{\\"password\\": \\"hunter2pw\\"}', "hunter2pw"),
    ("json-escaped-url", "postgresql:\\/\\/app:Hunter2pw@db\\/core", "Hunter2pw"),
    ("urlencoded-url", "next=postgresql%3A%2F%2Fapp%3AHunter2pw%40db%2Fcore", "Hunter2pw"),
    ("double-urlencoded-url", "next=postgresql%253A%252F%252Fapp%253AHunter2pw%2540db", "Hunter2pw"),
    ("json-unicode-escaped-key", '{"pass\\u0077ord": "hunter2pw"}', "hunter2pw"),
    # Command lines.
    ("curl-user", "curl -u alice:s3cr3t-pw https://api.provider.example/v1", "s3cr3t-pw"),
    ("curl-long-user", "curl --user alice:s3cr3t-pw https://api.provider.example/v1", "s3cr3t-pw"),
    ("mysql-attached-password", "mysql -h db -u app -phunter2pw core", "hunter2pw"),
    ("password-flag-space", "pg_restore --password hunter2pw dump.sql", "hunter2pw"),
    ("password-flag-equals", "tool --db-password=hunter2pw", "hunter2pw"),
    ("sshpass", "sshpass -p hunter2pw ssh ops@bastion", "hunter2pw"),
    # Provider keys, and one split over two lines.
    ("gitlab-token", "glpat-" + "xYz12AbC34dEf56gHi78", "xYz12AbC34dEf56gHi78"),
    ("npm-token", "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("openai-key", "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0k1L2", "a1B2c3D4e5F6g7H8i9J0k1L2"),
    ("huggingface-token", "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH", "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH"),
    ("sendgrid-key", "SG." + "aBcDeFgHiJkLmNoPqRs.TuVwXyZaBcDeFgHiJkLmNo", "TuVwXyZaBcDeFgHiJkLmNo"),
    ("stripe-split-by-newline", "sk_live_\n" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    # A Basic credential in base64url (the tail after a _ too), a JWT with an empty payload.
    ("basic-base64url", "Basic " + "YWxpY2U6cGE_PnN-fncwcmQ=", "PnN-fncwcmQ="),
    ("jwt-empty-payload", "eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg", "c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"),
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
    # Keys that merely contain a secret's word, flags that are not passwords, values that are not secrets.
    ("fencing-token", "fencing_token=5, attempt 2"),
    ("author", "author: Ana, reviewed OPS-4711"),
    ("tokens-used", "tokens_used: 500, session: closed"),
    ("auth-mode", "auth: required; cookie: none"),
    ("ssh-port", "ssh -p 2222 ops@bastion; mkdir -p /tmp/case; psql -p 5432 -U app"),
    ("sort-unique", "sort -u refunds.csv"),
    ("percent", "retried 100% of the 3 messages at 20%3 load"),
    ("escaped-json", '{\\"case\\": \\"OPS-4711\\", \\"url\\": \\"https:\\/\\/status.provider.example\\/x\\"}'),
    ("timestamps", "2026-03-01T08:02:11Z to 2026-03-01T08:05:40Z, 3 retries, HTTP 504"),
)
