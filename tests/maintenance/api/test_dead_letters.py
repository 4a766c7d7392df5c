"""The operations API's dead-letter endpoints over real HTTP and a real PostgreSQL (issue 11)."""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from support.api_support import api_settings, assert_problem, running_api
from support.factories import QUEUE, add_dead_letters
from support.harness_support import scalar

BASE = "/v1/core/dead-letters"


def ledger(conn):
    return conn.execute(
        "SELECT dead_letter_id, action, operator, reason FROM core.dead_letter_actions ORDER BY id"
    ).fetchall()


def status_of(conn, dead_letter_id):
    return scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (dead_letter_id,))


# --- list ---------------------------------------------------------------------------------------
def test_lists_pending_dead_letters_newest_first_without_payloads(api, conn):
    """The default list is pending_review only, newest first, and leaves the payload to the detail."""
    older, newer = add_dead_letters(conn, QUEUE, 1, created_at=None) + add_dead_letters(conn, QUEUE, 1)
    handled = add_dead_letters(conn, QUEUE, 1)[0]
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (handled,))
    body = api.get(BASE).json()
    assert [item["id"] for item in body["items"]] == [newer, older]
    assert body["next_cursor"] is None and body["limit"] == 50
    assert "payload" not in body["items"][0] and body["items"][0]["status"] == "pending_review"


def test_keyset_pages_visit_every_row_once_while_new_rows_arrive(api, conn):
    """Following next_cursor visits each row exactly once, newest first, even when rows are written between pages."""
    ids = add_dead_letters(conn, QUEUE, 23)  # one second apart: ids[0] is the newest
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 5} | ({"cursor": cursor} if cursor else {})
        body = api.get(BASE, params=params).json()
        seen += [item["id"] for item in body["items"]]
        pages += 1
        add_dead_letters(conn, QUEUE, 1)  # newer than everything: never on a later page
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == ids and pages == 5


def test_rows_with_the_same_created_at_page_by_id(api, conn):
    """Ties on created_at are broken by id, so a page boundary inside a tie loses and repeats nothing."""
    when = scalar(conn, "SELECT now()")
    ids = [add_dead_letters(conn, QUEUE, 1, created_at=when + timedelta(seconds=1))[0] for _ in range(5)]
    first = api.get(BASE, params={"limit": 2}).json()
    rest = api.get(BASE, params={"limit": 10, "cursor": first["next_cursor"]}).json()
    assert [i["id"] for i in first["items"] + rest["items"]] == sorted(ids, reverse=True)


@pytest.mark.parametrize("name", ["queue", "consumer", "tenant_id", "job_id", "correlation_id"])
def test_each_filter_narrows_the_list_to_its_matches(api, conn, name):
    """Every filter returns exactly the dead letters with that value."""
    target = add_dead_letters(
        conn, "notifications.email", 2, consumer="mailer", tenant_id=uuid.UUID("00000000-0000-4000-8000-0000000000bb")
    )
    add_dead_letters(conn, QUEUE, 3)
    row = conn.execute(
        "SELECT queue, consumer, tenant_id, job_id, correlation_id FROM core.dead_letters WHERE id = %s", (target[0],)
    ).fetchone()
    value = dict(zip(["queue", "consumer", "tenant_id", "job_id", "correlation_id"], row, strict=True))[name]
    expected = [target[0]] if name in ("job_id", "correlation_id") else target
    items = api.get(BASE, params={name: str(value)}).json()["items"]
    assert [i["id"] for i in items] == expected


def test_status_filter_lists_handled_dead_letters(api, conn):
    """status=discarded lists the discarded ones, with their reason."""
    _kept, gone = add_dead_letters(conn, QUEUE, 2)
    conn.execute("UPDATE core.dead_letters SET status = 'discarded', discard_reason = 'dup' WHERE id = %s", (gone,))
    items = api.get(BASE, params={"status": "discarded"}).json()["items"]
    assert [(i["id"], i["discard_reason"]) for i in items] == [(gone, "dup")]


