"""Idempotent actions of the operations API (issue 11): the Idempotency-Key ledger in the database."""

from __future__ import annotations

import concurrent.futures
import threading

import psycopg
import pytest
from support.factories import QUEUE, add_dead_letters
from support.harness_support import scalar

BASE = "/v1/core/dead-letters"


def messages(conn):
    return scalar(conn, "SELECT count(*) FROM core.queue_messages")


def test_a_retried_key_returns_the_original_response_even_after_the_dead_letter_changed(api, conn):
    """Same key, operator and body: the first response (status and body) again, though the letter is now replayed; no second replay."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    key = {"Idempotency-Key": "replay-7f3a"}
    first = api.post(f"{BASE}/{letter}/replay", json={"reason": "INC-1"}, headers=key)
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    assert api.post(f"{BASE}/{letter}/replay", json={"reason": "INC-1"}).status_code == 409  # it did change
    again = api.post(f"{BASE}/{letter}/replay", json={"reason": "INC-1"}, headers=key)
    assert (again.status_code, again.content) == (200, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert messages(conn) == 1


def test_the_same_body_in_another_form_is_the_same_request(api, conn):
    """Whitespace, key order and a reason's surrounding blanks do not change the request's fingerprint."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    key = {"Idempotency-Key": "discard-1", "Content-Type": "application/json"}
    first = api.post(f"{BASE}/{letter}/discard", content=b'{"reason":"dup"}', headers=key)
    again = api.post(f"{BASE}/{letter}/discard", content=b'{ "reason" : "  dup " }', headers=key)
    assert first.status_code == again.status_code == 200 and again.headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize(
    "second",
    [
        {"path": "replay", "json": {"reason": "another reason"}},
        {"path": "discard", "json": {"reason": "r"}},
        {"path": "replay", "json": {"reason": "INC-1"}, "operator": "ops:luis"},
    ],
    ids=["other-body", "other-route", "other-operator"],
)
def test_a_key_reused_for_another_request_or_operator_is_409(api, conn, second):
    """The same key with another body, route or operator: 409 idempotency-key-reused, and nothing runs."""
    letter, other = add_dead_letters(conn, QUEUE, 2)
    key = {"Idempotency-Key": "k-1"}
    assert api.post(f"{BASE}/{letter}/replay", json={"reason": "INC-1"}, headers=key).status_code == 200
    headers = key | (api.as_operator(second["operator"]) if "operator" in second else {})
    response = api.post(f"{BASE}/{other}/{second['path']}", json=second["json"], headers=headers)
    assert response.status_code == 409
    assert response.json()["type"] == "urn:core-jobs:problem:idempotency-key-reused"
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (other,)) == "pending_review"


def test_a_refused_action_is_recorded_and_answered_again(api, conn):
    """A 409 not-pending-review is the action's answer: the same key gets it again, while the letter's status moved on."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter,))
    key = {"Idempotency-Key": "k-409"}
    first = api.post(f"{BASE}/{letter}/discard", json={"reason": "r"}, headers=key)
    again = api.post(f"{BASE}/{letter}/discard", json={"reason": "r"}, headers=key)
    assert first.status_code == again.status_code == 409 and again.json() == first.json()
    assert again.headers["content-type"] == "application/problem+json"


def test_a_request_refused_before_the_action_does_not_use_the_key(api, conn):
    """A 422 (blank reason) records nothing: the fixed request with the same key runs."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    key = {"Idempotency-Key": "k-fix"}
    assert api.post(f"{BASE}/{letter}/discard", json={"reason": " "}, headers=key).status_code == 422
    assert api.post(f"{BASE}/{letter}/discard", json={"reason": "fixed"}, headers=key).status_code == 200


def test_bulk_actions_are_idempotent_too(api, conn):
    """A retried bulk replay with its key replays nothing more."""
    ids = add_dead_letters(conn, QUEUE, 3)
    key = {"Idempotency-Key": "bulk-1"}
    first = api.post(f"{BASE}/replay", json={"ids": ids}, headers=key)
    again = api.post(f"{BASE}/replay", json={"ids": ids}, headers=key)
    assert first.json() == again.json() and messages(conn) == 3


def test_concurrent_requests_with_one_key_run_the_action_once(api, conn):
    """Eight identical requests with one key at once: one replay, eight identical 200 answers."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    start = threading.Barrier(8)

    def replay(_):
        start.wait()
        response = api.post(f"{BASE}/{letter}/replay", headers={"Idempotency-Key": "same"})
        return response.status_code, response.json()["status"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = set(pool.map(replay, range(8)))
    assert answers == {(200, "replayed")}
    assert messages(conn) == 1


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "ключ".encode()])
def test_a_malformed_key_is_400(api, conn, key):
    """Keys are 1-255 visible ASCII characters."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    response = api.post(f"{BASE}/{letter}/replay", headers={"Idempotency-Key": key})
    assert response.status_code == 400 and messages(conn) == 0


def test_the_ledger_keeps_the_operator_the_request_and_the_response(api, conn):
    """One row per key, with the token's sub, the route template and the response status and body."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    body = api.post(f"{BASE}/{letter}/replay", headers={"Idempotency-Key": "k-row"}).json()
    row = conn.execute(
        "SELECT operator, method, route, response_status, response_body FROM core.api_idempotency_keys"
    ).fetchall()
    assert row == [("ops:ana@example.com", "POST", "/v1/core/dead-letters/{id}/replay", 200, body)]


def test_a_recorded_response_never_changes(conn):
    """The database refuses to rewrite a recorded response."""
    conn.execute(
        "INSERT INTO core.api_idempotency_keys (idempotency_key, operator, method, route, request_fingerprint,"
        " response_status, response_body) VALUES ('k', 'ops', 'POST', '/r', 'f', 200, '{}')"
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="never changes"):
        conn.execute("UPDATE core.api_idempotency_keys SET response_status = 409")
