"""The replay fence guarantee (issue 9, items 2 and 13): a replayed job keeps its fence until its delivery is handled.

End to end on the reference queue: jobs are published and processed by a worker, fences and
replays are back-dated (no test sleeps), the purge runs, then the worker handles the replayed
delivery. Also: which outcomes end a replay, the operator's release, and the upgrade of replays
made before revision 0007.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from support.factories import QUEUE, dead_letter, publish
from support.harness_support import (
    TTL,
    backdate_replay,
    expire_leases,
    fences,
    make_due,
    points,
    replay_state,
    run_worker,
    scalar,
    wait_until_waiting_on_lock,
)

from harness.consumer.consumer import Consumer
from harness.consumer.retry import RetryPolicy
from harness.examples.points import CreditPoints, OutageLedger, create_table, make_consumer
from harness.handling import handle
from harness.queue.pgqueue import PgQueue
from harness.queue.port import Acked, Duplicate
from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE
from maintenance.jobs.purge.job import SPEC
from maintenance.operations.dead_letters import replay
from maintenance.runtime import migrate
from maintenance.service.runner import job_env
from maintenance.settings import load_settings

SECOND = timedelta(seconds=1)


@pytest.fixture
def cli(clean_env, database_url):
    """`core-jobs …` with every default setting (TTL 7 days, margin 2 x the 11 min 12 s retry window)."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


@pytest.fixture
def default_purge(cli, db):
    """The purge with its default settings, run at a given time on PostgreSQL's clock."""
    settings = load_settings()
    return SPEC.build(settings, job_env(settings, db))


def already_credited(database_url, conn, member: str, amount: int):
    """A job whose work committed long ago: credited by a worker, its fence processed 8 days ago and expired a day ago."""
    job_id = publish(conn, {"member_id": member, "points": amount})
    assert run_worker(database_url).processed == 1
    conn.execute(
        "UPDATE core.processed_jobs SET processed_at = now() - interval '8 days',"
        " expires_at = now() - interval '1 day' WHERE job_id = %s",
        (job_id,),
    )
    return job_id


def replayed_in_a_backlog(database_url, conn, member: str = "m-1", amount: int = 50) -> tuple[int, object]:
    """An already credited job whose dead letter (a redelivered copy gave up) was replayed a day ago, its message still queued."""
    job_id = already_credited(database_url, conn, member, amount)
    letter_id, _ = dead_letter(conn, {"member_id": member, "points": amount}, job_id=job_id)
    replay(conn, [letter_id], operator="ana")
    backdate_replay(conn, job_id, scalar(conn, "SELECT now() - interval '1 day'"))
    return letter_id, job_id


def test_a_replay_queued_longer_than_the_retry_window_is_still_applied_once(database_url, conn, cli):
    """A replayed job still waiting in the queue a day after its replay keeps its fence through the purge: credited once."""
    _, job_id = replayed_in_a_backlog(database_url, conn)
    assert cli(["run-once", "purge"]) == EXIT_OK
    stats = run_worker(database_url)
    assert points(conn, "m-1") == 50
    assert (stats.processed, stats.duplicates) == (0, 1)
    assert fences(conn, job_id) == 1


def test_once_the_replayed_delivery_is_handled_its_fence_is_purged_after_the_window(database_url, conn, default_purge):
    """The fence of a handled replay is kept margin x window after the handling (a lost ack), then purged as any other."""
    letter_id, job_id = replayed_in_a_backlog(database_url, conn)
    assert run_worker(database_url).duplicates == 1
    handled = scalar(conn, "SELECT replay_handled_at FROM core.dead_letters WHERE id = %s", (letter_id,))
    window = default_purge.guard.required
    assert default_purge.run_once(handled + window - SECOND).num_deleted == 0
    assert fences(conn, job_id) == 1
    assert default_purge.run_once(handled + window + SECOND).num_deleted == 1
    assert fences(conn, job_id) == 0


def test_a_replay_committing_while_the_purge_runs_keeps_the_fence(database_url, conn, db, default_purge):
    """Item 13: a purge whose snapshot predates the replay's commit sees the letter pending, one after it the
    replay outstanding: the fence is held both times."""
    job_id = already_credited(database_url, conn, "m-1", 50)
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 50}, job_id=job_id)
    with psycopg.connect(database_url) as replayer:
        replayer.execute("SELECT 1")  # an open transaction: replay() joins it, and nothing commits yet
        replay(replayer, [letter_id], operator="ana")
        assert default_purge.run_once(db.server_now()).num_deleted == 0
        replayer.commit()
    assert default_purge.run_once(db.server_now() + timedelta(days=30)).num_deleted == 0
    assert fences(conn, job_id) == 1
    assert replay_state(conn, letter_id) == (None, False)


