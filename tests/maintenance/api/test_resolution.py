"""POST /v1/core/executions/{id}/resolve over real HTTP, real JWTs and a real PostgreSQL (issue 13, R-5, R-6)."""

from __future__ import annotations

import concurrent.futures
import uuid

import psycopg
import pytest
from support.api_support import OPERATOR, assert_problem
from support.credential_corpus import CREDENTIALS, ORDINARY
from support.factories import add_execution
from support.harness_support import row_counts, scalar
from support.resolutions import EVIDENCE, UNCERTAIN_NOTIFY, close
from support.waiting import wait_until

UNCERTAIN_CREDIT = (
    ("lookup", "READ_ONLY", "SUCCEEDED", {"member_id": "m-1"}),
    ("credit", "IDEMPOTENT_WRITE", "UNCERTAIN", None),
)
RESUME = {
    "command": "RESUME",
    "results": [{"action": "notify", "result": {"message_id": "msg-9"}}],
    "evidence": EVIDENCE,
}


def path(execution_id: int) -> str:
    return f"/v1/core/executions/{execution_id}/resolve"


def post(client, execution_id, body, key="key-1", **kwargs):
    headers = dict(kwargs.pop("headers", {}))
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(path(execution_id), json=body, headers=headers, **kwargs)


def execution(conn, execution_id):
    return conn.execute(
        "SELECT status, fencing_token, reason, payload FROM core.executions WHERE id = %s", (execution_id,)
    ).fetchone()


def checkpoints(conn, execution_id):
    return conn.execute(
        "SELECT action, status, result FROM core.execution_checkpoints WHERE execution_id = %s ORDER BY position",
        (execution_id,),
    ).fetchall()


def everything(conn, execution_id):
    """What a resolution may change: the execution, its checkpoints and events, the queue, the ledger."""
    return (
        execution(conn, execution_id),
        checkpoints(conn, execution_id),
        conn.execute("SELECT kind FROM core.execution_events WHERE execution_id = %s", (execution_id,)).fetchall(),
        row_counts(conn),
    )


# --- the route and who may call it ----------------------------------------------------------------
def test_the_route_does_not_exist_when_admin_mode_is_off(api, conn):
    """Without CORE_JOBS_ADMIN_ENABLED the resolve route answers 404 not-found, whoever asks."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert_problem(post(api, execution_id, RESUME), 404, "not-found")


def test_a_request_without_a_token_gets_401(admin_api, conn):
    """No bearer token: 401 unauthenticated, nothing looked up."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert_problem(post(admin_api, execution_id, RESUME, headers={"Authorization": ""}), 401, "unauthenticated")


def test_a_token_without_the_operator_role_gets_403(admin_api, conn):
    """A token whose roles lack EXECUTION_OPERATOR (even with every dead-letter permission) gets 403 missing-role."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    headers = admin_api.operator(roles=("DEAD_LETTER_OPERATOR",))
    assert_problem(post(admin_api, execution_id, RESUME, headers=headers), 403, "missing-role")
    assert execution(conn, execution_id)[0] == "RECONCILIATION_REQUIRED"


def test_a_token_with_no_scope_served_here_gets_403(admin_api, conn):
    """An operator whose business_scopes name none of CORE_JOBS_ADMIN_BUSINESS_SCOPES gets 403 before any lookup."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    headers = admin_api.operator(scopes=("payments",))
    assert_problem(post(admin_api, execution_id, RESUME, headers=headers), 403, "missing-business-scope")


