"""Stored jsonb Python cannot decode never breaks an operator's read, list or replay (CLI and API).

A payload, a checkpoint's result or a recorded response written by SQL (or an older version)
may nest deeper than Python's recursion limit or hold an integer over its 4 300 digits: the
reads show the row with the value as its stored text and why (``payload_undecodable``), a replay
of such a dead letter is refused naming the problem, and nothing changes.
"""

from __future__ import annotations

import json

import pytest
from support.api_support import assert_problem
from support.factories import QUEUE, add_dead_letters, add_execution
from support.harness_support import scalar

from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE

DEEP = "(repeat('[', 3000) || repeat(']', 3000))::jsonb"  # deeper than Python's recursion limit
HUGE = "repeat('9', 5000)::jsonb"  # an integer over Python's 4 300 digits
UNDECODABLE = {"deep": DEEP, "huge": HUGE}


@pytest.fixture
def cli(clean_env, database_url):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


@pytest.fixture(params=sorted(UNDECODABLE))
def stored(request):
    """The SQL of one undecodable jsonb value."""
    return UNDECODABLE[request.param]


def rewrite(conn, statement: str, params: tuple) -> None:
    """Run ``statement`` with the tables' guard triggers off: a test arranging what SQL or an older version wrote."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(statement, params)


def undecodable_letter(conn, stored: str) -> tuple[int, str]:
    """A pending dead letter whose payload is ``stored``; its id and the payload's text as PostgreSQL keeps it."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    rewrite(conn, f"UPDATE core.dead_letters SET payload = {stored} WHERE id = %s", (letter,))
    return letter, scalar(conn, "SELECT payload::text FROM core.dead_letters WHERE id = %s", (letter,))


def undecodable_execution(conn, stored: str) -> tuple[int, str]:
    """An execution whose payload and first checkpoint's result are ``stored``; its id and that text."""
    execution = add_execution(conn, checkpoints=(("lookup", "READ_ONLY", "SUCCEEDED", {"member": "m-1"}),))
    rewrite(conn, f"UPDATE core.executions SET payload = {stored} WHERE id = %s", (execution,))
    rewrite(conn, f"UPDATE core.execution_checkpoints SET result = {stored} WHERE execution_id = %s", (execution,))
    return execution, scalar(conn, "SELECT payload::text FROM core.executions WHERE id = %s", (execution,))


# --- CLI ----------------------------------------------------------------------------------------
def test_dead_letters_list_json_shows_an_undecodable_payload_as_its_stored_text(cli, conn, capsys, stored):
    """`dead-letters list --json` exits 0: the letter has payload null and payload_undecodable {text, reason}; a normal one has its payload and payload_undecodable null."""
    normal = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1"})[0]
    letter, text = undecodable_letter(conn, stored)
    assert cli(["dead-letters", "list", "--json"]) == EXIT_OK
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[letter]["payload"] is None
    assert rows[letter]["payload_undecodable"]["text"] == text
    assert "cannot read" in rows[letter]["payload_undecodable"]["reason"]
    assert rows[normal]["payload"] == {"member_id": "m-1"} and rows[normal]["payload_undecodable"] is None


def test_dead_letters_list_shows_an_undecodable_letter(cli, conn, capsys, stored):
    """`dead-letters list` (the table) exits 0 and lists the letter."""
    letter, _ = undecodable_letter(conn, stored)
    assert cli(["dead-letters", "list"]) == EXIT_OK
    assert str(letter) in capsys.readouterr().out