FINAL_OUTCOMES = [
    # (outcome, consumer for the replayed delivery, payload, already credited, new dead letters)
    pytest.param("processed", make_consumer(), {"member_id": "m-1", "points": 50}, False, 0, id="processed"),
    pytest.param("duplicate", make_consumer(), {"member_id": "m-1", "points": 50}, True, 0, id="duplicate"),
    pytest.param(
        "dead_lettered",
        make_consumer(OutageLedger(unknown=frozenset({"m-1"}))),
        {"member_id": "m-1", "points": 50},
        False,
        1,
        id="dead-lettered-again",
    ),
    pytest.param("dead_lettered", make_consumer(), {"member_id": "m-1", "points": -5}, False, 1, id="poison"),
]


@pytest.mark.parametrize(("outcome", "consumer", "payload", "credited", "new_letters"), FINAL_OUTCOMES)
def test_each_final_outcome_of_the_replayed_delivery_marks_the_replay_handled(
    database_url, conn, outcome, consumer, payload, credited, new_letters
):
    """Processed, duplicate, dead-lettered again or poison: the replay gets that outcome and a stamp; no message is left."""
    job_id = publish(conn, payload) if credited else None
    if credited:
        assert run_worker(database_url).processed == 1
    letter_id, _ = dead_letter(conn, payload, job_id=job_id)
    replay(conn, [letter_id], operator="ana")
    assert replay_state(conn, letter_id) == (None, False)  # outstanding
    run_worker(database_url, consumer)
    assert replay_state(conn, letter_id) == (outcome, True)
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'") == new_letters
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_a_replay_found_a_duplicate_past_its_attempt_budget_is_handled(database_url, conn):
    """A replayed delivery beyond max_attempts whose fence exists is a duplicate, and marks its replay so."""
    letter_id, _ = replayed_in_a_backlog(database_url, conn)
    conn.execute("UPDATE core.queue_messages SET attempts = 5")  # five claims whose workers were killed
    assert run_worker(database_url).duplicates == 1
    assert replay_state(conn, letter_id) == ("duplicate", True)


def test_a_retry_of_the_replayed_delivery_leaves_the_replay_outstanding(database_url, conn):
    """A transient failure is not a final outcome: the replay stays outstanding through the retries, then the success ends it."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-down", "points": 5})
    replay(conn, [letter_id], operator="ana")
    flaky = make_consumer(OutageLedger(timeouts={"m-down": 2}))
    for _ in range(2):
        assert run_worker(database_url, flaky).retried == 1
        assert replay_state(conn, letter_id) == (None, False)
        make_due(conn)
    assert run_worker(database_url, flaky).processed == 1
    assert replay_state(conn, letter_id) == ("processed", True)
    assert points(conn, "m-down") == 5


def test_the_reference_queue_keeps_replay_of_across_retries_and_lease_expiry(conn):
    """The dead letter a message replays comes back with every delivery: after a retry and after a lost lease."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    replay(conn, [letter_id], operator="ana")
    queue = PgQueue(conn)
    (first,) = queue.claim(QUEUE, 10)
    assert queue.retry(first, timedelta(0), "TransientError: x")
    (second,) = queue.claim(QUEUE, 10)
    expire_leases(conn)
    (third,) = queue.claim(QUEUE, 10)
    assert [d.envelope.replay_of for d in (first, second, third)] == [letter_id] * 3
    assert third.attempt == 3