def test_an_execution_of_another_scope_is_as_unknown_as_a_missing_one(admin_api, conn):
    """An operator of scope billing gets the same 404 for a loyalty execution as for an id that does not exist."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    headers = admin_api.operator(scopes=("billing",))
    other = assert_problem(post(admin_api, execution_id, RESUME, headers=headers), 404, "execution-not-found")
    missing = assert_problem(post(admin_api, 10**9, RESUME, headers=headers), 404, "execution-not-found")
    assert other["detail"].replace(str(execution_id), "N") == missing["detail"].replace(str(10**9), "N")
    assert execution(conn, execution_id)[0] == "RECONCILIATION_REQUIRED"


def test_an_execution_whose_scope_this_deployment_does_not_serve_is_not_found(admin_api, conn):
    """Scope payments is not in CORE_JOBS_ADMIN_BUSINESS_SCOPES: even a token naming it cannot resolve it (404)."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY, business_scope="payments")
    headers = admin_api.operator(scopes=("payments", "loyalty"))
    assert_problem(post(admin_api, execution_id, RESUME, headers=headers), 404, "execution-not-found")


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 256], ids=["missing", "empty", "space", "too-long"])
def test_the_idempotency_key_is_mandatory_and_bounded(admin_api, conn, key):
    """Without a valid Idempotency-Key (1-255 visible ASCII) the answer is 400 and nothing changes."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert_problem(post(admin_api, execution_id, RESUME, key=key), 400, "malformed-request")
    assert execution(conn, execution_id)[0] == "RECONCILIATION_REQUIRED"


# --- the command ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        {**RESUME, "target_status": "PENDING"},
        {"command": "SET_STATUS", "status": "FAILED", "evidence": EVIDENCE},
        {"command": "RESUME", "results": [], "evidence": EVIDENCE},
        {**RESUME, "evidence": {"reference": "   ", "reason": "checked"}},
        {**RESUME, "evidence": {"reference": "CASE-1", "reason": "r" * 2001}},
        {**RESUME, "evidence": {"reference": "C" * 201, "reason": "checked"}},
        close("PROBABLY_ABSENT"),
    ],
    ids=[
        "target-state-field",
        "unknown-command",
        "no-results",
        "blank-reference",
        "long-reason",
        "long-reference",
        "unknown-evidence-kind",
    ],
)
def test_a_body_that_is_not_a_reconciliation_command_gets_422(admin_api, conn, body):
    """No field chooses a state; evidence is non-blank and bounded; anything else is 422 invalid-request."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert_problem(post(admin_api, execution_id, body), 422, "invalid-request")
    assert execution(conn, execution_id)[0] == "RECONCILIATION_REQUIRED"


JWT_LIKE = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"


@pytest.mark.parametrize(
    "reference",
    [
        JWT_LIKE,
        "-----BEGIN PRIVATE KEY----- MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
        "Bearer abcdefghijklmnop",
        "case 12, password=hunter2",
        "see Qm9iIHNlbnQgYSBzZWNyZXQgdG9rZW4gaGVyZQx7Yz9K",
    ],
    ids=["jwt", "pem", "bearer", "password", "high-entropy"],
)
def test_evidence_that_looks_like_a_secret_is_refused_without_being_echoed(admin_api, conn, reference):
    """A reference holding a JWT, a key, a credential or a random token gets 422, and the answer does not repeat it."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    response = post(admin_api, execution_id, {**RESUME, "evidence": {**EVIDENCE, "reference": reference}})
    assert_problem(response, 422, "invalid-request")
    assert reference not in response.text and "hunter2" not in response.text


def test_a_case_reference_with_a_uuid_is_accepted(admin_api, conn):
    """A provider case id that is a UUID is not mistaken for a secret."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    evidence = {**EVIDENCE, "reference": f"provider case {uuid.uuid4()}"}
    assert post(admin_api, execution_id, {**RESUME, "evidence": evidence}).status_code == 200


# --- the evidence screening against the credential corpus (maintenance/runtime/credentials.py) ----------------
_ONE_LINE = [c for c in CREDENTIALS if "\n" not in c[1]]


def _nothing_recorded(conn, *texts):
    """No ledger row, and no reference or reason holding any of ``texts``."""
    rows = conn.execute("SELECT evidence_reference, evidence_reason FROM core.execution_resolutions").fetchall()
    return rows == [] or not any(t in (ref or "") + (reason or "") for ref, reason in rows for t in texts)


