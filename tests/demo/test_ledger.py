"""The local loyalty ledger (demo/core_jobs_demo/ledger.py) over real HTTP: one effect per key, faults as programmed."""

from __future__ import annotations

import httpx
import pytest

from core_jobs_demo.ledger import Fault, LoyaltyLedger


@pytest.fixture
def http(ledger: LoyaltyLedger):
    with httpx.Client(base_url=ledger.url, timeout=2.0) as client:
        yield client


def test_credits_apply_one_effect_per_key_and_replay_the_first_answer(ledger, http):
    """Two POST /credits with one Idempotency-Key: one effect, the same answer, the second marked replayed."""
    body = {"member_id": "m-1", "points": 5}
    first = http.post("/credits", json=body, headers={"Idempotency-Key": "k-1"})
    second = http.post("/credits", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() and second.headers["Idempotent-Replayed"] == "true"
    assert len(ledger.effects(key="k-1")) == 1 and ledger.calls("credits") == 2
    assert http.post("/credits", json=body).status_code == 400  # no key, no effect
    assert http.get("/effects").json() == [{"endpoint": "credits", "key": "k-1", "body": body}]


def test_every_legacy_notify_is_an_effect(ledger, http):
    """POST /legacy/notify has no key: two calls, two effects."""
    for _ in range(2):
        assert http.post("/legacy/notify", json={"member_id": "m-1", "points": 5}).status_code == 200
    assert len(ledger.effects(endpoint="notify")) == 2


def test_faults_are_used_up_in_order_then_the_endpoint_answers_normally(ledger, http):
    """Two 503s with Retry-After, an invalid body, then the member; an unknown member is 404."""
    ledger.fail("lookup", Fault.unavailable(retry_after="7"), Fault.unavailable(retry_after="7"), Fault.invalid())
    answers = [http.get("/members/m-1") for _ in range(4)]
    assert [a.status_code for a in answers] == [503, 503, 200, 200]
    assert answers[0].headers["Retry-After"] == "7"
    assert "member_id" not in answers[2].json() and answers[3].json() == {"member_id": "m-1", "tier": "gold"}
    with LoyaltyLedger(unknown=frozenset({"m-x"})) as other:
        assert httpx.get(f"{other.url}/members/m-x").status_code == 404


def test_a_hang_outlasts_the_client_timeout_and_the_write_is_applied(ledger):
    """A hanging credit: the client times out, yet the effect happened (the answer is what was lost)."""
    ledger.fail("credits", Fault.hang())
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=ledger.url, timeout=0.3) as client:
        client.post("/credits", json={"member_id": "m-1", "points": 5}, headers={"Idempotency-Key": "k-h"})
    assert len(ledger.effects(key="k-h")) == 1
