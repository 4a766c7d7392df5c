"""Operator actions on dead letters through the CLI: list, replay, discard, the audit ledger (issue 6, point 6)."""

from __future__ import annotations

import json
import signal
import socket
import sys
import uuid

import httpx
import psycopg
import pytest
from support.factories import QUEUE, TENANT, add_dead_letters, dead_letter, publish
from support.harness_support import fences, points, run_worker, scalar

from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE
from maintenance.operations.dead_letters import MAX_BULK_IDS


@pytest.fixture
def cli(clean_env, database_url):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


def ledger(conn):
    return conn.execute(
        "SELECT dead_letter_id, action, operator, reason FROM core.dead_letter_actions ORDER BY id"
    ).fetchall()


def test_enqueue_then_worker_once_credits_the_points(cli, conn, capsys):
    """`core-jobs enqueue` publishes with the given job id; `core-jobs worker --once` processes it and exits 0."""
    job_id = uuid.uuid4()
    assert (
        cli(
            [
                "enqueue",
                QUEUE,
                "--payload",
                '{"member_id": "m-7", "points": 70}',
                "--job-id",
                str(job_id),
                "--tenant-id",
                str(TENANT),
                "--correlation-id",
                "corr-7",
            ]
        )
        == EXIT_OK
    )
    assert f"enqueued job {job_id} on {QUEUE}" in capsys.readouterr().out
    assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK
    assert points(conn, "m-7") == 70 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_enqueue_without_a_job_id_mints_a_time_ordered_one(cli, conn, capsys):
    """With no --job-id the job gets a UUID version 7 (harness.new_job_id): the fence's index takes it at its edge."""
    assert cli(["enqueue", QUEUE, "--payload", '{"member_id": "m-8", "points": 8}']) == 0
    (job_id,) = conn.execute("SELECT job_id FROM core.queue_messages").fetchone()
    assert job_id.version == 7
    assert str(job_id) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["enqueue", QUEUE, "--payload", "{not json"], "--payload is not valid JSON"),
        (["worker", "--consumer", "harness.examples.points"], "expected module:object"),
        (["worker", "--consumer", "no_such_module:consumer"], "cannot import no_such_module"),
        (["worker", "--consumer", "harness.examples.points:CreditPoints"], "is not a harness Consumer"),
        (["worker", "--consumer", "harness.examples.points:consumr"], "module harness.examples.points has no consumr"),
    ],
)
def test_bad_worker_or_enqueue_arguments_exit_2_naming_the_problem(cli, conn, capsys, argv, message):
    """Unparseable payloads and unloadable consumers exit 2 with a message, and nothing is enqueued."""
    assert cli(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ('{"member_id": "m-1", "points": NaN}', "payload.points"),
        ('{"member_id": "m-1", "points": Infinity}', "payload.points"),
        ('{"member_id": "m-1", "points": -Infinity}', "payload.points"),
        ('{"member_id": "m-1", "points": 1e400}', "payload.points"),
        ('{"member_id": "m\\u0000-1", "points": 1}', "payload.member_id"),
        ('{"member_id\\u0000": "m-1", "points": 1}', "payload: a key"),
        ('{"member_id": "\\ud800", "points": 1}', "payload.member_id"),
        ('[{"deep": [{"member_id": "m\\u0000"}]}]', "payload[0].deep[0].member_id"),
        ("[" * 1200 + "]" * 1200, "payload: nested deeper than"),
        ("[" * 200 + "]" * 200, "payload: nested deeper than"),
        ('{"points": ' + "7" * 5000 + "}", "payload"),
    ],
)
def test_enqueue_refuses_a_payload_jsonb_cannot_store_as_a_usage_error(cli, conn, capsys, payload, where):
    """NaN, Infinity, a number beyond a float or too long, \\u0000, a lone surrogate or nesting too deep in --payload exits 2 naming where, and nothing is queued."""
    assert cli(["enqueue", QUEUE, "--payload", payload]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"core-jobs: --payload cannot be published: {where}") and err.count("\n") == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_enqueue_refuses_a_correlation_id_the_tables_cannot_hold_as_a_usage_error(cli, conn, capsys):
    """A --correlation-id over 1 024 bytes exits 2 naming the field (never the value), and nothing is queued."""
    payload = '{"member_id": "m-1", "points": 1}'
    assert cli(["enqueue", QUEUE, "--payload", payload, "--correlation-id", "c" * 1025]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("core-jobs: the message cannot be published: correlation_id: is longer than 1024 bytes")
    assert "ccc" not in err and scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_enqueue_keeps_an_escaped_backslash_u0000_as_text(cli, conn):
    """A payload whose text merely reads backslash-u0000 (an escaped backslash) is valid jsonb and is queued as written."""
    assert cli(["enqueue", QUEUE, "--payload", '{"member_id": "m-1", "note": "\\\\u0000"}']) == EXIT_OK
    assert scalar(conn, "SELECT payload->>'note' FROM core.queue_messages") == "\\u0000"


def test_worker_refuses_a_fence_ttl_shorter_than_the_retry_window(cli, conn, capsys, clean_env):
    """J-B7: with CORE_JOBS_PROCESSED_JOBS_TTL below the guard, the worker exits 2 before processing anything."""
    publish(conn, {"member_id": "m-1", "points": 1})
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT10M")
    assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_USAGE
    assert "TOO SHORT" in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1


def test_worker_refuses_a_consumer_whose_own_retry_policy_outlasts_the_fence_ttl(cli, conn, capsys, clean_env):
    """J-B7: a retry_policy fixed in the consumer's code counts in the TTL guard; too long a window exits 2, nothing processed."""
    publish(conn, {"member_id": "m-1", "points": 1})
    assert cli(["worker", "--consumer", "support.harness_consumers:patient", "--once"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "TOO SHORT" in err and "support.harness_consumers:patient" in err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1


def test_list_filters_by_queue_and_status_as_text_and_json(cli, conn, capsys):
    """`dead-letters list` shows matching letters; --json includes the payload and the error."""
    first, job_id = dead_letter(conn, {"member_id": "m-1", "points": 1})
    dead_letter(conn, {"to": "x"}, queue="notifications.email")
    assert cli(["dead-letters", "list", "--queue", QUEUE, "--status", "pending_review"]) == EXIT_OK
    out = capsys.readouterr().out
    assert str(job_id) in out and "notifications.email" not in out
    assert cli(["dead-letters", "list", "--json"]) == EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert [r["queue"] for r in rows] == ["notifications.email", QUEUE]  # newest first
    assert rows[1]["payload"] == {"member_id": "m-1", "points": 1}
    assert rows[1]["id"] == first and rows[1]["job_id"] == str(job_id)
    assert cli(["dead-letters", "list", "--status", "discarded"]) == EXIT_OK
    assert "no dead letters match" in capsys.readouterr().out


def test_replay_republishes_with_the_same_job_id_marks_replayed_and_audits(cli, conn, capsys):
    """Replay by id: one message with the same job id, payload, tenant and correlation id; status replayed; a ledger row."""
    letter_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 5})
    assert cli(["dead-letters", "replay", str(letter_id), "--operator", "ana", "--reason", "ledger is back"]) == EXIT_OK
    assert f"replayed dead letter {letter_id}" in capsys.readouterr().out
    message = conn.execute(
        "SELECT queue, job_id, payload, tenant_id, correlation_id, attempts FROM core.queue_messages"
    ).fetchall()
    assert message == [(QUEUE, job_id, {"member_id": "m-1", "points": 5}, TENANT, f"corr-{job_id.hex[:6]}", 0)]
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "replayed"
    assert ledger(conn) == [(letter_id, "replayed", "ana", "ledger is back")]


def test_replay_all_pending_of_a_queue_leaves_other_queues_alone(cli, conn):
    """--queue Q --all-pending replays every pending letter of Q, and only those."""
    a, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    b, _ = dead_letter(conn, {"member_id": "m-2", "points": 1})
    other, _ = dead_letter(conn, {"to": "x"}, queue="notifications.email")
    assert cli(["dead-letters", "replay", "--queue", QUEUE, "--all-pending", "--operator", "ana"]) == EXIT_OK
    statuses = dict(conn.execute("SELECT id, status FROM core.dead_letters").fetchall())
    assert statuses == {a: "replayed", b: "replayed", other: "pending_review"}
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages WHERE queue = %s", (QUEUE,)) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["dead-letters", "replay"],
        ["dead-letters", "replay", "--all-pending"],
        ["dead-letters", "replay", "1", "--queue", QUEUE, "--all-pending"],
        ["dead-letters", "replay", "1", "--queue", "notifications.email"],
    ],
)
def test_replay_needs_ids_or_a_queue_with_all_pending(cli, conn, argv):
    """Neither ids nor --queue --all-pending, both, or ids with a --queue that would be ignored: exit 2, nothing replayed."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    assert letter_id == 1
    assert cli(argv) == EXIT_USAGE
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = 1") == "pending_review"


def test_replaying_a_letter_that_is_not_pending_is_refused_and_changes_nothing(cli, conn, capsys):
    """Exit 2 naming the letter and its status; the pending letter in the same request is not replayed either."""
    handled, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    pending, _ = dead_letter(conn, {"member_id": "m-2", "points": 1})
    assert (
        cli(["dead-letters", "discard", str(handled), "--reason", "duplicate of OPS-1", "--operator", "ana"]) == EXIT_OK
    )
    capsys.readouterr()
    assert cli(["dead-letters", "replay", str(pending), str(handled), "999", "--operator", "ana"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"dead letter {handled} is discarded, not pending_review" in err
    assert "dead letter 999 does not exist" in err and "nothing was changed" in err
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (pending,)) == "pending_review"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    assert len(ledger(conn)) == 1


def test_discard_with_a_reason_marks_discarded_and_audits(cli, conn):
    """Discard sets status and reason on every id given and writes one ledger row each."""
    a, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    b, _ = dead_letter(conn, {"member_id": "m-2", "points": 1})
    assert (
        cli(["dead-letters", "discard", str(a), str(b), "--reason", "credited by hand, OPS-9", "--operator", "luis"])
        == EXIT_OK
    )
    assert conn.execute("SELECT DISTINCT status, discard_reason FROM core.dead_letters").fetchall() == [
        ("discarded", "credited by hand, OPS-9")
    ]
    assert ledger(conn) == [
        (a, "discarded", "luis", "credited by hand, OPS-9"),
        (b, "discarded", "luis", "credited by hand, OPS-9"),
    ]


@pytest.mark.parametrize("reason", [[], ["--reason", ""], ["--reason", "   "]])
def test_discard_without_a_reason_exits_2_and_changes_nothing(cli, conn, reason):
    """J-AC7 (CLI): a missing or blank reason exits 2; the letter stays pending and nothing is audited."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    assert cli(["dead-letters", "discard", str(letter_id), *reason]) == EXIT_USAGE
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "pending_review"
    assert ledger(conn) == []