@pytest.mark.parametrize(("text", "secret"), [c[1:] for c in CREDENTIALS], ids=[c[0] for c in CREDENTIALS])
def test_a_reason_holding_a_credential_is_refused_and_nothing_is_written(admin_api, conn, text, secret):
    """Each credential of the corpus as the reason gets 422 problem+json that does not echo it, and nothing is written."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    before = everything(conn, execution_id)
    response = post(admin_api, execution_id, {**RESUME, "evidence": {**EVIDENCE, "reason": text}})
    assert_problem(response, 422, "invalid-request")
    assert secret not in response.text
    assert everything(conn, execution_id) == before
    assert _nothing_recorded(conn, secret)


@pytest.mark.parametrize(("text", "secret"), [c[1:] for c in _ONE_LINE], ids=[c[0] for c in _ONE_LINE])
def test_a_reference_holding_a_credential_is_refused_and_nothing_is_written(admin_api, conn, text, secret):
    """Each one-line credential of the corpus as the reference gets 422 problem+json, not echoed, nothing written."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    before = everything(conn, execution_id)
    response = post(admin_api, execution_id, {**RESUME, "evidence": {**EVIDENCE, "reference": text[:200]}})
    assert_problem(response, 422, "invalid-request")
    assert secret not in response.text
    assert everything(conn, execution_id) == before
    assert _nothing_recorded(conn, secret)


@pytest.mark.parametrize("text", [c[1] for c in ORDINARY], ids=[c[0] for c in ORDINARY])
def test_ordinary_evidence_is_accepted_and_recorded_as_given(admin_api, conn, text):
    """Ordinary evidence of the corpus, as reference and as reason, resolves the execution and is recorded as given."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    response = post(admin_api, execution_id, {**RESUME, "evidence": {"reference": text, "reason": text}})
    assert response.status_code == 200, response.text
    recorded = conn.execute(
        "SELECT evidence_reference, evidence_reason FROM core.execution_resolutions WHERE execution_id = %s",
        (execution_id,),
    ).fetchone()
    assert recorded == (text, text)


@pytest.mark.parametrize(
    "results, problem",
    [
        ([{"action": "refund", "result": {}}], "declares no such action"),
        (
            [{"action": "notify", "result": {"message_id": "a"}}, {"action": "notify", "result": {"message_id": "a"}}],
            "more than once",
        ),
        ([{"action": "lookup", "result": {"member_id": "m-1"}}], "uncertainty left"),
        ([{"action": "notify", "result": {"message_id": ""}}], "output contract"),
        (
            [
                {"action": "notify", "result": {"message_id": "m"}},
                {"action": "credit", "result": {"receipt_id": "r-2", "points": 10}},
            ],
            "SUCCEEDED already with another result",
        ),
        (
            [{"action": "notify", "result": {"message_id": "m"}}, {"action": "register_document", "result": {}}],
            "must come from verification",
        ),
    ],
    ids=[
        "invented-action",
        "duplicate-action",
        "uncertainty-left",
        "breaks-output-contract",
        "overwrites-succeeded",
        "verified-only",
    ],
)
def test_a_command_the_published_definition_refuses_gets_422_and_changes_nothing(admin_api, conn, results, problem):
    """Each RESUME the definition refuses is 422 invalid-command naming the problem; nothing is applied."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    before = everything(conn, execution_id)
    body = assert_problem(post(admin_api, execution_id, {**RESUME, "results": results}), 422, "invalid-command")
    assert any(problem in p for p in body["problems"]), body
    assert everything(conn, execution_id) == before


def test_a_result_for_an_action_the_worker_has_still_to_run_is_refused(admin_api, conn):
    """notify was never started: the worker runs it; stating its result is 422."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_CREDIT, reason_action="credit")
    results = [
        {"action": "credit", "result": {"receipt_id": "r-1", "points": 10}},
        {"action": "notify", "result": {"message_id": "m"}},
    ]
    body = assert_problem(post(admin_api, execution_id, {**RESUME, "results": results}), 422, "invalid-command")
    assert any("never started" in p for p in body["problems"])


# --- state conflicts (409) -----------------------------------------------------------------------
@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "RETRY_WAIT", "FAILED"])
def test_a_new_resolution_of_an_execution_not_awaiting_one_gets_409(admin_api, conn, status):
    """Only RECONCILIATION_REQUIRED may be resolved: any other state is 409 with the current status."""
    execution_id = add_execution(conn, status=status, reason="credit: provider said no")
    body = assert_problem(post(admin_api, execution_id, RESUME), 409, "not-reconciliation-required")
    assert body["current_status"] == status


def test_the_same_key_with_another_command_gets_409(admin_api, conn):
    """A key that resolved this execution cannot carry another command: 409 idempotency-key-reused."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert post(admin_api, execution_id, RESUME).status_code == 200
    other = {**RESUME, "results": [{"action": "notify", "result": {"message_id": "msg-10"}}]}
    assert_problem(post(admin_api, execution_id, other), 409, "idempotency-key-reused")