def test_created_range_includes_after_and_excludes_before(api, conn):
    """created_after is inclusive, created_before exclusive."""
    ids = add_dead_letters(conn, QUEUE, 4)  # created now, now-1s, now-2s, now-3s
    stamps = dict(conn.execute("SELECT id, created_at FROM core.dead_letters").fetchall())
    params = {"created_after": stamps[ids[2]].isoformat(), "created_before": stamps[ids[0]].isoformat()}
    assert [i["id"] for i in api.get(BASE, params=params).json()["items"]] == [ids[1], ids[2]]


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 501},
        {"limit": "ten"},
        {"status": "lost"},
        {"tenant_id": "acme"},
        {"created_after": "2026-12-01T00:00:00"},
        {"cursor": "not-a-cursor"},
        {"q": "free text"},
        {"queue": "a\x00b"},
    ],
)
def test_a_malformed_list_request_is_400(api, conn, params):
    """Bad or unknown query parameters, naive timestamps and foreign cursors are 400 malformed-request."""
    assert_problem(api.get(BASE, params=params), 400, "malformed-request")


def test_a_cursor_of_other_filters_is_refused(api, conn):
    """A cursor is bound to the filters of the list that returned it."""
    add_dead_letters(conn, QUEUE, 3)
    cursor = api.get(BASE, params={"limit": 1}).json()["next_cursor"]
    body = assert_problem(
        api.get(BASE, params={"limit": 1, "cursor": cursor, "queue": "other"}), 400, "malformed-request"
    )
    assert "other filters" in body["detail"]


# --- detail -----------------------------------------------------------------------------------
def test_detail_has_the_payload_and_the_audit_history(api, conn):
    """GET /{id}: the full payload and every action on it, with the operator and reason."""
    letter = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1", "points": 1})[0]
    api.post(f"{BASE}/{letter}/discard", json={"reason": "credited by hand, OPS-9"})
    body = api.get(f"{BASE}/{letter}").json()
    assert body["payload"] == {"member_id": "m-1", "points": 1}
    assert [(a["action"], a["operator"], a["reason"]) for a in body["actions"]] == [
        ("discarded", "ops:ana@example.com", "credited by hand, OPS-9")
    ]
    assert body["status"] == "discarded" and body["status_changed_at"] is not None


def test_detail_has_the_traceback_and_the_list_leaves_it_out(api, conn):
    """GET /{id} shows the failure's stack trace beside its one-line last_error; a page does not carry it."""
    stack = "Traceback (most recent call last):\n  File \"credit.py\", line 9, in tier\nKeyError: 'tier'\n"
    letter = add_dead_letters(conn, QUEUE, 1, error="KeyError: 'tier'", traceback=stack)[0]
    body = api.get(f"{BASE}/{letter}").json()
    assert (body["last_error"], body["traceback"]) == ("KeyError: 'tier'", stack)
    assert "traceback" not in api.get(BASE).json()["items"][0]


def test_errors_groups_and_counts_pending_letters_by_error(api, conn):
    """GET /errors: the pending letters counted by their error's first line, biggest group first, as the CLI's."""
    add_dead_letters(conn, QUEUE, 2, error="KeyError: 'tier'")
    newest = add_dead_letters(conn, "notifications.email", 1, error="KeyError: 'tier'\nmore", age="1 minute")[0]
    handled = add_dead_letters(conn, QUEUE, 1, error="PermanentError: member closed")[0]
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (handled,))
    body = api.get(f"{BASE}/errors").json()
    assert [(g["error"], g["count"], g["latest_id"]) for g in body["items"]] == [("KeyError: 'tier'", 3, newest)]
    assert body["items"][0]["queues"] == sorted([QUEUE, "notifications.email"])
    replayed = api.get(f"{BASE}/errors", params={"status": "replayed"}).json()["items"]
    assert [(g["error"], g["count"]) for g in replayed] == [("PermanentError: member closed", 1)]
    assert api.get(f"{BASE}/errors", params={"group": "x"}).status_code == 400


def test_an_unknown_id_is_404(api, conn):
    """The detail of an id that does not exist is 404 dead-letter-not-found."""
    body = assert_problem(api.get(f"{BASE}/4242"), 404, "dead-letter-not-found")
    assert body["missing_ids"] == [4242]