@pytest.mark.parametrize(
    "action",
    [["replay"], ["discard", "--reason", "OPS-9"], ["release", "--reason", "OPS-9"]],
    ids=lambda action: action[0],
)
def test_an_action_on_more_ids_than_the_apis_cap_exits_2_and_changes_nothing(cli, conn, capsys, action):
    """replay, discard and release by id refuse more than MAX_BULK_IDS ids (the API's cap too) with exit 2 naming the cap, and change nothing."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    ids = [str(letter_id), *(str(letter_id + n) for n in range(1, MAX_BULK_IDS + 1))]
    assert cli(["dead-letters", action[0], *ids, *action[1:]]) == EXIT_USAGE
    assert f"at most {MAX_BULK_IDS}" in capsys.readouterr().err
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "pending_review"
    assert ledger(conn) == []


def test_discard_without_a_reason_is_rejected_by_the_database(conn):
    """J-AC7 (SQL): an UPDATE to discarded with no reason fails, and no ledger row is written."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    with pytest.raises(psycopg.errors.CheckViolation, match="requires a non-blank discard_reason"):
        conn.execute("UPDATE core.dead_letters SET status = 'discarded' WHERE id = %s", (letter_id,))
    assert ledger(conn) == []


def test_a_status_change_made_in_sql_is_audited_with_the_database_user(conn):
    """The ledger is complete: a replay done by hand in psql is recorded under the session's user."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter_id,))
    assert ledger(conn) == [(letter_id, "replayed", scalar(conn, "SELECT session_user"), None)]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE core.dead_letter_actions SET operator = 'someone-else'",
        "DELETE FROM core.dead_letter_actions",
        "TRUNCATE core.dead_letter_actions",
    ],
)
def test_the_audit_ledger_is_append_only(conn, statement):
    """Ledger rows can be neither changed nor removed."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    conn.execute("UPDATE core.dead_letters SET status = 'replayed' WHERE id = %s", (letter_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="append-only audit ledger"):
        conn.execute(statement)
    assert len(ledger(conn)) == 1