def test_the_same_key_from_another_operator_gets_409(admin_api, conn):
    """The same key and command from another operator is not a replay: 409 idempotency-key-reused."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    assert post(admin_api, execution_id, RESUME).status_code == 200
    headers = admin_api.operator(sub="ops:luis@example.com")
    assert_problem(post(admin_api, execution_id, RESUME, headers=headers), 409, "idempotency-key-reused")


def test_an_execution_of_a_consumer_not_published_here_gets_409(admin_api, conn):
    """A consumer missing from CORE_JOBS_ADMIN_CONSUMERS cannot be checked, so it is not resolved: 409."""
    execution_id = add_execution(conn, consumer="points.unknown", checkpoints=UNCERTAIN_NOTIFY)
    body = assert_problem(post(admin_api, execution_id, RESUME), 409, "consumer-not-published")
    assert body["consumer"] == "points.unknown"


def test_checkpoints_that_do_not_match_the_published_effects_get_409(admin_api, conn):
    """A checkpoint whose effect differs from the published action's (the definition changed) is 409."""
    checkpoints_ = (("notify", "IDEMPOTENT_WRITE", "UNCERTAIN", None),)
    execution_id = add_execution(conn, checkpoints=checkpoints_)
    assert_problem(post(admin_api, execution_id, RESUME), 409, "definition-mismatch")


def test_two_operators_with_different_keys_cannot_both_resolve(admin_api, conn, database_url):
    """Both requests wait on the execution's lock together; once it is free one applies (200), the other gets 409."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    ana, luis = admin_api.operator(), admin_api.operator(sub="ops:luis@example.com")
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM core.executions WHERE id = %s FOR UPDATE", (execution_id,))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, admin_api, execution_id, RESUME, key="ana-1", headers=ana)
            second = pool.submit(post, admin_api, execution_id, RESUME, key="luis-1", headers=luis)
            wait_until(
                lambda: scalar(
                    conn,
                    "SELECT count(*) = 2 FROM pg_stat_activity WHERE application_name = 'core-jobs-api'"
                    " AND wait_event_type = 'Lock' AND datname = current_database()",  # not another session's API
                ),
                20,
                "both resolutions waiting on the execution's lock",
            )
            holder.rollback()
            statuses = sorted([first.result().status_code, second.result().status_code])
    assert statuses == [200, 409]
    assert scalar(conn, "SELECT count(*) FROM core.execution_resolutions") == 1


# --- RESUME --------------------------------------------------------------------------------------
def test_resume_records_the_verified_result_and_requeues_the_job(admin_api, conn):
    """RESUME: notify SUCCEEDED with the result, PENDING with a new token, due now, the job published again, audited."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    _status, token_before, _reason, payload = execution(conn, execution_id)
    job = conn.execute(
        "SELECT job_id, queue, tenant_id, correlation_id FROM core.executions WHERE id = %s", (execution_id,)
    ).fetchone()
    response = post(admin_api, execution_id, RESUME)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "PENDING" and body["operator"] == OPERATOR and body["recorded_results"] == ["notify"]
    status, token, reason, payload_after = execution(conn, execution_id)
    assert (status, reason, payload_after) == ("PENDING", None, payload) and token == body[
        "fencing_token"
    ] > token_before
    assert scalar(conn, "SELECT run_at <= now() FROM core.executions WHERE id = %s", (execution_id,))
    assert checkpoints(conn, execution_id)[2] == ("notify", "SUCCEEDED", {"message_id": "msg-9"})
    assert conn.execute(
        "SELECT job_id, queue, tenant_id, correlation_id, payload FROM core.queue_messages"
    ).fetchall() == [(*job, payload)]
    ledger = conn.execute(
        "SELECT operator, command, evidence_kind, evidence_reference, fencing_token, jsonb_array_length(checkpoints_before)"
        " FROM core.execution_resolutions"
    ).fetchall()
    assert ledger == [(OPERATOR, "RESUME", "RESULT_VERIFIED", EVIDENCE["reference"], token, 3)]
    assert conn.execute(
        "SELECT kind, fencing_token FROM core.execution_events WHERE execution_id = %s", (execution_id,)
    ).fetchall() == [("EXECUTION_RESOLVED", token)]


