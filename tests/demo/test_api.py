"""The demo's operations-API step (issue 11): the API started on a free port, listed and replayed over HTTP."""

from __future__ import annotations


def test_demo_lists_and_replays_over_http_with_a_throwaway_token(demo_output):
    """The demo lists pending dead letters, replays one idempotently, shows a 403, and never prints its token."""
    section = demo_output.split("The operations API (core-jobs api, docs/api.md), over HTTP:")[1]
    assert "GET /v1/core/dead-letters?queue=points.credit&limit=5 -> 200: 5 pending, newest first" in section
    assert "-> 200: status replayed" in section and "republished with the same job_id" in section
    assert "the same request again -> 200, Idempotent-Replayed: true, the same body: True" in section
    assert "without the key -> 409 urn:core-jobs:problem:not-pending-review (current_status replayed)" in section
    assert "a read-only token replaying -> 403: missing core.dead_letters.replay" in section
    assert "audit: demo-operator@ops replayed" in section
    assert "eyJ" not in demo_output  # no JWT (their header always starts so) in the output


def test_demo_prints_curl_lines_a_person_can_copy(demo_output):
    """Every curl line uses $API and $TOKEN, for list, detail, replay (with an Idempotency-Key) and discard."""
    curls = [line.strip()[2:] for line in demo_output.splitlines() if line.strip().startswith("$ curl")]
    assert len(curls) == 4 and all("Bearer $TOKEN" in c and "$API/v1/core/dead-letters" in c for c in curls)
    assert any("Idempotency-Key" in c and c.endswith("/replay") for c in curls)
    assert any('"reason"' in c and c.endswith("/discard") for c in curls)