# --- replay and discard -----------------------------------------------------------------------
def test_replay_republishes_the_same_job_and_audits_the_token_subject(api, conn):
    """J-B6: one message with the dead letter's job_id and payload; status replayed; the ledger names the token's sub."""
    letter = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1", "points": 1})[0]
    job_id = scalar(conn, "SELECT job_id FROM core.dead_letters WHERE id = %s", (letter,))
    response = api.post(f"{BASE}/{letter}/replay", json={"reason": "ledger is back, INC-88"})
    assert response.status_code == 200 and response.json()["status"] == "replayed"
    assert conn.execute("SELECT job_id, payload FROM core.queue_messages").fetchall() == [
        (job_id, {"member_id": "m-1", "points": 1})
    ]
    assert ledger(conn) == [(letter, "replayed", "ops:ana@example.com", "ledger is back, INC-88")]


class _OneConnection:
    """A pool of one connection, the test's own (``app_pool`` overridden), so that it sees what a request sends."""

    def __init__(self, conn):
        self.conn = conn

    @contextmanager
    def connection(self):
        yield self.conn


@pytest.mark.parametrize(("action", "status"), [("replay", "replayed"), ("discard", "discarded")])
def test_an_action_answers_the_row_it_changed_without_reading_it_again(api, conn, database_url, action, status):
    """The answer is the UPDATE's RETURNING, the trigger's stamp included: core.dead_letters is read once, to lock
    the row, then changed; no statement reads it back."""
    import psycopg

    from maintenance.api.dependencies import app_pool

    sent: list[str] = []

    class Recording(psycopg.Cursor):
        def execute(self, query, params=None, **kwargs):
            sent.append(query if isinstance(query, str) else query.as_string(self.connection))
            return super().execute(query, params, **kwargs)

    letter = add_dead_letters(conn, QUEUE, 1)[0]
    with psycopg.connect(database_url, autocommit=True, cursor_factory=Recording) as recorded:
        recorded.execute("SET ROLE core_jobs_api")  # as every API connection runs
        sent.clear()
        api.app.dependency_overrides[app_pool] = lambda: _OneConnection(recorded)
        try:
            response = api.post(f"{BASE}/{letter}/{action}", json={"reason": "INC-9"})
        finally:
            api.app.dependency_overrides.clear()
    body = response.json()
    changed_at = scalar(conn, "SELECT status_changed_at FROM core.dead_letters WHERE id = %s", (letter,))
    assert response.status_code == 200 and body["status"] == status
    assert datetime.fromisoformat(body["status_changed_at"]) == changed_at
    on_dead_letters = [q for q in sent if "core.dead_letters" in q]
    assert [q.split()[0] for q in on_dead_letters] == ["SELECT", "WITH"]  # the lock, then the change
    assert "FOR UPDATE" in on_dead_letters[0] and "RETURNING" in on_dead_letters[1]


def test_the_operator_cannot_be_chosen_by_the_client(api, conn):
    """A body naming an operator is refused (422); the ledger only ever records the token's sub."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    assert_problem(api.post(f"{BASE}/{letter}/replay", json={"operator": "someone-else"}), 422, "invalid-request")
    api.post(f"{BASE}/{letter}/replay", headers=api.as_operator("ops:luis"))
    assert ledger(conn) == [(letter, "replayed", "ops:luis", None)]


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_an_action_on_a_handled_dead_letter_is_409_with_its_status(api, conn, action):
    """Only pending_review can be replayed or discarded; the 409 says the current status and nothing changes."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter,))
    body = assert_problem(api.post(f"{BASE}/{letter}/{action}", json={"reason": "again"}), 409, "not-pending-review")
    assert body["current_status"] == "replayed" and body["id"] == letter
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0 and len(ledger(conn)) == 1


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_an_action_on_an_unknown_id_is_404(api, conn, action):
    """Replaying or discarding an id that does not exist is 404."""
    assert_problem(api.post(f"{BASE}/77/{action}", json={"reason": "r"}), 404, "dead-letter-not-found")


