"""`core-jobs demo`'s durable story: a 503 retried on PostgreSQL's clock, a worker killed mid-send (issue 12)."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from core_jobs_demo.durable import DurableStory, walk_through
from maintenance.runtime.db import Database
from maintenance.settings import Settings
from tests.conftest import create_database, drop_database


@dataclass
class Told:
    story: DurableStory
    output: str
    url: str


@pytest.fixture(scope="module")
def told(pg_server_url: str, template_database: str) -> Iterator[Told]:
    """The durable story run once on a fresh migrated database, which the tests then read."""
    name = f"durable_demo_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_server_url, name, template=template_database)
    out = io.StringIO()
    try:
        story = walk_through(Settings(database_url=url), Database(url), out)
        yield Told(story, out.getvalue(), url)
    finally:
        drop_database(pg_server_url, name)


def rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def test_a_503_on_the_credit_schedules_a_retry_on_postgres_clock(told):
    """The 503 leaves the execution RETRY_WAIT with one RETRY_SCHEDULED event for the credit's first attempt,
    due after the larger of the 2 s backoff (jittered: 1.6-2.4 s) and the ledger's Retry-After of 3 s."""
    story = told.story
    assert story.retry_status == "RETRY_WAIT"
    assert [(kind, action, attempt) for kind, action, attempt, _delay in story.retry_events] == [
        ("RETRY_SCHEDULED", "credit", 1)
    ]
    assert story.retry_events[0][3] == pytest.approx(3.0, abs=0.01)
    assert 0 < story.retry_due_in_s <= 3.0
    assert "RETRY_WAIT, run_at" in told.output and "event RETRY_SCHEDULED: credit attempt 1" in told.output


def test_the_retried_job_succeeds_with_one_credit_one_lookup_and_only_its_fence_left(told):
    """After the fast-forward the retry succeeds: the credit applied once under its stable key, the lookup
    not repeated, and the job leaves its fence and no execution or message (J-AC8)."""
    story = told.story
    assert story.credits_of_retried_job == 1
    assert story.lookups_of_retried_job == 1
    assert story.retried_left == (1, 0, 0)
    assert rows(told.url, "SELECT member_id, points FROM example.loyalty_points WHERE member_id = 'm-ana'") == [
        ("m-ana", 40)
    ]


def test_a_worker_killed_mid_notify_leaves_the_execution_for_reconciliation_with_zero_resends(told):
    """The worker process dies by SIGKILL while the ledger holds its notify; the next worker parks the
    execution RECONCILIATION_REQUIRED with the notify UNCERTAIN, and the ledger saw exactly one notify."""
    story = told.story
    assert story.worker_exit == -9
    assert story.killed_status == "RECONCILIATION_REQUIRED"
    assert story.killed_checkpoints == [
        ("lookup", "READ_ONLY", "SUCCEEDED", 1),
        ("credit", "IDEMPOTENT_WRITE", "SUCCEEDED", 1),
        ("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", 1),
    ]
    assert story.killed_events == ["TAKEN_OVER", "RECONCILIATION_REQUIRED"]
    assert (story.notify_calls, story.notify_effects) == (1, 1)
    assert story.killed_left == (0, 1, 0)  # no fence, the execution kept, the message acked
    assert rows(told.url, "SELECT count(*) FROM example.loyalty_points WHERE member_id = 'm-ben'") == [(0,)]


def test_the_alert_feed_would_raise_one_incident_for_the_execution_waiting_for_an_operator(told):
    """The alert feed, run again after the reconciliation, plans one incident for points.ledger's execution."""
    first, *rest = told.story.incident_lines
    assert first.startswith("the alert feed, run again")
    assert [line for line in rest if line.strip().startswith("incident:")] == [
        "  incident: 1 execution of points.ledger needs reconciliation"
    ]
    assert all(line in told.output for line in told.story.incident_lines)
