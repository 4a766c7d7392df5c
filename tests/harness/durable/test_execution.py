"""Durable executions against the real PostgreSQL and the real local loyalty ledger (issue 12, R-1..R-4, R-7).

Each delivery is handed straight to ``harness.handling.handle`` (the queue is the worker's
business; tests/harness/durable/test_execution_worker.py runs one). Times are PostgreSQL's: leases and retry
schedules are back-dated, never waited for.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest
from pydantic import model_validator
from support.harness_support import fences, points, row_counts, scalar
from support.ledger_support import (
    checkpoints,
    deliver,
    events,
    execution,
    expire_execution,
    make_execution_due,
)

from core_jobs_demo.ledger import Fault
from harness.consumer.actions import idempotency_key
from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.dead_letters import write_dead_letter
from harness.durable.window import max_takes
from harness.examples.ledger_points import Member
from harness.queue.port import Acked, DeadLettered, Duplicate, Held, RetryAfter, Stale


def test_a_durable_success_leaves_only_its_fence_and_the_business_row(conn, ledger, ledger_consumer):
    """J-AC8: after the three actions and the final write, every table of core and example holds only the fence and the balance."""
    before = row_counts(conn)
    job_id = uuid.uuid4()
    assert isinstance(deliver(conn, ledger_consumer, job_id), Acked)
    after = row_counts(conn)
    changed = {t: after[t] - before[t] for t in after if after[t] != before[t]}
    assert changed == {"core.processed_jobs": 1, "example.loyalty_points": 1}
    assert points(conn, "m-7") == 25
    assert [e.endpoint for e in ledger.effects()] == ["credits", "notify"]
    assert ledger.effects(key=idempotency_key(job_id, "points.ledger", "credit"))


def test_a_redelivered_success_is_a_duplicate_and_calls_nothing(conn, ledger, ledger_consumer):
    """A second delivery of a finished job finds the fence: Duplicate, no request to the ledger, no execution left."""
    job_id = uuid.uuid4()
    deliver(conn, ledger_consumer, job_id)
    calls = [ledger.calls(e) for e in ("lookup", "credits", "notify")]
    assert isinstance(deliver(conn, ledger_consumer, job_id), Duplicate)
    assert [ledger.calls(e) for e in ("lookup", "credits", "notify")] == calls
    assert execution(conn, job_id) is None


def interrupting(consumer: Consumer, action: str, *, after_call: bool = False, times: int = 1) -> Consumer:
    """``consumer`` whose ``action`` raises KeyboardInterrupt (the worker's abrupt end) its first ``times`` calls.

    ``after_call``: once the real call has returned (the request was sent and answered), else before it.
    Its checkpoints stay as the lost worker left them, its lease live.
    """
    left = [times]

    def wrap(real):
        def call(payload, ctx):
            if left[0] > 0:
                left[0] -= 1
                if after_call:
                    real(payload, ctx)
                raise KeyboardInterrupt
            return real(payload, ctx)

        return call

    return replace(
        consumer,
        actions=tuple(replace(a, call=wrap(a.call)) if a.name == action else a for a in consumer.actions),
    )


def lose_worker(conn, consumer, job_id, action, *, after_call=False) -> None:
    """Run a delivery that dies in ``action`` (before or after its call), then expire its lease."""
    with pytest.raises(KeyboardInterrupt):
        deliver(conn, interrupting(consumer, action, after_call=after_call), job_id)
    expire_execution(conn, job_id)


def retry_delay(conn, job_id) -> timedelta:
    """run_at minus the moment the RETRY_SCHEDULED record was written: the delay, on PostgreSQL's clock."""
    return scalar(
        conn,
        "SELECT e.run_at - v.at FROM core.executions AS e JOIN core.execution_events AS v ON v.execution_id = e.id"
        " WHERE e.job_id = %s AND v.kind = 'RETRY_SCHEDULED' ORDER BY v.id DESC LIMIT 1",
        (job_id,),
    )


def calls(ledger) -> list[int]:
    return [ledger.calls(e) for e in ("lookup", "credits", "notify")]


def test_a_503_with_retry_after_schedules_the_retry_then_the_next_delivery_succeeds(conn, ledger, ledger_consumer):
    """R-1/R-2: HTTP 503 with Retry-After 3 on the lookup → RETRY_WAIT at now() + 3 s (the larger delay), then success."""
    ledger.fail("lookup", Fault.unavailable(retry_after="3"))
    job_id = uuid.uuid4()
    outcome = deliver(conn, ledger_consumer, job_id, random=lambda: 1.0)  # the top of the jitter: 2.4 s < 3 s
    assert isinstance(outcome, RetryAfter)
    assert outcome.delay == timedelta(seconds=3)
    row = execution(conn, job_id)
    assert (row["status"], row["lease_expires_at"]) == ("RETRY_WAIT", None)
    assert retry_delay(conn, job_id) == timedelta(seconds=3)
    assert events(conn, job_id) == [("RETRY_SCHEDULED", "lookup")]
    assert checkpoints(conn, job_id) == {"lookup": ("FAILED", 1)}
    make_execution_due(conn, job_id)
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Acked)
    assert points(conn, "m-7") == 25 and calls(ledger) == [2, 1, 1]


