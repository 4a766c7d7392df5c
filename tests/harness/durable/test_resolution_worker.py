"""A resolution, then the worker: RESUME over HTTP, and the executor completes the job exactly once (issue 13, R-5).

The example durable consumer (harness/examples/ledger_points.py) against the local loyalty
ledger (demo/core_jobs_demo/ledger.py); the API in admin mode publishes that same definition.
"""

from __future__ import annotations

import uuid

import pytest
from support.api_support import AdminClient, admin_settings, running_api
from support.harness_support import fences, points, replay_state, run_worker, scalar
from support.ledger_support import checkpoints, deliver, execution

from core_jobs_demo.ledger import Fault
from harness.dead_letters import write_dead_letter
from harness.queue.port import DeadLettered, Duplicate, Held
from maintenance.operations import resolution as reconciliation


@pytest.fixture
def example_admin_api(restricted_login_url, jwks, tokens):
    """The API in admin mode publishing the example consumer itself; an operator's client of scope loyalty."""
    settings = admin_settings(
        restricted_login_url, jwks.url, admin_consumers=["harness.examples.ledger_points:consumer"]
    )
    yield from running_api(settings, tokens, AdminClient)


def test_resume_then_the_worker_completes_the_execution_exactly_once(
    conn, database_url, ledger, ledger_consumer, example_admin_api
):
    """notify applied but its answer lost → RECONCILIATION_REQUIRED; RESUME with the ledger's notification id; the worker credits once and sends nothing again."""
    ledger.fail("notify", Fault.hang(seconds=5, applied=True))  # applied, the answer times out
    job_id = uuid.uuid4()
    assert isinstance(deliver(conn, ledger_consumer, job_id), Held)
    assert checkpoints(conn, job_id)["notify"] == ("UNCERTAIN", 1)
    (sent,) = ledger.effects(endpoint="notify")  # what the operator finds at the provider
    notification_id = len(ledger.effects(endpoint="notify"))
    assert sent.body["member_id"] == "m-7"

    execution_id = execution(conn, job_id)["id"]
    body = {
        "command": "RESUME",
        "results": [{"action": "notify", "result": {"notification_id": notification_id}}],
        "evidence": {"reference": "LEDGER-CASE-7", "reason": "the ledger lists notification 1 for m-7"},
    }
    response = example_admin_api.post(
        f"/v1/core/executions/{execution_id}/resolve", json=body, headers={"Idempotency-Key": "resolve-7"}
    )
    assert response.status_code == 200, response.text

    stats = run_worker(database_url, consumer=ledger_consumer)  # takes the re-queued job from core.queue_messages
    assert (stats.processed, stats.held, stats.stale) == (1, 0, 0)
    assert execution(conn, job_id) is None and fences(conn, job_id) == 1
    assert points(conn, "m-7") == 25
    assert [ledger.calls(e) for e in ("lookup", "credits", "notify")] == [1, 1, 1]  # nothing run again
    assert len(ledger.effects(endpoint="credits")) == 1 and len(ledger.effects(endpoint="notify")) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Duplicate)  # a late redelivery: its fence
    replay = example_admin_api.post(
        f"/v1/core/executions/{execution_id}/resolve", json=body, headers={"Idempotency-Key": "resolve-7"}
    )
    assert replay.json() == response.json() and replay.headers["Idempotent-Replayed"] == "true"


def resolve_in_code(conn, consumer, job_id, command):
    """``command`` applied to the job's execution by operator ops:ana of scope loyalty, ``consumer`` published."""
    reconciliation.resolve(
        conn,
        execution_id=execution(conn, job_id)["id"],
        idempotency_key=f"resolve-{job_id}",
        operator="ops:ana",
        command=command,
        consumers={consumer.name: consumer},
        scopes=frozenset({"loyalty"}),
    )


def test_a_replay_held_for_reconciliation_is_ended_by_the_resumed_execution(
    conn, database_url, ledger, ledger_consumer
):
    """A dead letter's replay reaching RECONCILIATION_REQUIRED stays outstanding until the resumed execution completes: then it is processed."""
    ledger.fail("notify", Fault.refused())
    job_id = uuid.uuid4()
    failed = deliver(conn, ledger_consumer, job_id)
    assert isinstance(failed, DeadLettered)
    letter_id = write_dead_letter(conn, failed.letter)
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter_id,))
    ledger.fail("notify", Fault.invalid())  # the replay's notify answers garbage: it may have been applied
    assert isinstance(deliver(conn, ledger_consumer, job_id, replay_of=letter_id), Held)
    assert replay_state(conn, letter_id) == (None, False)  # outstanding: the operator's resolution decides

    resume = reconciliation.Resume(
        results=(("notify", {"notification_id": 1}),),
        evidence=reconciliation.Evidence("RESULT_VERIFIED", "LEDGER-CASE-9", "the ledger lists it"),
    )
    resolve_in_code(conn, ledger_consumer, job_id, resume)
    stats = run_worker(database_url, consumer=ledger_consumer)
    assert (stats.processed, stats.held) == (1, 0) and fences(conn, job_id) == 1
    assert replay_state(conn, letter_id) == ("processed", True)


def test_a_later_delivery_of_a_closed_execution_writes_no_dead_letter(conn, ledger, ledger_consumer):
    """After CLOSE_WITHOUT_TRANSITION another delivery of the job is acked as a duplicate: no dead letter whose replay would redo what the operator closed, nothing sent."""
    ledger.fail("credits", Fault.invalid())  # the credit answered garbage: it may have been applied
    job_id = uuid.uuid4()
    assert isinstance(deliver(conn, ledger_consumer, job_id), Held)
    evidence = reconciliation.Evidence("COMPENSATED_VERIFIED", "LEDGER-CASE-4", "the credit was reversed")
    resolve_in_code(conn, ledger_consumer, job_id, reconciliation.Close(evidence=evidence))
    calls_before = [ledger.calls(e) for e in ("lookup", "credits", "notify")]
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Duplicate)
    assert [ledger.calls(e) for e in ("lookup", "credits", "notify")] == calls_before
    assert execution(conn, job_id)["status"] == "FAILED" and fences(conn, job_id) == 0
