"""The Better Stack client against a real local HTTP server (issue 4, point 5)."""

from __future__ import annotations

import pytest
from support.fake_betterstack import TOKEN, FakeClock, Fault, make_client

from alerts.betterstack import BetterStackClient, BetterStackError, IncidentNotFound
from maintenance.runtime.logs import get_logger

KEY = "core_jobs_alert_key"


def incident(name: str = "3 new dead letters in points.credit") -> dict:
    return {"name": name, "summary": "3 dead letters waiting for review", "description": "details"}


def test_create_returns_the_confirmed_id_and_sends_the_key_in_metadata(fake_bs):
    """A 201 with data.id gives that id; the incident carries the metadata key and the bearer token."""
    client = make_client(fake_bs, team_name="Platform")
    created = client.create_incident(incident(), key_name=KEY, key_value="k-1")
    assert created.id == "1001" and not created.recovered
    stored = fake_bs.incidents["1001"]
    assert stored["body"]["metadata"][KEY] == [{"type": "String", "value": "k-1"}]
    assert stored["body"]["team_name"] == "Platform"
    assert fake_bs.requests[0].authorization == f"Bearer {TOKEN}"


def test_500_then_success_posts_once_after_a_lookup(fake_bs):
    """After a 500 the client waits the backoff, finds nothing by metadata, posts again: one incident."""
    clock = FakeClock()
    fake_bs.fail_next("create", Fault(status=500))
    created = make_client(fake_bs, clock).create_incident(incident(), key_name=KEY, key_value="k-500")
    assert len(fake_bs.incidents) == 1 and created.id in fake_bs.incidents
    assert [r.method for r in fake_bs.requests] == ["POST", "GET", "POST"]
    assert clock.sleeps[0] == pytest.approx(1.0)  # base delay 1 s at the middle of the jitter


def test_a_500_after_the_incident_was_created_is_not_posted_twice(fake_bs):
    """When Better Stack created the incident but the answer was a 500, the lookup finds it (recovered): no duplicate."""
    fake_bs.fail_next("create", Fault(status=500, after_create=True))
    created = make_client(fake_bs).create_incident(incident(), key_name=KEY, key_value="k-lost")
    assert list(fake_bs.incidents) == [created.id] and created.recovered
    assert len(fake_bs.posts()) == 1


def test_429_honours_retry_after(fake_bs):
    """A 429 with Retry-After: 7 waits 7 s (longer than the 1 s backoff), then succeeds without a lookup."""
    clock = FakeClock()
    fake_bs.fail_next("create", Fault(status=429, headers={"Retry-After": "7"}))
    make_client(fake_bs, clock).create_incident(incident(), key_name=KEY, key_value="k-429")
    assert 7.0 in clock.sleeps
    assert [r.method for r in fake_bs.requests] == ["POST", "POST"]  # a 429 was never processed
    assert len(fake_bs.incidents) == 1


def test_a_timeout_is_retried_and_ends_with_one_incident(fake_bs):
    """A request that times out is retried after a lookup, and exactly one incident exists."""
    fake_bs.fail_next("create", Fault(hold=True, status=504))
    client = make_client(fake_bs, timeout=0.2)
    created = client.create_incident(incident(), key_name=KEY, key_value="k-timeout")
    fake_bs.release.set()
    assert created.id in fake_bs.incidents
    assert [r.method for r in fake_bs.requests][:3] == ["POST", "GET", "POST"]


def test_gives_up_after_the_bounded_retries(fake_bs):
    """Four 503s in a row (3 retries) raise an error saying how many attempts were made."""
    clock = FakeClock()
    fake_bs.fail_next("list", *[Fault(status=503)] * 4)
    with pytest.raises(BetterStackError, match="gave up after 4 attempts; last: HTTP 503"):
        make_client(fake_bs, clock).find_incident(KEY, "k")
    assert clock.sleeps == pytest.approx([1.0, 2.0, 4.0])


def test_other_4xx_fails_fast_with_the_body(fake_bs):
    """A 422 is not retried: the error names the status and carries Better Stack's message."""
    clock = FakeClock()
    with pytest.raises(BetterStackError, match=r"HTTP 422: .*Summary can't be blank") as raised:
        make_client(fake_bs, clock).create_incident({"description": "no name"}, key_name=KEY, key_value="k")
    assert raised.value.status == 422
    assert len(fake_bs.requests) == 1 and clock.sleeps == []


def test_client_side_rate_limit_spaces_requests(fake_bs):
    """At 8 requests/s, four back-to-back requests start 0.125 s apart."""
    clock = FakeClock()
    client = make_client(fake_bs, clock, max_requests_per_second=8)
    for n in range(4):
        client.find_incident(KEY, f"k-{n}")
    assert clock.sleeps == pytest.approx([0.125, 0.125, 0.125])