def test_a_timeout_of_the_idempotent_write_retries_it_with_the_same_key_one_effect(conn, ledger, ledger_consumer):
    """A credit applied whose answer timed out → RETRY_WAIT in 1.6–2.4 s; the retry resends the key: one effect, and the lookup's checkpoint is not run again."""
    ledger.fail("credits", Fault.hang())
    job_id = uuid.uuid4()
    assert isinstance(deliver(conn, ledger_consumer, job_id), RetryAfter)
    assert execution(conn, job_id)["status"] == "RETRY_WAIT"
    assert timedelta(seconds=1.6) <= retry_delay(conn, job_id) <= timedelta(seconds=2.4)
    assert checkpoints(conn, job_id) == {"lookup": ("SUCCEEDED", 1), "credit": ("FAILED", 1)}
    make_execution_due(conn, job_id)
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Acked)
    key = idempotency_key(job_id, "points.ledger", "credit")
    assert len(ledger.effects(key=key)) == 1 and ledger.calls("credits") == 2
    assert ledger.calls("lookup") == 1  # its SUCCEEDED checkpoint was not run again
    assert points(conn, "m-7") == 25


def test_an_early_redelivery_of_a_retry_wait_execution_runs_nothing(conn, ledger, ledger_consumer):
    """A delivery before run_at is RetryAfter for the time left; no request is sent and nothing changes."""
    ledger.fail("lookup", Fault.unavailable(retry_after="60"))
    job_id = uuid.uuid4()
    deliver(conn, ledger_consumer, job_id)
    outcome = deliver(conn, ledger_consumer, job_id, attempt=2)
    assert isinstance(outcome, RetryAfter) and timedelta(seconds=59) < outcome.delay <= timedelta(seconds=60)
    assert calls(ledger) == [1, 0, 0] and execution(conn, job_id)["status"] == "RETRY_WAIT"


def test_an_invalid_read_only_answer_fails_the_execution_with_a_dead_letter(conn, ledger, ledger_consumer):
    """A lookup whose body breaks its output contract → FAILED at once (not retried) and a permanent dead letter."""
    ledger.fail("lookup", Fault.invalid())
    job_id = uuid.uuid4()
    outcome = deliver(conn, ledger_consumer, job_id)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent"
    assert "output contract" in outcome.letter.last_error and outcome.letter.replay_of is None
    row = execution(conn, job_id)
    assert (row["status"], row["reason_action"]) == ("FAILED", "lookup")
    assert events(conn, job_id) == [("FAILED", "lookup")]
    assert calls(ledger) == [1, 0, 0]


