"""The operations API's executions endpoints over real HTTP, real JWTs and a real PostgreSQL (issue 12)."""

from __future__ import annotations

import uuid

import pytest
from support.api_support import assert_problem
from support.factories import add_dead_letters, add_execution

from maintenance.api.auth import EXECUTIONS_READ, READ
from maintenance.operations.executions import EXECUTION_STATUSES

BASE = "/v1/core/executions"
CHECKPOINTS = (
    ("lookup", "READ_ONLY", "SUCCEEDED", {"member": "m-1", "tier": "gold"}),
    ("credit", "IDEMPOTENT_WRITE", "SUCCEEDED", {"receipt": "r-9"}),
    ("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),
)


def ids_of(response) -> list[int]:
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


# --- list ---------------------------------------------------------------------------------------
def test_lists_reconciliation_required_by_default_oldest_in_it_first_without_payloads(api, conn):
    """The default list is RECONCILIATION_REQUIRED only, the longest waiting first, payloads left to the detail."""
    newer = add_execution(conn, age="1 minute")
    older = add_execution(conn, age="2 hours")
    add_execution(conn, status="FAILED", reason="lookup: PermanentError: member unknown")
    add_execution(conn, status="RETRY_WAIT")
    body = api.get(BASE).json()
    assert [item["id"] for item in body["items"]] == [older, newer]
    assert body["next_cursor"] is None and body["limit"] == 50
    first = body["items"][0]
    assert "payload" not in first and first["status"] == "RECONCILIATION_REQUIRED"
    assert first["reason_action"] == "notify" and first["business_scope"] == "loyalty"


def test_keyset_pages_visit_every_row_once_while_executions_enter_the_state(api, conn):
    """Following next_cursor visits each row once, oldest first; one entering the state meanwhile comes last, once."""
    ids = [add_execution(conn, age=f"{60 - minute} minutes") for minute in range(11)]  # ids[0] waited longest
    seen, cursor, arrived = [], None, []
    while True:
        body = api.get(BASE, params={"limit": 4} | ({"cursor": cursor} if cursor else {})).json()
        seen += [item["id"] for item in body["items"]]
        if not arrived:
            arrived.append(add_execution(conn))  # enters RECONCILIATION_REQUIRED now: after every row listed
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == ids + arrived


def test_executions_that_entered_the_state_together_page_by_id(api, conn):
    """Ties on status_changed_at (one transaction) are broken by id: a page boundary inside a tie loses nothing."""
    with conn.transaction():  # one now(): the same status_changed_at for all five
        ids = [add_execution(conn) for _ in range(5)]
    first = api.get(BASE, params={"limit": 2}).json()
    rest = api.get(BASE, params={"limit": 10, "cursor": first["next_cursor"]}).json()
    assert [i["id"] for i in first["items"] + rest["items"]] == sorted(ids)


@pytest.mark.parametrize("status", EXECUTION_STATUSES)
def test_the_status_filter_lists_exactly_the_executions_in_that_state(api, conn, status):
    """status=S lists the executions in S and no other, for each of the five stored states."""
    by_status = {s: add_execution(conn, status=s, reason=f"{s.lower()} (test)") for s in EXECUTION_STATUSES}
    assert ids_of(api.get(BASE, params={"status": status})) == [by_status[status]]


@pytest.mark.parametrize("name", ["consumer", "job_id", "business_scope"])
def test_each_filter_narrows_the_list_to_its_matches(api, conn, name):
    """consumer, job_id and business_scope each return exactly the executions with that value."""
    job_id = uuid.uuid4()
    target = add_execution(conn, consumer="billing.charge", queue="billing", business_scope="billing", job_id=job_id)
    twin = add_execution(conn, consumer="billing.receipt", queue="billing", business_scope="billing")
    add_execution(conn)  # points.ledger, scope loyalty
    value = {"consumer": "billing.charge", "job_id": str(job_id), "business_scope": "billing"}[name]
    expected = [target, twin] if name == "business_scope" else [target]
    assert ids_of(api.get(BASE, params={name: value})) == expected


@pytest.mark.parametrize(
    "params",
    [
        {"status": "SUCCEEDED"},
        {"status": "reconciliation_required"},
        {"status": ""},
        {"limit": 0},
        {"limit": 501},
        {"job_id": "not-a-uuid"},
        {"consumer": ""},
        {"cursor": "not-a-cursor"},
        {"tenant_id": str(uuid.uuid4())},
    ],
    ids=["succeeded", "lowercase", "empty-status", "limit-0", "limit-501", "bad-job-id", "blank", "cursor", "unknown"],
)
def test_a_bad_list_request_is_400_like_every_bad_query_parameter(api, conn, params):
    """An unknown status (SUCCEEDED is never stored), a bad limit, uuid or cursor, an unknown parameter: 400 naming it."""
    body = assert_problem(api.get(BASE, params=params), 400, "malformed-request")
    assert next(iter(params)) in body["detail"]


def test_a_cursor_of_other_filters_is_refused(api, conn):
    """A cursor is bound to the filters of the list that returned it."""
    for _ in range(3):
        add_execution(conn)
    cursor = api.get(BASE, params={"limit": 1}).json()["next_cursor"]
    body = assert_problem(
        api.get(BASE, params={"limit": 1, "cursor": cursor, "consumer": "other"}), 400, "malformed-request"
    )
    assert "other filters" in body["detail"]


# --- detail -------------------------------------------------------------------------------------
def test_detail_has_the_payload_the_checkpoints_in_action_order_and_the_history(api, conn):
    """GET /{id}: payload, each checkpoint (effect, status, attempts, result, error, key) in order, events oldest first."""
    job_id = uuid.uuid4()
    execution = add_execution(
        conn,
        job_id=job_id,
        payload={"member_id": "m-1", "points": 10},
        checkpoints=CHECKPOINTS,
        events=(("RETRY_SCHEDULED", "lookup"), ("TAKEN_OVER", None), ("RECONCILIATION_REQUIRED", "notify")),
    )
    body = api.get(f"{BASE}/{execution}").json()
    assert body["payload"] == {"member_id": "m-1", "points": 10} and body["status"] == "RECONCILIATION_REQUIRED"
    assert [(c["position"], c["action"], c["effect"], c["status"], c["result"]) for c in body["checkpoints"]] == [
        (0, "lookup", "READ_ONLY", "SUCCEEDED", {"member": "m-1", "tier": "gold"}),
        (1, "credit", "IDEMPOTENT_WRITE", "SUCCEEDED", {"receipt": "r-9"}),
        (2, "notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),
    ]
    notify = body["checkpoints"][2]
    assert notify["attempts"] == 1 and notify["last_error"] == "TransientError: ledger timeout"
    assert notify["idempotency_key"] == f"{job_id}:points.ledger:notify"
    assert notify["started_at"] and notify["finished_at"]
    assert [(e["kind"], e["action"]) for e in body["events"]] == [
        ("RETRY_SCHEDULED", "lookup"),
        ("TAKEN_OVER", None),
        ("RECONCILIATION_REQUIRED", "notify"),
    ]
    assert body["events"][0]["run_at"] is not None and body["events"][1]["run_at"] is None


def test_an_unknown_execution_is_404(api, conn):
    """The detail of an id that does not exist (or whose job succeeded and was deleted) is 404 execution-not-found."""
    body = assert_problem(api.get(f"{BASE}/4242"), 404, "execution-not-found")
    assert body["missing_ids"] == [4242]


# --- auth ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [BASE, f"{BASE}/1"])
def test_without_a_token_the_executions_are_401(api, conn, path):
    """No bearer token: 401 with the Bearer challenge, on the list and the detail."""
    add_execution(conn)
    response = api.get(path, headers={"Authorization": ""})
    assert_problem(response, 401, "unauthenticated")
    assert response.headers["WWW-Authenticate"].startswith('Bearer realm="core-jobs"')


@pytest.mark.parametrize("path", [BASE, f"{BASE}/1"])
def test_a_token_without_core_executions_read_is_403_naming_it(api, conn, path):
    """A dead-letters reader's token is not enough: 403 missing-permission naming core.executions.read."""
    add_execution(conn)
    body = assert_problem(api.get(path, headers=api.as_operator(permissions=(READ,))), 403, "missing-permission")
    assert body["missing_permission"] == EXECUTIONS_READ


def test_core_executions_read_alone_reads_executions_and_no_dead_letters(api, conn):
    """The permission is its own: it lists and shows executions, and is refused the dead-letter list."""
    execution = add_execution(conn)
    only = api.as_operator(permissions=(EXECUTIONS_READ,))
    assert ids_of(api.get(BASE, headers=only)) == [execution]
    assert api.get(f"{BASE}/{execution}", headers=only).status_code == 200
    assert_problem(api.get("/v1/core/dead-letters", headers=only), 403, "missing-permission")


# --- business scopes: a reader sees only its own ------------------------------------------------
def reader(api, *scopes: str) -> dict:
    """Headers of a core.executions.read token whose business_scopes claim is ``scopes``."""
    return api.as_operator("ops:reader", permissions=(EXECUTIONS_READ,), business_scopes=list(scopes))


def test_a_reader_lists_only_the_executions_of_its_business_scopes(api, conn):
    """A token lists the executions of the scopes its business_scopes claim carries, never another's nor an unscoped one."""
    loyalty = add_execution(conn, business_scope="loyalty", age="2 minutes")
    billing = add_execution(conn, consumer="billing.charge", queue="billing", business_scope="billing", age="1 minute")
    add_execution(conn, consumer="legacy.sync", queue="legacy", business_scope=None)
    assert ids_of(api.get(BASE, headers=reader(api, "loyalty"))) == [loyalty]
    assert ids_of(api.get(BASE, headers=reader(api, "billing"))) == [billing]
    assert ids_of(api.get(BASE, headers=reader(api, "loyalty", "billing"))) == [loyalty, billing]
    assert ids_of(api.get(BASE, headers=reader(api))) == []
    assert ids_of(api.get(BASE, params={"business_scope": "billing"}, headers=reader(api, "loyalty"))) == []


def test_an_execution_of_another_business_scope_is_as_unknown_as_a_missing_one(api, conn):
    """The detail of another scope's execution is the 404 of a missing id, its payload never sent; its own scope's is 200."""
    billing = add_execution(
        conn, consumer="billing.charge", queue="billing", business_scope="billing", payload={"card": "4242-secret"}
    )
    unscoped = add_execution(conn, consumer="legacy.sync", queue="legacy", business_scope=None)
    for hidden in (billing, unscoped):
        response = api.get(f"{BASE}/{hidden}", headers=reader(api, "loyalty"))
        body = assert_problem(response, 404, "execution-not-found")
        missing = assert_problem(api.get(f"{BASE}/4242", headers=reader(api, "loyalty")), 404, "execution-not-found")
        assert body["detail"] == missing["detail"].replace("4242", str(hidden)) and "4242-secret" not in response.text
    assert api.get(f"{BASE}/{billing}", headers=reader(api, "billing")).json()["payload"] == {"card": "4242-secret"}


def test_dead_letters_are_queue_wide_so_a_scoped_executions_letter_is_read_with_dead_letter_permission(api, conn):
    """Business scopes bound executions only: a core.dead_letters.read token reads the dead letter of a scoped execution's job, as docs/api.md says."""
    billing = add_execution(
        conn, consumer="billing.charge", queue="billing", business_scope="billing", payload={"card": "4242-secret"}
    )
    job_id = conn.execute("SELECT job_id FROM core.executions WHERE id = %s", (billing,)).fetchone()[0]
    [letter] = add_dead_letters(conn, "billing", 1, job_id=job_id, payload={"card": "4242-secret"})
    dead_letter_reader = api.as_operator("ops:queues", permissions=("core.dead_letters.read",), business_scopes=[])
    assert api.get(f"/v1/core/dead-letters/{letter}", headers=dead_letter_reader).json()["payload"] == {
        "card": "4242-secret"
    }
    assert_problem(api.get(f"{BASE}/{billing}", headers=dead_letter_reader), 403, "missing-permission")
