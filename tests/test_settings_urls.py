"""URL handling of the settings: masking passwords, redaction, the origin-only display (pure: no database)."""

from __future__ import annotations

from maintenance.settings import redact_url, shown_url


def test_redact_url_masks_only_the_password():
    """redact_url keeps user, host and database and hides the password, in the user part or the query."""
    assert redact_url("postgresql://u:p%40ss@h/db?sslmode=require") == "postgresql://u:***@h/db?sslmode=require"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("postgresql://u@h/db?sslmode=require&password=q-pw&x=1") == (
        "postgresql://u@h/db?sslmode=require&password=***&x=1"
    )


def test_shown_url_keeps_only_the_origin():
    """A URL whose path is a token is shown as scheme://host:port/… only."""
    assert shown_url("https://uptime.betterstack.com:443/api/v1/heartbeat/tok-123?x=1") == (
        "https://uptime.betterstack.com:443/…"
    )