class _StrictMember(Member):
    """The lookup's output, with a validator that refuses by raising TypeError (pydantic does not wrap it)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: object) -> object:
        raise TypeError("this deploy refuses every member")


def test_an_answer_whose_validator_raises_a_type_error_fails_the_execution_like_any_broken_output(
    conn, ledger, ledger_consumer
):
    """A lookup answer whose output model raises TypeError (not a ValidationError) is OutputBroken: FAILED at once, a permanent dead letter naming the error."""
    actions = tuple(replace(a, output=_StrictMember) if a.name == "lookup" else a for a in ledger_consumer.actions)
    job_id = uuid.uuid4()
    outcome = deliver(conn, replace(ledger_consumer, actions=actions), job_id)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "permanent", outcome
    assert (
        "OutputBroken" in outcome.letter.last_error and "this deploy refuses every member" in outcome.letter.last_error
    )
    assert (execution(conn, job_id)["status"], calls(ledger)) == ("FAILED", [1, 0, 0])


def unavailable_three_times(conn, ledger, consumer, endpoint, job_id):
    """Three deliveries each answered 503 by ``endpoint``: the first two RetryAfter (made due), the third's outcome."""
    ledger.fail(endpoint, *[Fault.unavailable(retry_after=None)] * 3)
    for attempt in (1, 2):
        assert isinstance(deliver(conn, consumer, job_id, attempt=attempt), RetryAfter)
        make_execution_due(conn, job_id)
    return deliver(conn, consumer, job_id, attempt=3)


def test_read_only_attempts_exhausted_fail_the_execution(conn, ledger, ledger_consumer):
    """Three 503s of the lookup (3 attempts, R-2) → FAILED, dead letter reason exhausted."""
    job_id = uuid.uuid4()
    outcome = unavailable_three_times(conn, ledger, ledger_consumer, "lookup", job_id)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "exhausted"
    assert checkpoints(conn, job_id) == {"lookup": ("FAILED", 3)}


def test_an_idempotent_write_out_of_attempts_needs_reconciliation(conn, ledger, ledger_consumer):
    """Three 503s of the credit: not FAILED but RECONCILIATION_REQUIRED (any attempt may have applied it), Held."""
    job_id = uuid.uuid4()
    assert isinstance(unavailable_three_times(conn, ledger, ledger_consumer, "credits", job_id), Held)
    assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"
    assert checkpoints(conn, job_id)["credit"] == ("UNCERTAIN", 3)


def test_a_non_idempotent_write_that_failed_transiently_is_never_resent(conn, ledger, ledger_consumer):
    """A 503 of the legacy notify → RECONCILIATION_REQUIRED; every later delivery is Held and sends nothing."""
    ledger.fail("notify", Fault.unavailable())
    job_id = uuid.uuid4()
    held = deliver(conn, ledger_consumer, job_id)
    assert isinstance(held, Held) and "notify" in held.reason
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Held)
    assert ledger.calls("notify") == 1 and points(conn, "m-7") == 0
    assert checkpoints(conn, job_id) == {
        "lookup": ("SUCCEEDED", 1),
        "credit": ("SUCCEEDED", 1),
        "notify": ("UNCERTAIN", 1),
    }
    assert events(conn, job_id) == [("RECONCILIATION_REQUIRED", "notify")]


def test_an_invalid_answer_to_a_write_needs_reconciliation(conn, ledger, ledger_consumer):
    """A credit answered 200 with a body that breaks its contract may have been applied: RECONCILIATION_REQUIRED."""
    ledger.fail("credits", Fault.invalid())
    job_id = uuid.uuid4()
    assert isinstance(deliver(conn, ledger_consumer, job_id), Held)
    assert checkpoints(conn, job_id)["credit"] == ("UNCERTAIN", 1)


def test_a_refused_write_fails_and_a_replay_resumes_after_the_succeeded_checkpoints(conn, ledger, ledger_consumer):
    """A 409 of notify → FAILED (definitely not applied); its replay runs only notify again, then succeeds."""
    ledger.fail("notify", Fault.refused())
    job_id = uuid.uuid4()
    failed = deliver(conn, ledger_consumer, job_id)
    assert isinstance(failed, DeadLettered) and failed.reason == "permanent"
    letter_id = write_dead_letter(conn, failed.letter)
    assert isinstance(deliver(conn, ledger_consumer, job_id, replay_of=letter_id), Acked)
    assert calls(ledger) == [1, 1, 2] and len(ledger.effects(endpoint="notify")) == 1
    assert points(conn, "m-7") == 25 and execution(conn, job_id) is None