def test_find_checks_metadata_across_pages(fake_bs):
    """Against a server that ignores the filter, the lookup pages via pagination.next and verifies the key."""
    client = make_client(fake_bs, max_requests_per_second=100)
    for n in range(120):
        client.create_incident(incident(), key_name=KEY, key_value=f"k-{n}")
    fake_bs.ignore_metadata_filter = True
    fake_bs.requests.clear()
    found = client.find_incident(KEY, "k-110")
    assert found is not None and found.metadata_values(KEY) == ["k-110"]
    assert [r.args.get("page", ["1"])[0] for r in fake_bs.requests] == ["1", "2", "3"]
    assert client.find_incident(KEY, "absent") is None


def test_find_refuses_an_incident_with_the_key_but_another_scope(fake_bs):
    """An incident carrying our key but another installation's id is not ours, even from a server ignoring the filter."""
    client = make_client(fake_bs)
    client.create_incident(incident(), key_name=KEY, key_value="k-1", scope={"core_jobs_installation": "staging"})
    fake_bs.ignore_metadata_filter = True
    assert client.find_incident(KEY, "k-1", scope={"core_jobs_installation": "prod"}) is None
    found = client.find_incident(KEY, "k-1", scope={"core_jobs_installation": "staging"})
    assert found is not None and found.metadata_values("core_jobs_installation") == ["staging"]


def test_find_uses_the_metadata_filter(fake_bs):
    """The lookup sends metadata[key][][value]=… and gets the one match in a single request."""
    client = make_client(fake_bs, max_requests_per_second=100)
    for n in range(60):
        client.create_incident(incident(), key_name=KEY, key_value=f"k-{n}")
    fake_bs.requests.clear()
    assert client.find_incident(KEY, "k-59") is not None
    assert len(fake_bs.requests) == 1
    assert fake_bs.requests[0].args[f"metadata[{KEY}][][value]"] == ["k-59"]


def test_pagination_to_another_origin_is_refused(fake_bs):
    """A pagination.next pointing at another host is not followed, so the token never goes there."""
    client = make_client(fake_bs, max_requests_per_second=100)
    for n in range(60):
        client.create_incident(incident(), key_name=KEY, key_value=f"k-{n}")
    fake_bs.ignore_metadata_filter = True
    fake_bs.pagination_origin = "https://evil.example"
    with pytest.raises(BetterStackError, match="another origin"):
        client.find_incident(KEY, "absent")


def test_resolve_twice_reports_already_resolved(fake_bs):
    """Resolving resolves; a second resolve gets 409, which counts as done (False)."""
    client = make_client(fake_bs)
    created = client.create_incident(incident(), key_name=KEY, key_value="k")
    assert client.resolve_incident(created.id, resolved_by="oncall@example.com") is True
    assert client.resolve_incident(created.id, resolved_by="oncall@example.com") is False
    assert fake_bs.incidents[created.id]["resolved_by"] == "oncall@example.com"


def test_resolving_a_deleted_incident_raises_not_found_without_retrying(fake_bs):
    """A 404 on resolve (the incident was deleted at Better Stack) raises IncidentNotFound at once."""
    client = make_client(fake_bs)
    created = client.create_incident(incident(), key_name=KEY, key_value="k")
    del fake_bs.incidents[created.id]
    with pytest.raises(IncidentNotFound) as raised:
        client.resolve_incident(created.id, resolved_by="oncall@example.com")
    assert raised.value.status == 404
    assert [r.path for r in fake_bs.requests].count(f"/api/v3/incidents/{created.id}/resolve") == 1


def test_token_never_in_errors_repr_or_logs(fake_bs, logs):
    """The token appears in no error (even when the server echoes it), repr or log line."""
    client = BetterStackClient(fake_bs.url, TOKEN, sleep=lambda s: None, log=get_logger())
    fake_bs.fail_next("list", Fault(status=503))
    assert client.find_incident(KEY, "k") is None  # one retry, logged
    fake_bs.token = "another-token"  # the server now refuses ours and echoes it back
    with pytest.raises(BetterStackError) as raised:
        client.create_incident(incident(), key_name=KEY, key_value="k")
    assert raised.value.status == 401 and "Invalid Team API token" in str(raised.value)
    assert "alerts.betterstack.retry" in logs.text
    for text in (str(raised.value), repr(client), logs.text):
        assert TOKEN not in text


def test_create_sends_metadata_as_typed_string_values(fake_bs):
    """The key, each scope entry and each metadata value the caller gives go out as {type: String, value}."""
    client = make_client(fake_bs)
    fields = incident() | {"metadata": {"queue": ["points.credit"]}}
    client.create_incident(fields, key_name=KEY, key_value="k-2", scope={"core_jobs_installation": "prod"})
    metadata = fake_bs.posts()[0].body["metadata"]
    assert metadata == {
        "queue": [{"type": "String", "value": "points.credit"}],
        KEY: [{"type": "String", "value": "k-2"}],
        "core_jobs_installation": [{"type": "String", "value": "prod"}],
    }


def test_refuses_an_undocumented_create_parameter_before_sending(fake_bs):
    """A field the v3 create-incident documentation does not define (here push) is refused, nothing sent."""
    client = make_client(fake_bs)
    with pytest.raises(ValueError, match="push"):
        client.create_incident(incident() | {"push": True}, key_name=KEY, key_value="k-3")
    assert fake_bs.requests == []