def test_a_dead_letter_the_queue_refuses_after_a_lost_lease_leaves_the_replay_outstanding(conn):
    """The mark is written with the outcome or not at all: a dead-lettering that lost its lease changes nothing."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    replay(conn, [letter_id], operator="ana")
    queue = PgQueue(conn)
    (stale,) = queue.claim(QUEUE, 10)
    outcome = handle(
        conn, make_consumer(OutageLedger(unknown=frozenset({"m-1"}))), stale, policy=RetryPolicy(), fence_ttl=TTL
    )
    expire_leases(conn)
    assert queue.dead_letter(stale, outcome.letter) is False
    assert replay_state(conn, letter_id) == (None, False)
    assert scalar(conn, "SELECT count(*) FROM core.dead_letters") == 1


def test_two_deliveries_of_one_replay_at_once_credit_once_and_end_the_replay_once(database_url, conn):
    """A replayed delivery and its redelivery (its lease ran out) handled in parallel: the second waits on the
    fence, then is a duplicate; the replay ends processed, the points are credited once."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-par", "points": 7})
    replay(conn, [letter_id], operator="ana")
    (first,) = PgQueue(conn).claim(QUEUE, 10)
    expire_leases(conn)
    (second,) = PgQueue(conn).claim(QUEUE, 10)
    entered, release = threading.Event(), threading.Event()
    credit = make_consumer().handler

    def slow_credit(conn_, payload, ctx):
        credit(conn_, payload, ctx)
        entered.set()
        assert release.wait(30)

    slow = Consumer(name="points.credit", queue="points.credit", payload_schema=CreditPoints, handler=slow_credit)
    outcomes: dict[str, object] = {}
    with (
        psycopg.connect(database_url, autocommit=True) as conn_a,
        psycopg.connect(database_url, autocommit=True) as conn_b,
    ):

        def run(name, c, consumer, this):
            outcomes[name] = handle(c, consumer, this, policy=RetryPolicy(), fence_ttl=TTL)

        a = threading.Thread(target=run, args=("a", conn_a, slow, first))
        a.start()
        assert entered.wait(30)
        b = threading.Thread(target=run, args=("b", conn_b, make_consumer(), second))
        b.start()
        wait_until_waiting_on_lock(conn, conn_b.info.backend_pid)  # b is inside its INSERT of the fence
        release.set()
        a.join(30)
        b.join(30)
    assert outcomes == {"a": Acked(), "b": Duplicate()}
    assert points(conn, "m-par") == 7
    assert replay_state(conn, letter_id) == ("processed", True)


# --- the operator's release -----------------------------------------------------------------------
def ledger(conn):
    return conn.execute(
        "SELECT dead_letter_id, action, operator, reason FROM core.dead_letter_actions ORDER BY id"
    ).fetchall()


def test_release_ends_an_outstanding_replay_whose_message_is_gone_and_audits_it(database_url, conn, cli, capsys):
    """`dead-letters release ID --reason` marks a replay whose message was lost released, with a ledger row."""
    letter_id, job_id = replayed_in_a_backlog(database_url, conn)
    conn.execute("DELETE FROM core.queue_messages")  # the broker lost the republished message
    assert (
        cli(["dead-letters", "release", str(letter_id), "--reason", "SQS queue purged, INC-12", "--operator", "ana"])
        == EXIT_OK
    )
    assert f"released dead letter {letter_id} (job {job_id}" in capsys.readouterr().out
    assert replay_state(conn, letter_id) == ("released", True)
    assert ledger(conn)[-1] == (letter_id, "released", "ana", "SQS queue purged, INC-12")


def test_release_is_refused_while_the_replayed_message_still_waits_in_the_queue(database_url, conn, cli, capsys):
    """A replay whose message is still queued will be handled: releasing it is refused, exit 2, nothing changed."""
    letter_id, _ = replayed_in_a_backlog(database_url, conn)
    assert cli(["dead-letters", "release", str(letter_id), "--reason", "stuck?", "--operator", "ana"]) == EXIT_USAGE
    assert f"dead letter {letter_id}: its replayed message still waits in the queue" in capsys.readouterr().err
    assert replay_state(conn, letter_id) == (None, False)
    assert [row[1] for row in ledger(conn)] == ["replayed"]


def test_release_refuses_what_is_not_an_outstanding_replay(database_url, conn, cli, capsys):
    """A pending letter, a replay already handled and an unknown id are each named; nothing is released."""
    pending, _ = dead_letter(conn, {"member_id": "m-2", "points": 1})
    handled, _ = replayed_in_a_backlog(database_url, conn)
    run_worker(database_url)
    assert (
        cli(["dead-letters", "release", str(pending), str(handled), "999", "--reason", "x", "--operator", "ana"])
        == EXIT_USAGE
    )
    err = capsys.readouterr().err
    assert f"dead letter {pending} is pending_review, not replayed" in err
    assert f"dead letter {handled}: its replay was already handled (duplicate)" in err
    assert "dead letter 999 does not exist" in err and "nothing was changed" in err
    assert "released" not in [row[1] for row in ledger(conn)]