def test_discard_records_the_reason(api, conn):
    """Discard sets status and reason and writes one ledger row under the token's sub."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    body = api.post(f"{BASE}/{letter}/discard", json={"reason": "  negative points, OPS-2001 "}).json()
    assert (body["status"], body["discard_reason"]) == ("discarded", "negative points, OPS-2001")
    assert ledger(conn) == [(letter, "discarded", "ops:ana@example.com", "negative points, OPS-2001")]


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": "x" * 1001}, {"reason": None}])
def test_discard_without_a_usable_reason_is_422_and_changes_nothing(api, conn, body):
    """J-AC7: a missing, blank or over-long reason is 422 invalid-request; the letter stays pending."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    assert_problem(api.post(f"{BASE}/{letter}/discard", json=body), 422, "invalid-request")
    assert status_of(conn, letter) == "pending_review" and ledger(conn) == []


def test_malformed_json_is_400(api, conn):
    """A body that is not JSON is 400 malformed-request."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    response = api.post(
        f"{BASE}/{letter}/discard", content=b'{"reason": ', headers={"Content-Type": "application/json"}
    )
    assert_problem(response, 400, "malformed-request")
    assert status_of(conn, letter) == "pending_review"


def test_a_body_over_the_limit_is_413_and_changes_nothing(api, conn):
    """A body larger than CORE_JOBS_API_MAX_BODY_BYTES is 413 payload-too-large before it is parsed."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    response = api.post(f"{BASE}/{letter}/discard", json={"reason": "r" * (300 * 1024)})
    assert_problem(response, 413, "payload-too-large")
    assert status_of(conn, letter) == "pending_review"


def test_a_chunked_body_over_the_limit_is_413(api, conn):
    """Without a Content-Length the limit is counted as the body streams in."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    chunks = (b'{"reason": "' + b"r" * 1024 * 64 if i == 0 else b"r" * 1024 * 64 for i in range(5))
    response = api.post(f"{BASE}/{letter}/discard", content=chunks, headers={"Content-Type": "application/json"})
    assert_problem(response, 413, "payload-too-large")
    assert status_of(conn, letter) == "pending_review"


# --- bulk -------------------------------------------------------------------------------------
def test_bulk_replay_with_one_unknown_id_changes_nothing(api, conn):
    """All or nothing: one id that does not exist → 404 naming it, no dead letter replayed, no message."""
    ids = add_dead_letters(conn, QUEUE, 3)
    body = assert_problem(api.post(f"{BASE}/replay", json={"ids": [*ids, 999_999]}), 404, "dead-letter-not-found")
    assert body["missing_ids"] == [999_999]
    assert {status_of(conn, i) for i in ids} == {"pending_review"}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0 and ledger(conn) == []


def test_bulk_discard_with_one_handled_id_changes_nothing(api, conn):
    """All or nothing: one dead letter that is not pending → 409 listing it with its status, nothing discarded."""
    ids = add_dead_letters(conn, QUEUE, 3)
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (ids[1],))
    body = assert_problem(
        api.post(f"{BASE}/discard", json={"ids": ids, "reason": "cleanup"}), 409, "not-pending-review"
    )
    assert body["current_status"] == "replayed" and body["id"] == ids[1]
    assert [status_of(conn, i) for i in ids] == ["pending_review", "replayed", "pending_review"]


def test_bulk_replay_by_ids_replays_each_once(api, conn):
    """Every id given is replayed, in one transaction, one message each."""
    ids = add_dead_letters(conn, QUEUE, 4)
    body = api.post(f"{BASE}/replay", json={"ids": ids, "reason": "INC-9"}).json()
    assert body == {"action": "replayed", "count": 4, "ids": sorted(ids)}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 4


def test_bulk_by_filter_acts_on_every_pending_dead_letter_of_the_queue(api, conn):
    """filter {queue, status=pending_review} discards all pending of that queue, and only those."""
    mine = add_dead_letters(conn, "points.expire", 3)
    other = add_dead_letters(conn, QUEUE, 2)
    body = api.post(
        f"{BASE}/discard",
        json={"filter": {"queue": "points.expire", "status": "pending_review"}, "reason": "job retired"},
    ).json()
    assert (body["count"], body["ids"]) == (3, sorted(mine))
    assert {status_of(conn, i) for i in other} == {"pending_review"}


@pytest.fixture
def capped_api(database_url, jwks, tokens):
    """The API with CORE_JOBS_DEAD_LETTERS_BULK_MAX=3: a bulk action by filter touches at most 3 dead letters."""
    yield from running_api(api_settings(database_url, jwks.url, dead_letters_bulk_max=3), tokens)


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_filter_matching_more_than_the_bulk_cap_is_refused_with_the_count(capped_api, conn, action):
    """A filter matching 4 pending dead letters under a cap of 3 is 422 filter-too-broad with 4 and 3; nothing changed."""
    ids = add_dead_letters(conn, "points.expire", 4)
    body = {"filter": {"queue": "points.expire"}, "reason": "job retired"}
    problem = assert_problem(capped_api.post(f"{BASE}/{action}", json=body), 422, "filter-too-broad")
    assert (problem["matched"], problem["max"]) == (4, 3) and "4" in problem["detail"]
    assert {status_of(conn, i) for i in ids} == {"pending_review"}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert scalar(conn, "SELECT count(*) FROM core.dead_letter_actions") == 0


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_filter_matching_exactly_the_bulk_cap_acts_on_all(capped_api, conn, action):
    """A filter matching 3 pending dead letters under a cap of 3 acts on all three."""
    ids = add_dead_letters(conn, "points.expire", 3)
    body = {"filter": {"queue": "points.expire"}, "reason": "job retired"}
    response = capped_api.post(f"{BASE}/{action}", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["ids"] == sorted(ids)


@pytest.mark.parametrize(
    "body",
    [
        {"ids": list(range(1, 1002))},
        {"ids": []},
        {},
        {"ids": [1], "filter": {"queue": "q"}},
        {"filter": {"queue": "q", "status": "replayed"}},
        {"ids": [0]},
    ],
)
def test_a_bulk_request_that_is_not_ids_or_a_pending_filter_is_422(api, conn, body):
    """More than 1 000 ids, none, both ids and a filter, or a filter on another status: 422."""
    assert_problem(api.post(f"{BASE}/replay", json=body), 422, "invalid-request")


def test_concurrent_replays_of_one_dead_letter_replay_it_once(api, conn):
    """Eight replays of one dead letter at once: exactly one 200, seven 409, one message, one ledger row."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    start = threading.Barrier(8)

    def replay(_):
        start.wait()
        return api.post(f"{BASE}/{letter}/replay").status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(replay, range(8)))
    assert codes == [200] + [409] * 7
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1 and len(ledger(conn)) == 1