def test_replaying_a_job_that_already_succeeded_elsewhere_has_no_second_effect(cli, database_url, conn):
    """J-AC5: the job's work and fence are committed; replaying its dead letter is absorbed as a duplicate."""
    job_id = publish(conn, {"member_id": "m-1", "points": 30})
    assert run_worker(database_url).processed == 1
    letter_id, _ = dead_letter(
        conn, {"member_id": "m-1", "points": 30}, job_id=job_id
    )  # e.g. a redelivered copy gave up
    assert cli(["dead-letters", "replay", str(letter_id), "--operator", "ana"]) == EXIT_OK
    stats = run_worker(database_url)
    assert (stats.processed, stats.duplicates) == (0, 1)
    assert points(conn, "m-1") == 30 and fences(conn, job_id) == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_replaying_a_job_that_never_succeeded_applies_it_once(cli, database_url, conn):
    """J-AC5: a dead letter whose job never ran to completion is applied exactly once by its replay."""
    letter_id, job_id = dead_letter(conn, {"member_id": "m-1", "points": 30})
    assert cli(["dead-letters", "replay", str(letter_id), "--operator", "ana"]) == EXIT_OK
    assert run_worker(database_url).processed == 1
    assert points(conn, "m-1") == 30 and fences(conn, job_id) == 1
    assert cli(["dead-letters", "replay", str(letter_id), "--operator", "ana"]) == EXIT_USAGE  # not pending any more
    assert run_worker(database_url).processed == 0
    assert points(conn, "m-1") == 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_serves_its_success_counters_for_prometheus(cli, conn):
    """With --metrics-port, the processed counter of the consumer is scraped from /metrics (successes are metrics).

    The worker counts into a registry of its own: an earlier worker in the same process adds nothing.
    """
    publish(conn, {"member_id": "m-1", "points": 1})
    assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK  # another worker
    publish(conn, {"member_id": "m-2", "points": 1})
    port = free_port()
    assert (
        cli(["worker", "--consumer", "harness.examples.points:consumer", "--once", "--metrics-port", str(port)])
        == EXIT_OK
    )
    body = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    line = next(x for x in body.splitlines() if x.startswith('harness_jobs_processed_total{consumer="points.credit"}'))
    assert float(line.split()[-1]) == 1