def test_another_delivery_of_a_failed_execution_is_the_same_dead_letter(conn, ledger, ledger_consumer):
    """Not a replay: a FAILED execution is dead-lettered again without running anything."""
    ledger.fail("lookup", Fault.invalid())
    job_id = uuid.uuid4()
    deliver(conn, ledger_consumer, job_id)
    again = deliver(conn, ledger_consumer, job_id, attempt=2)
    assert isinstance(again, DeadLettered) and calls(ledger) == [1, 0, 0]


def test_a_running_execution_under_a_live_lease_is_not_run_twice(conn, ledger, ledger_consumer):
    """A second delivery while the first worker's lease is live: RetryAfter until it ends, no request sent."""
    job_id = uuid.uuid4()
    with pytest.raises(KeyboardInterrupt):
        deliver(conn, interrupting(ledger_consumer, "credit"), job_id)
    outcome = deliver(conn, ledger_consumer, job_id, attempt=2)
    assert isinstance(outcome, RetryAfter) and timedelta(seconds=25) < outcome.delay <= timedelta(seconds=30)
    assert calls(ledger) == [1, 0, 0]


def test_an_expired_lease_is_taken_over_and_the_idempotent_write_resent_with_its_key(
    conn, ledger, ledger_consumer, logs
):
    """Lease expired after the credit was sent: a take-over (new token, TAKEN_OVER) resends it with the same key — one effect."""
    job_id = uuid.uuid4()
    lose_worker(conn, ledger_consumer, job_id, "credit", after_call=True)
    token = execution(conn, job_id)["fencing_token"]
    assert checkpoints(conn, job_id)["credit"] == ("STARTED", 1)
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Acked)
    [taken] = logs.named("harness.execution.taken_over")
    assert taken["job_id"] == str(job_id) and taken["takes"] == 2
    assert ledger.calls("credits") == 2 and len(ledger.effects(endpoint="credits")) == 1
    assert points(conn, "m-7") == 25 and token > 0


def test_a_lost_non_idempotent_write_needs_reconciliation_and_is_not_resent(conn, ledger, ledger_consumer):
    """Lease lost with notify STARTED: RECONCILIATION_REQUIRED on the take-over, zero resends."""
    job_id = uuid.uuid4()
    lose_worker(conn, ledger_consumer, job_id, "notify", after_call=True)
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Held)
    assert ledger.calls("notify") == 1
    assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"
    assert events(conn, job_id) == [("TAKEN_OVER", None), ("RECONCILIATION_REQUIRED", "notify")]


def test_a_job_that_kills_every_worker_ends_failed_once_its_takes_are_used(conn, ledger, ledger_consumer):
    """The crash-loop bound: a lost lookup (nothing in doubt) on a take beyond every attempt allowed → FAILED, exhausted."""
    job_id = uuid.uuid4()
    lose_worker(conn, ledger_consumer, job_id, "lookup")
    conn.execute(
        "UPDATE core.executions SET takes = %s WHERE job_id = %s", (max_takes(ledger_consumer, RetryPolicy()), job_id)
    )
    outcome = deliver(conn, ledger_consumer, job_id, attempt=2)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "exhausted"
    assert "taken" in outcome.letter.last_error and calls(ledger) == [0, 0, 0]


TAKE_OVER = """
UPDATE core.executions
   SET fencing_token = nextval('core.execution_fencing_seq'), lease_expires_at = now() + interval '30 seconds',
       leased_by = 'another worker', takes = takes + 1
 WHERE job_id = %s"""