def test_refuses_to_replay_a_dead_letter_whose_payload_cannot_be_decoded(cli, conn, capsys, stored):
    """`dead-letters replay` of it exits 2 naming the problem; the letter stays pending and nothing is queued."""
    letter, _ = undecodable_letter(conn, stored)
    other = add_dead_letters(conn, QUEUE, 1)[0]
    assert cli(["dead-letters", "replay", str(other), str(letter), "--operator", "ana"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"dead letter {letter}: its payload cannot be decoded" in err and "cannot read" in err
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'") == 2
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_refuses_to_replay_a_queue_holding_an_undecodable_dead_letter(cli, conn, capsys, stored):
    """`dead-letters replay --queue Q --all-pending` refuses as a whole when one letter's payload cannot be decoded."""
    undecodable_letter(conn, stored)
    add_dead_letters(conn, QUEUE, 1)
    argv = ["dead-letters", "replay", "--queue", QUEUE, "--all-pending", "--operator", "ana"]
    assert cli(argv) == EXIT_USAGE
    assert "cannot be decoded" in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_executions_show_marks_an_undecodable_payload_and_result(cli, conn, capsys, stored):
    """`executions show` and `--json` exit 0; the payload and the checkpoint's result are shown as stored text and why."""
    execution, text = undecodable_execution(conn, stored)
    assert cli(["executions", "show", str(execution), "--json"]) == EXIT_OK
    detail = json.loads(capsys.readouterr().out)
    assert detail["payload"] is None and detail["payload_undecodable"]["text"] == text
    checkpoint = detail["checkpoints"][0]
    assert checkpoint["result"] is None and checkpoint["result_undecodable"]["text"] == text
    assert cli(["executions", "show", str(execution)]) == EXIT_OK
    assert "undecodable" in capsys.readouterr().out


# --- API ----------------------------------------------------------------------------------------
def test_the_api_lists_and_shows_a_dead_letter_whose_payload_cannot_be_decoded(api, conn, stored):
    """GET list and detail are 200: the detail has payload null and payload_undecodable {text, reason}."""
    letter, text = undecodable_letter(conn, stored)
    assert [i["id"] for i in api.get("/v1/core/dead-letters").json()["items"]] == [letter]
    response = api.get(f"/v1/core/dead-letters/{letter}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["payload"] is None and body["payload_undecodable"]["text"] == text
    assert "cannot read" in body["payload_undecodable"]["reason"]


def test_the_api_shows_a_normal_payload_with_no_undecodable_part(api, conn):
    """A decodable payload is the payload, and payload_undecodable is null."""
    letter = add_dead_letters(conn, QUEUE, 1, payload={"member_id": "m-1"})[0]
    body = api.get(f"/v1/core/dead-letters/{letter}").json()
    assert body["payload"] == {"member_id": "m-1"} and body["payload_undecodable"] is None


def test_the_api_refuses_to_replay_a_dead_letter_whose_payload_cannot_be_decoded(api, conn, stored):
    """POST replay is 422 undecodable-payload naming the letter; it stays pending and nothing is queued."""
    letter, _ = undecodable_letter(conn, stored)
    body = assert_problem(api.post(f"/v1/core/dead-letters/{letter}/replay"), 422, "undecodable-payload")
    assert body["undecodable_ids"] == [letter] and "cannot be decoded" in body["detail"]
    bulk = api.post("/v1/core/dead-letters/replay", json={"filter": {"queue": QUEUE}})
    assert_problem(bulk, 422, "undecodable-payload")
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter,)) == "pending_review"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_the_api_shows_an_execution_whose_payload_and_result_cannot_be_decoded(api, conn, stored):
    """GET /v1/core/executions/{id} is 200 with payload and result null and their stored text and why beside them."""
    execution, text = undecodable_execution(conn, stored)
    response = api.get(f"/v1/core/executions/{execution}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["payload"] is None and body["payload_undecodable"]["text"] == text
    checkpoint = body["checkpoints"][0]
    assert checkpoint["result"] is None and checkpoint["result_undecodable"]["text"] == text


def test_a_recorded_response_that_cannot_be_decoded_is_answered_as_stored(api, conn):
    """An Idempotency-Key whose recorded response body Python cannot decode answers that body's stored text, not a 500."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    key = {"Idempotency-Key": "k-deep"}
    assert api.post(f"/v1/core/dead-letters/{letter}/discard", json={"reason": "r"}, headers=key).status_code == 200
    rewrite(conn, f"UPDATE core.api_idempotency_keys SET response_body = {DEEP}", ())
    text = scalar(conn, "SELECT response_body::text FROM core.api_idempotency_keys")
    again = api.post(f"/v1/core/dead-letters/{letter}/discard", json={"reason": "r"}, headers=key)
    assert (again.status_code, again.text) == (200, text)
    assert again.headers["idempotent-replayed"] == "true"


def test_a_resolution_keeps_an_undecodable_payload_and_result_exactly(admin_api, conn, stored):
    """RESUME of an execution whose payload and a SUCCEEDED result cannot be decoded is 200: the job is re-queued and
    the ledger's snapshot keeps the result, both as stored (they never pass through Python)."""
    execution = add_execution(
        conn,
        checkpoints=(
            ("lookup", "READ_ONLY", "SUCCEEDED", {"member_id": "m-1"}),
            ("credit", "IDEMPOTENT_WRITE", "UNCERTAIN", None),
        ),
    )
    rewrite(conn, f"UPDATE core.executions SET payload = {stored} WHERE id = %s", (execution,))
    rewrite(
        conn,
        f"UPDATE core.execution_checkpoints SET result = {stored} WHERE execution_id = %s AND action = 'lookup'",
        (execution,),
    )
    text = scalar(conn, "SELECT payload::text FROM core.executions WHERE id = %s", (execution,))
    body = {
        "command": "RESUME",
        "results": [{"action": "credit", "result": {"receipt_id": "r-1", "points": 10}}],
        "evidence": {"reference": "CASE-1", "reason": "the ledger shows receipt r-1"},
    }
    key = {"Idempotency-Key": "resolve-undecodable"}
    response = admin_api.post(f"/v1/core/executions/{execution}/resolve", json=body, headers=key)
    assert response.status_code == 200, response.text
    assert scalar(conn, "SELECT payload::text FROM core.queue_messages") == text
    snapshot = scalar(conn, "SELECT checkpoints_before->0->>'result' FROM core.execution_resolutions")
    assert snapshot == text


def test_a_recorded_resolution_that_cannot_be_decoded_is_answered_as_stored(admin_api, conn):
    """The same resolution again, its recorded response body undecodable, answers that body's stored text, not a 500."""
    execution = add_execution(conn, checkpoints=(("credit", "IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    body = {
        "command": "CLOSE_WITHOUT_TRANSITION",
        "evidence": {"kind": "ABSENT_VERIFIED", "reference": "CASE-2", "reason": "the ledger has no receipt"},
    }
    key = {"Idempotency-Key": "close-undecodable"}
    assert admin_api.post(f"/v1/core/executions/{execution}/resolve", json=body, headers=key).status_code == 200
    rewrite(conn, f"UPDATE core.execution_resolutions SET response_body = {HUGE}", ())
    again = admin_api.post(f"/v1/core/executions/{execution}/resolve", json=body, headers=key)
    assert (again.status_code, again.text) == (200, "9" * 5000)
    assert again.headers["idempotent-replayed"] == "true"