def test_resume_starts_the_take_count_again_so_a_crash_looped_job_can_finish(admin_api, conn):
    """An execution parked after many takes (the crash-loop bound) is PENDING with takes 0 after RESUME, as after a replay."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    conn.execute("UPDATE core.executions SET takes = 40 WHERE id = %s", (execution_id,))
    assert post(admin_api, execution_id, RESUME).status_code == 200
    assert scalar(conn, "SELECT takes FROM core.executions WHERE id = %s", (execution_id,)) == 0


def test_resume_may_restate_a_succeeded_result_which_stays_as_it_was(admin_api, conn):
    """A SUCCEEDED action named with its same result is accepted and not recorded again."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    results = [*RESUME["results"], {"action": "credit", "result": {"points": 10, "receipt_id": "r-1"}}]
    response = post(admin_api, execution_id, {**RESUME, "results": results})
    assert response.status_code == 200, response.text
    assert response.json()["recorded_results"] == ["notify"]
    assert checkpoints(conn, execution_id)[1] == ("credit", "SUCCEEDED", {"receipt_id": "r-1", "points": 10})


def test_the_idempotent_replay_returns_the_original_body_even_after_the_execution_completed(admin_api, conn):
    """After RESUME the worker takes the execution and succeeds (deleting it); the same key and command replay the answer."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    first = post(admin_api, execution_id, RESUME)
    assert first.status_code == 200
    again = post(admin_api, execution_id, RESUME)  # before completion: the same answer, nothing applied twice
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    # What the worker does: take it (a new token, a lease), run it, and delete it in the fence's transaction.
    conn.execute(
        "UPDATE core.executions SET status = 'RUNNING', fencing_token = nextval('core.execution_fencing_seq'),"
        " lease_expires_at = now() + interval '30 seconds' WHERE id = %s",
        (execution_id,),
    )
    conn.execute("DELETE FROM core.executions WHERE id = %s", (execution_id,))
    replay = post(admin_api, execution_id, RESUME)
    assert replay.status_code == 200 and replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert scalar(conn, "SELECT count(*) FROM core.execution_resolutions") == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1


def test_a_stale_worker_after_a_resolution_changes_nothing(admin_api, conn):
    """A worker still holding the token from before the resolution matches no row: no state, no checkpoint changes."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    old_token = execution(conn, execution_id)[1]
    assert post(admin_api, execution_id, RESUME).status_code == 200
    before = everything(conn, execution_id)
    # A fenced write as the worker makes it: its id, its token and a live lease.
    moved = conn.execute(
        "UPDATE core.executions SET status = 'RETRY_WAIT', run_at = now() + interval '4 seconds'"
        " WHERE id = %s AND fencing_token = %s AND lease_expires_at > now()",
        (execution_id, old_token),
    ).rowcount
    checkpoint = conn.execute(
        "UPDATE core.execution_checkpoints AS c SET attempts = attempts + 1 FROM core.executions AS e"
        " WHERE c.execution_id = e.id AND e.id = %s AND e.fencing_token = %s AND c.action = 'notify'",
        (execution_id, old_token),
    ).rowcount
    assert (moved, checkpoint) == (0, 0)
    assert everything(conn, execution_id) == before


# --- CLOSE_WITHOUT_TRANSITION --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ABSENT_VERIFIED", "COMPENSATED_VERIFIED"])
def test_close_fails_the_execution_without_a_transition(admin_api, conn, kind):
    """CLOSE: FAILED naming the resolution, a new token, checkpoints removed (kept in the ledger), nothing published."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_CREDIT, reason_action="credit")
    token_before = execution(conn, execution_id)[1]
    response = post(admin_api, execution_id, close(kind))
    assert response.status_code == 200, response.text
    status, token, reason, _payload = execution(conn, execution_id)
    assert status == "FAILED" and token > token_before and kind in reason and "resolution" in reason
    assert checkpoints(conn, execution_id) == []
    snapshot = scalar(conn, "SELECT checkpoints_before FROM core.execution_resolutions")
    assert [c["action"] for c in snapshot] == ["lookup", "credit"]
    counts = row_counts(conn)
    assert counts["core.queue_messages"] == 0 and counts["core.processed_jobs"] == 0


def test_absent_verified_is_refused_after_a_succeeded_write(admin_api, conn):
    """credit SUCCEEDED durably: ABSENT_VERIFIED is 422 (compensation must be stated); COMPENSATED_VERIFIED closes it."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    body = assert_problem(post(admin_api, execution_id, close("ABSENT_VERIFIED")), 422, "invalid-command")
    assert "COMPENSATED_VERIFIED" in body["detail"]
    assert execution(conn, execution_id)[0] == "RECONCILIATION_REQUIRED"
    assert post(admin_api, execution_id, close("COMPENSATED_VERIFIED"), key="key-2").status_code == 200