@pytest.mark.parametrize(
    ("action", "fault", "what"),
    [
        ("lookup", None, "a checkpoint"),  # its next commit is credit's STARTED
        ("credit", Fault.unavailable(), "a schedule"),  # its next commit is the RETRY_WAIT
        ("notify", None, "a state and the fence"),  # its next commit is the final transaction
    ],
)
def test_a_stale_worker_changes_nothing(conn, database_url, ledger, ledger_consumer, action, fault, what):
    """Another worker takes the execution over while this one is in an action: its next write (checkpoint, schedule, final) is refused, outcome Stale."""
    job_id = uuid.uuid4()
    if fault is not None:
        ledger.fail("credits" if action == "credit" else action, fault)

    at_take_over = {}

    def wrap(real):
        def call_then_lose(payload, ctx):
            with psycopg.connect(database_url, autocommit=True) as other:
                other.execute(TAKE_OVER, (job_id,))
                at_take_over.update(checkpoints=checkpoints(other, job_id), execution=execution(other, job_id))
            return real(payload, ctx)  # the fault, if any, comes after the take-over

        return call_then_lose

    stale = replace(
        ledger_consumer,
        actions=tuple(replace(a, call=wrap(a.call)) if a.name == action else a for a in ledger_consumer.actions),
    )
    marks = row_counts(conn)
    outcome = deliver(conn, stale, job_id)
    assert isinstance(outcome, Stale), what
    assert execution(conn, job_id) == at_take_over["execution"]  # state, token, lease, run_at: as the other left them
    assert checkpoints(conn, job_id) == at_take_over["checkpoints"]
    assert events(conn, job_id) == []
    after = row_counts(conn)
    assert after["core.processed_jobs"] == marks["core.processed_jobs"] and points(conn, "m-7") == 0


def test_a_final_commit_that_fails_rolls_back_all_of_it_and_the_retry_runs_no_action_again(
    conn, ledger, ledger_consumer
):
    """A deferred constraint failing at COMMIT: no fence, no points; the checkpoints are kept (RETRY_WAIT on the queue policy); the retry calls nothing again."""
    conn.execute(REFUSE_AT_COMMIT)
    job_id = uuid.uuid4()
    outcome = deliver(conn, ledger_consumer, job_id)
    assert isinstance(outcome, RetryAfter) and "refused at commit" in outcome.error
    assert fences(conn, job_id) == 0 and points(conn, "m-7") == 0
    assert execution(conn, job_id)["status"] == "RETRY_WAIT"
    assert checkpoints(conn, job_id) == {
        "lookup": ("SUCCEEDED", 1),
        "credit": ("SUCCEEDED", 1),
        "notify": ("SUCCEEDED", 1),
    }
    assert events(conn, job_id) == [("RETRY_SCHEDULED", None)]
    conn.execute("DROP TRIGGER refuse_at_commit ON example.loyalty_points")
    make_execution_due(conn, job_id)
    assert isinstance(deliver(conn, ledger_consumer, job_id, attempt=2), Acked)
    assert calls(ledger) == [1, 1, 1] and points(conn, "m-7") == 25 and fences(conn, job_id) == 1


# A constraint trigger checked at COMMIT: the final transaction fails after the handler and the delete ran.
REFUSE_AT_COMMIT = """
CREATE FUNCTION example.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON example.loyalty_points
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION example.refuse_at_commit();
"""


def test_a_final_write_failing_on_every_attempt_ends_failed(conn, ledger, ledger_consumer):
    """The final write's failures are retried on the queue policy (counted from the history), then FAILED."""
    conn.execute(REFUSE_AT_COMMIT)
    job_id = uuid.uuid4()
    policy = RetryPolicy(max_attempts=2)
    assert isinstance(deliver(conn, ledger_consumer, job_id, policy=policy), RetryAfter)
    make_execution_due(conn, job_id)
    outcome = deliver(conn, ledger_consumer, job_id, attempt=2, policy=policy)
    assert isinstance(outcome, DeadLettered) and outcome.reason == "exhausted"
    assert execution(conn, job_id)["status"] == "FAILED" and calls(ledger) == [1, 1, 1]