def test_detail_shows_a_released_replay_in_the_history(api, conn):
    """A replay released by an operator (0007) is part of the audit history the detail returns."""
    from maintenance.operations import dead_letters as operations

    letter = add_dead_letters(conn, QUEUE, 1)[0]
    api.post(f"{BASE}/{letter}/replay", json={"reason": "INC-7"})
    conn.execute("DELETE FROM core.queue_messages")  # the broker lost the message
    operations.release(conn, [letter], operator="ops:luis", reason="message lost in the broker, INC-7")
    body = api.get(f"{BASE}/{letter}").json()
    assert [(a["action"], a["operator"]) for a in body["actions"]] == [
        ("replayed", "ops:ana@example.com"),
        ("released", "ops:luis"),
    ]
    assert body["replay_outcome"] == "released"


def test_every_pending_index_in_created_at_order_breaks_ties_by_id(conn):
    """No partial index of pending dead letters orders by created_at without id after it.

    With one (0001's (queue, created_at), 0002's (created_at)) the planner read a pending page in
    created_at order and sorted by id: at 1 M rows, every row of a 10 000-row tie group (a batch
    dead-lettered in one transaction) for each page, 11.5 ms instead of 0.06 (bench/api.py).
    """
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'core' AND tablename = 'dead_letters'"
        " AND indexdef LIKE '%%WHERE (status = ''pending_review''%%' AND indexdef LIKE '%%created_at%%'"
    ).fetchall()
    assert indexes, "no pending index in created_at order at all"
    for name, definition in indexes:
        columns = definition.split("(", 1)[1].split(")", 1)[0]
        assert columns.endswith("created_at, id"), f"{name}: {definition}"
