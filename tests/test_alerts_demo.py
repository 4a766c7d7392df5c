"""`core-jobs demo` shows the incidents the alert feed would post (issue 4, "Done when")."""

from __future__ import annotations

from maintenance.cli import EXIT_OK, main


def test_demo_dry_run_lists_the_incidents_it_would_post(clean_env, pg_server_url, capsys):
    """Without a token the demo's alerts job runs dry, names each incident it would post, and records nothing."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", pg_server_url)
    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "dry run (no CORE_JOBS_BETTERSTACK_API_TOKEN): would post" in out
    assert "incident: 16 new dead letters in points.credit" in out
    assert "incident: 3 new dead letters in notifications.email" in out
    assert "escalation: 4 dead letters in points.expire unreviewed for over 3 days" in out
    assert "core.dead_letter_alerts: 0 -> 0" in out