def test_a_release_without_a_reason_is_refused_by_the_cli_and_by_the_database(database_url, conn, cli):
    """A blank --reason exits 2; a release by hand in SQL without core_jobs.reason fails; the replay stays outstanding."""
    letter_id, _ = replayed_in_a_backlog(database_url, conn)
    conn.execute("DELETE FROM core.queue_messages")
    assert cli(["dead-letters", "release", str(letter_id), "--reason", "  ", "--operator", "ana"]) == EXIT_USAGE
    with pytest.raises(psycopg.errors.CheckViolation, match="requires a reason"):
        conn.execute("UPDATE core.dead_letters SET replay_outcome = 'released' WHERE id = %s", (letter_id,))
    assert replay_state(conn, letter_id) == (None, False)


def test_list_outstanding_shows_only_the_replays_holding_fences(database_url, conn, cli, capsys):
    """`dead-letters list --outstanding` lists replays not handled yet, shown as replayed:outstanding; handled ones say their outcome."""
    waiting, _ = replayed_in_a_backlog(database_url, conn, "m-1")
    run_worker(database_url)  # handles the first replay: a duplicate
    _, still_job = replayed_in_a_backlog(database_url, conn, "m-2")
    assert cli(["dead-letters", "list", "--outstanding"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "replayed:outstanding" in out and str(still_job) in out
    assert f"\n{waiting:>6}  " not in out
    assert cli(["dead-letters", "list", "--status", "replayed"]) == EXIT_OK
    assert "replayed:duplicate" in capsys.readouterr().out


# --- replays made before revision 0007 ------------------------------------------------------------------
PRE_0007_DEAD_LETTER = """
INSERT INTO core.dead_letters (job_id, queue, consumer, payload, attempts, last_error, tenant_id)
VALUES (gen_random_uuid(), 'points.credit', 'points.credit', jsonb_build_object('member_id', %(member)s::text, 'points', 1),
        5, 'TransientError: ledger timeout', '00000000-0000-4000-8000-0000000000aa')
RETURNING id"""
PRE_0007_REPLAY = (
    """INSERT INTO core.queue_messages (queue, job_id, tenant_id, payload)
       SELECT queue, job_id, tenant_id, payload FROM core.dead_letters WHERE id = %(id)s""",
    "UPDATE core.dead_letters SET status = 'replayed' WHERE id = %(id)s",
)


def test_upgrade_tracks_replays_whose_message_still_waits_and_keeps_the_old_window_for_the_others(empty_database_url):
    """At upgrade a replay with its message still queued stays outstanding (message tagged); any other keeps
    the old rule: handled at its replay time, so held margin x window after the replay."""
    migrate.upgrade(empty_database_url, "0005_purge")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        # What 0005's replay wrote: the message and the status change in one transaction.
        waiting, done = (scalar(conn, PRE_0007_DEAD_LETTER, {"member": m}) for m in ("m-1", "m-2"))
        for letter_id in (waiting, done):
            with conn.transaction():
                for statement in PRE_0007_REPLAY:
                    conn.execute(statement, {"id": letter_id})
        conn.execute("DELETE FROM core.queue_messages WHERE payload->>'member_id' = 'm-2'")  # its delivery was handled
        migrate.upgrade(empty_database_url)
        assert replay_state(conn, waiting) == (None, False)
        assert scalar(conn, "SELECT replay_of FROM core.queue_messages") == waiting
        assert conn.execute(
            "SELECT replay_outcome, replay_handled_at = status_changed_at FROM core.dead_letters WHERE id = %s", (done,)
        ).fetchone() == ("untracked", True)
        create_table(conn)  # the example's own table: no longer the migrations' (0023 drops it while empty)
    assert run_worker(empty_database_url).processed == 1
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert replay_state(conn, waiting) == ("processed", True)


def test_a_release_survives_a_downgrade_and_upgrade_in_the_audit_ledger(database_url, conn, cli):
    """Down to 0005 and up again: the append-only ledger keeps its 'released' row; the replay comes back untracked."""
    letter_id, _ = replayed_in_a_backlog(database_url, conn)
    conn.execute("DELETE FROM core.queue_messages")
    assert cli(["dead-letters", "release", str(letter_id), "--reason", "lost, INC-3", "--operator", "ana"]) == EXIT_OK
    migrate.downgrade(database_url, "0005_purge")
    migrate.upgrade(database_url)
    assert ledger(conn)[-1] == (letter_id, "released", "ana", "lost, INC-3")
    assert replay_state(conn, letter_id) == ("untracked", True)  # re-derived by the upgrade: no message waits
