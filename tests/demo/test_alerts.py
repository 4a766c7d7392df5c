"""`core-jobs demo` shows the incidents the alert feed would post (issue 4, "Done when")."""

from __future__ import annotations


def test_demo_dry_run_lists_the_incidents_it_would_post(demo_output):
    """Without a token the demo's alerts job runs dry, names each incident it would post, and records nothing."""
    out = demo_output
    assert "dry run (no CORE_JOBS_BETTERSTACK_API_TOKEN): would post" in out
    assert "incident: 16 new dead letters in points.credit" in out
    assert "incident: 3 new dead letters in notifications.email" in out
    assert "escalation: 4 dead letters in points.expire unreviewed for over 3 days" in out
    assert "core.dead_letter_alerts: 0 -> 0" in out