# --- one transaction -----------------------------------------------------------------------------
FAULTS = {
    "ledger": ("core.execution_resolutions", "TRUE"),
    "resolved-event": ("core.execution_events", "NEW.kind = 'EXECUTION_RESOLVED'"),
}


@pytest.mark.parametrize("command", [RESUME, close("COMPENSATED_VERIFIED")], ids=["resume", "close"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failure_mid_transaction_applies_nothing(admin_api, conn, fault, command):
    """A trigger that fails the ledger insert or the EXECUTION_RESOLVED insert leaves execution, checkpoints, queue and ledger unchanged."""
    table, when = FAULTS[fault]
    conn.execute(
        "CREATE FUNCTION core.test_fault() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'fault injected by the test'; END $$"
    )
    conn.execute(
        f"CREATE TRIGGER test_fault BEFORE INSERT ON {table} FOR EACH ROW WHEN ({when})"
        " EXECUTE FUNCTION core.test_fault()"
    )
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    before = everything(conn, execution_id)
    assert_problem(post(admin_api, execution_id, command), 500, "internal-error")
    assert everything(conn, execution_id) == before
    conn.execute(f"DROP TRIGGER test_fault ON {table}")
    assert post(admin_api, execution_id, command).status_code == 200  # the same key: nothing was recorded


def test_resolutions_are_counted_by_command(admin_api, conn, db):
    """The API's counter and the metrics job's (from the ledger) count applied resolutions by command; a replay is not counted."""
    from support.jobs import env

    from harness.pg import server_now
    from maintenance.jobs.metrics.job import MetricsJob
    from maintenance.jobs.metrics.settings import MetricsFields

    resumed = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    closed = add_execution(conn, checkpoints=UNCERTAIN_CREDIT, reason_action="credit")
    post(admin_api, resumed, RESUME)
    post(admin_api, resumed, RESUME)
    post(admin_api, closed, close("ABSENT_VERIFIED"))
    metrics = admin_api.get("/metrics").text
    assert 'core_jobs_api_execution_resolutions_total{command="RESUME"} 1.0' in metrics
    assert 'core_jobs_api_execution_resolutions_total{command="CLOSE_WITHOUT_TRANSITION"} 1.0' in metrics
    result = MetricsJob(MetricsFields(), env(db)).run_once(server_now(conn))
    assert result.resolutions == {("points.ledger", "CLOSE_WITHOUT_TRANSITION"): 1, ("points.ledger", "RESUME"): 1}
    [family] = [f for f in result.metric_families() if f.name == "core_jobs_execution_resolutions"]
    assert sorted((s.labels["command"], s.value) for s in family.samples if s.name.endswith("_total")) == [
        ("CLOSE_WITHOUT_TRANSITION", 1),
        ("RESUME", 1),
    ]


# --- the alert feed ------------------------------------------------------------------------------
def test_the_alert_feed_resolves_the_incident_once_the_execution_is_resolved(admin_api, conn, db, fake_bs):
    """An uncertain execution is paged; after a RESUME over HTTP the feed's next run resolves its incident."""
    from support.alerts_support import make_feed

    from harness.pg import server_now

    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    feed = make_feed(db, fake_bs)
    assert feed.run_once(server_now(conn)).incidents_posted == 1
    [incident_id] = list(fake_bs.incidents)
    assert post(admin_api, execution_id, RESUME).status_code == 200
    result = feed.run_once(server_now(conn))
    assert result.incidents_resolved == 1 and result.ok
    assert fake_bs.incidents[incident_id]["status"] == "Resolved"