def test_worker_refuses_a_metrics_port_already_in_use(cli, conn, capsys):
    """--metrics-port on a port another process listens on exits 2 naming the port, before processing anything."""
    publish(conn, {"member_id": "m-1", "points": 1})
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert (
            cli(["worker", "--consumer", "harness.examples.points:consumer", "--once", "--metrics-port", str(port)])
            == EXIT_USAGE
        )
    assert f"--metrics-port {port}" in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--batch-size", "1001"], ["--batch-size", "ten"]])
def test_worker_refuses_out_of_range_numbers(cli, capsys, argv):
    """--concurrency and --batch-size outside their ranges are usage errors (exit 2) naming the bound."""
    assert cli(["worker", "--consumer", "harness.examples.points:consumer", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "is not between" in err or "is not a whole number" in err


@pytest.mark.parametrize("queue", [" ", " points.credit", "points credit"])
def test_enqueue_refuses_a_queue_name_no_consumer_can_have(cli, conn, capsys, queue):
    """A blank queue name, or one with spaces no consumer could declare, exits 2 and enqueues nothing."""
    assert cli(["enqueue", queue, "--payload", "{}"]) == EXIT_USAGE
    assert "QUEUE" in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


@pytest.mark.parametrize("limit", ["-1", "0", "many"])
def test_list_refuses_a_limit_that_is_not_a_positive_number(cli, conn, capsys, limit):
    """`dead-letters list --limit` below 1 or not a number is a usage error (exit 2) with a message, not a traceback."""
    assert cli(["dead-letters", "list", "--limit", limit]) == EXIT_USAGE
    assert "--limit" in capsys.readouterr().err


def test_worker_gives_back_the_signal_handlers_it_installed(cli, conn):
    """`core-jobs worker` called in-process restores the SIGTERM and SIGINT handlers it replaced once it returns."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize(
    "argv",
    [
        ["dead-letters", "list"],
        ["enqueue", QUEUE, "--payload", "{}"],
        ["dead-letters", "replay", "1"],
        ["dead-letters", "discard", "1", "--reason", "x"],
        ["executions", "list"],
        ["executions", "show", "1"],
    ],
)
def test_a_database_error_exits_1_with_one_line_and_no_secret(clean_env, capsys, argv):
    """An unreachable database: exit 1, one 'database error' line on stderr, no traceback, no password.

    (A malformed URL is a configuration error, exit 2: tests/maintenance/settings/test_settings.py.)
    """
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://ops:s3cret-pw@127.0.0.1:1/test")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("core-jobs: database error:") and err.count("\n") == 1, err
    assert "s3cret-pw" not in err and "Traceback" not in err


@pytest.mark.parametrize("pending", [3, 4])
def test_replay_of_all_pending_beyond_the_bulk_cap_is_refused_with_the_count(cli, conn, capsys, clean_env, pending):
    """With CORE_JOBS_DEAD_LETTERS_BULK_MAX=3, --all-pending replays 3 matches; 4 exit 2 naming 4 and 3, nothing changed."""
    clean_env.setenv("CORE_JOBS_DEAD_LETTERS_BULK_MAX", "3")
    ids = [dead_letter(conn, {"member_id": f"m-{i}", "points": 1})[0] for i in range(pending)]
    code = cli(["dead-letters", "replay", "--queue", QUEUE, "--all-pending", "--operator", "ana"])
    statuses = {s for (s,) in conn.execute("SELECT status FROM core.dead_letters WHERE id = ANY(%s)", (ids,))}
    if pending == 3:
        assert code == EXIT_OK and statuses == {"replayed"}
        return
    assert code == EXIT_USAGE and statuses == {"pending_review"}
    assert "4 pending dead letters match" in capsys.readouterr().err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0 and ledger(conn) == []


def test_a_blank_operator_is_refused_in_words_that_name_no_surface(conn):
    """The operations refuse a blank operator without telling the caller to pass a CLI option (the API calls them too)."""
    from maintenance.operations.dead_letters import OperationRefused, replay

    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    with pytest.raises(OperationRefused) as refused:
        replay(conn, [letter_id], operator="  ")
    assert refused.value.problems == ["the operator is unknown: no name was given"]
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "pending_review"


def test_a_bulk_action_by_filter_is_given_its_cap_by_the_caller(conn):
    """replay and discard by queue take max_rows from the caller (CORE_JOBS_DEAD_LETTERS_BULK_MAX, the CLI's and the
    API's setting): without it they refuse before touching anything, for there is no second default to drift."""
    from maintenance.operations.dead_letters import discard, replay

    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    queue = scalar(conn, "SELECT queue FROM core.dead_letters WHERE id = %s", (letter_id,))
    with pytest.raises(TypeError, match="max_rows"):
        replay(conn, queue=queue, operator="ops")
    with pytest.raises(TypeError, match="max_rows"):
        discard(conn, queue=queue, operator="ops", reason="duplicate")
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "pending_review"


def test_cli_refuses_a_blank_operator_saying_which_option_to_pass(cli, conn, capsys):
    """`--operator ""` is refused with exit 2 and the CLI's own hint, `pass --operator NAME (or set $USER)`; nothing changed."""
    letter_id, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    assert cli(["dead-letters", "replay", str(letter_id), "--operator", ""]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "core-jobs: refused: the operator is unknown: pass --operator NAME (or set $USER)" in err
    assert scalar(conn, "SELECT status FROM core.dead_letters WHERE id = %s", (letter_id,)) == "pending_review"


def test_enqueue_and_worker_use_the_queue_adapter_of_core_jobs_queue_url(cli, clean_env, conn, capsys, echo_queues):
    """With CORE_JOBS_QUEUE_URL of an installed adapter's scheme, `enqueue` publishes through a port of that adapter
    and `worker --once` processes through its own; each port is closed when the command ends."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", "echo://jobs:Echo-pw-1@nowhere/")
    payload = '{"member_id": "m-e", "points": 5}'
    assert cli(["enqueue", QUEUE, "--payload", payload, "--tenant-id", str(TENANT)]) == EXIT_OK
    assert "enqueued job" in capsys.readouterr().out
    assert len(echo_queues.opened) == 1 and echo_queues.opened[0].closed

    assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK

    assert len(echo_queues.opened) == 2 and all(port.closed for port in echo_queues.opened)
    assert points(conn, "m-e") == 5


@pytest.mark.parametrize(
    "argv", [["enqueue", QUEUE, "--payload", "{}"], ["worker", "--consumer", "harness.examples.points:consumer"]]
)
def test_enqueue_and_worker_exit_2_when_the_queue_urls_adapter_cannot_be_imported(cli, clean_env, conn, capsys, argv):
    """An amqp:// CORE_JOBS_QUEUE_URL without the RabbitMQ adapter importable exits 2 naming the setting and the extra
    to install, not the password; nothing is enqueued."""
    clean_env.setitem(sys.modules, "harness.queue.rabbitmq", None)
    clean_env.setenv("CORE_JOBS_QUEUE_URL", "amqp://jobs:Rabbit-pw-2@127.0.0.1:5672/%2F")
    assert cli(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "CORE_JOBS_QUEUE_URL" in err and "core-jobs-harness[rabbitmq]" in err and "Rabbit-pw-2" not in err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_enqueue_and_worker_run_a_job_through_rabbitmq_when_core_jobs_queue_url_is_amqp(
    cli, clean_env, conn, capsys, rabbit_url
):
    """With an amqp:// CORE_JOBS_QUEUE_URL, `enqueue` puts the message on the broker (not core.queue_messages) and
    `worker --once` takes it from there and credits the points."""
    from support.rabbit_support import RabbitUnderTest

    prefix = f"test.{uuid.uuid4().hex[:12]}."  # the adapter's queue-name prefix: a namespace of this test's own
    broker = RabbitUnderTest(rabbit_url, queue=prefix + QUEUE)
    clean_env.setenv("CORE_JOBS_QUEUE_URL", f"{rabbit_url}{'&' if '?' in rabbit_url else '?'}prefix={prefix}")
    payload = '{"member_id": "m-r", "points": 3}'
    try:
        assert cli(["enqueue", QUEUE, "--payload", payload, "--tenant-id", str(TENANT)]) == EXIT_OK
        assert broker.ready() == 1 and scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
        assert cli(["worker", "--consumer", "harness.examples.points:consumer", "--once"]) == EXIT_OK
        assert points(conn, "m-r") == 3 and broker.ready() == 0
    finally:
        broker.delete()


def test_list_and_the_api_share_one_default_pending_newest_first(cli, conn, capsys):
    """`dead-letters list` without --status shows pending letters, newest first, as the API does; `any` shows all."""
    older, _ = dead_letter(conn, {"member_id": "m-1", "points": 1})
    newer, _ = dead_letter(conn, {"member_id": "m-2", "points": 1})
    handled, _ = dead_letter(conn, {"member_id": "m-3", "points": 1})
    assert cli(["dead-letters", "discard", str(handled), "--reason", "credited by hand", "--operator", "ana"]) == 0
    capsys.readouterr()
    assert cli(["dead-letters", "list", "--json"]) == EXIT_OK
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [newer, older]
    assert cli(["dead-letters", "list", "--status", "any", "--json"]) == EXIT_OK
    assert {r["id"] for r in json.loads(capsys.readouterr().out)} == {older, newer, handled}


def test_show_prints_the_error_its_traceback_the_payload_and_the_audit_history(cli, conn, capsys):
    """`dead-letters show ID`: the letter whole, the stack trace beside the one-line error."""
    stack = "Traceback (most recent call last):\n  File \"credit.py\", line 9, in tier_of\nKeyError: 'tier'\n"
    (letter,) = add_dead_letters(
        conn, QUEUE, 1, error="KeyError: 'tier'", traceback=stack, payload={"member_id": "m-7"}
    )
    assert cli(["dead-letters", "discard", str(letter), "--reason", "member closed", "--operator", "ana"]) == EXIT_OK
    capsys.readouterr()
    assert cli(["dead-letters", "show", str(letter)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"dead letter {letter}: discarded" in out and "KeyError: 'tier'" in out
    assert '  File "credit.py", line 9, in tier_of' in out and '"member_id": "m-7"' in out
    assert "discarded by ana: member closed" in out
    assert cli(["dead-letters", "show", str(letter), "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["traceback"] == stack and [a["operator"] for a in shown["actions"]] == ["ana"]


def test_show_of_an_unknown_id_is_a_usage_error(cli, capsys):
    assert cli(["dead-letters", "show", "424242"]) == EXIT_USAGE
    assert "dead letter 424242 does not exist" in capsys.readouterr().err


def test_errors_groups_and_counts_pending_letters_by_error_biggest_first(cli, conn, capsys):
    """`dead-letters errors`: one row per error (its first line), with its count, queues and newest letter."""
    add_dead_letters(conn, QUEUE, 3, error="KeyError: 'tier'\nmore detail")
    newest = add_dead_letters(conn, "notifications.email", 1, error="KeyError: 'tier'", age="1 minute")[0]
    add_dead_letters(conn, QUEUE, 1, error="PermanentError: member closed")
    assert cli(["dead-letters", "errors", "--json"]) == EXIT_OK
    groups = json.loads(capsys.readouterr().out)
    assert [(g["error"], g["count"]) for g in groups] == [("KeyError: 'tier'", 4), ("PermanentError: member closed", 1)]
    assert groups[0]["queues"] == sorted([QUEUE, "notifications.email"]) and groups[0]["latest_id"] == newest
    assert cli(["dead-letters", "errors", "--queue", "notifications.email"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "KeyError: 'tier'" in out and "member closed" not in out
