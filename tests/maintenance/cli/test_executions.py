"""``core-jobs executions list|show`` against a real PostgreSQL: read-only views of executions (issue 12)."""

from __future__ import annotations

import json
import uuid

import pytest
from support.factories import add_execution

from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE

CHECKPOINTS = (
    ("lookup", "READ_ONLY", "SUCCEEDED", {"member": "m-1"}),
    ("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),
)

# Every execution row with its checkpoints, to compare before and after a command.
EVERY_EXECUTION = """
SELECT e.*, (SELECT json_agg(c ORDER BY c.position) FROM core.execution_checkpoints AS c WHERE c.execution_id = e.id)
  FROM core.executions AS e ORDER BY e.id"""


@pytest.fixture
def cli(clean_env, database_url):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


def listed(cli, capsys, *argv: str) -> list[int]:
    """The ids ``executions list --json`` prints for ``argv``."""
    assert cli(["executions", "list", *argv, "--json"]) == EXIT_OK
    return [row["id"] for row in json.loads(capsys.readouterr().out)]


def test_list_shows_reconciliation_required_by_default_oldest_first(cli, conn, capsys):
    """Without --status the list is RECONCILIATION_REQUIRED, the longest waiting first, with job id and reason."""
    job_id = uuid.uuid4()
    newer = add_execution(conn, age="5 minutes")
    older = add_execution(conn, age="3 hours", job_id=job_id)
    add_execution(conn, status="FAILED", reason="lookup: PermanentError: member unknown")
    assert cli(["executions", "list"]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == [str(older), str(newer)]
    assert str(job_id) in out[1] and "notify: the worker was lost" in out[1] and "RECONCILIATION_REQUIRED" in out[1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--status", "FAILED"], "failed"),
        (["--consumer", "billing.charge"], "billing"),
        (["--business-scope", "billing"], "billing"),
    ],
)
def test_list_filters_by_status_consumer_and_scope(cli, conn, capsys, argv, expected):
    """--status, --consumer and --business-scope each list exactly the matching executions."""
    rows = {
        "failed": add_execution(conn, status="FAILED", reason="credit: PermanentError: 422"),
        "billing": add_execution(conn, consumer="billing.charge", queue="billing", business_scope="billing"),
        "other": add_execution(conn),
    }
    assert listed(cli, capsys, *argv) == [rows[expected]]


def test_list_by_job_id_finds_that_jobs_execution(cli, conn, capsys):
    """--job-id lists the execution of that job only."""
    job_id = uuid.uuid4()
    mine = add_execution(conn, job_id=job_id)
    add_execution(conn)
    assert listed(cli, capsys, "--job-id", str(job_id)) == [mine]


def test_list_json_has_the_rows_fields_and_no_payload(cli, conn, capsys):
    """--json prints each row's state, reason and times as JSON; payloads are for show."""
    execution = add_execution(conn)
    assert cli(["executions", "list", "--json"]) == EXIT_OK
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == execution and row["status"] == "RECONCILIATION_REQUIRED"
    assert row["reason_action"] == "notify" and row["status_changed_at"].endswith("+00:00")
    assert "payload" not in row


def test_list_says_when_the_limit_hides_more(cli, conn, capsys):
    """--limit N shows N rows and says that more match."""
    for age in ("3 minutes", "2 minutes", "1 minute"):
        add_execution(conn, age=age)
    assert cli(["executions", "list", "--limit", "2"]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and "more match" in out[-1]


def test_an_empty_list_says_so_and_exits_0(cli, conn, capsys):
    """No matching execution: one line saying so, exit 0."""
    add_execution(conn, status="FAILED")
    assert cli(["executions", "list"]) == EXIT_OK
    assert capsys.readouterr().out == "no RECONCILIATION_REQUIRED executions match\n"


def test_show_prints_the_execution_its_checkpoints_in_order_and_its_history(cli, conn, capsys):
    """show ID: state, reason, payload, each checkpoint with effect, status, attempts, key and error, then the history."""
    job_id = uuid.uuid4()
    execution = add_execution(
        conn, job_id=job_id, checkpoints=CHECKPOINTS, events=(("RECONCILIATION_REQUIRED", "notify"),)
    )
    assert cli(["executions", "show", str(execution)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"execution {execution}: RECONCILIATION_REQUIRED since ")
    assert '"member_id": "m-1"' in out and "business scope: loyalty" in out
    lookup, notify = (
        out.index("0. lookup [READ_ONLY] SUCCEEDED"),
        out.index("1. notify [NON_IDEMPOTENT_WRITE] UNCERTAIN"),
    )
    assert lookup < notify < out.index("history:")
    assert f"key {job_id}:points.ledger:notify" in out and "last error: TransientError: ledger timeout" in out
    assert "RECONCILIATION_REQUIRED notify attempt 1" in out[out.index("history:") :]


def test_show_json_has_the_payload_checkpoints_and_events(cli, conn, capsys):
    """show --json: the row, the payload, the checkpoints with results and the events, as JSON."""
    execution = add_execution(conn, checkpoints=CHECKPOINTS, events=(("TAKEN_OVER", None),))
    assert cli(["executions", "show", str(execution), "--json"]) == EXIT_OK
    body = json.loads(capsys.readouterr().out)
    assert body["row"]["id"] == execution and body["payload"] == {"member_id": "m-1", "points": 10}
    assert [(c["action"], c["status"], c["result"]) for c in body["checkpoints"]] == [
        ("lookup", "SUCCEEDED", {"member": "m-1"}),
        ("notify", "UNCERTAIN", None),
    ]
    assert [e["kind"] for e in body["events"]] == ["TAKEN_OVER"]


def test_show_of_an_unknown_id_exits_2_naming_it(cli, conn, capsys):
    """An id that is no execution is a usage error (exit 2), as an unknown dead-letter id is, naming the id."""
    assert cli(["executions", "show", "4242"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err.startswith("core-jobs: execution 4242 does not exist") and captured.out == ""


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["executions", "list", "--status", "SUCCEEDED"], "--status"),
        (["executions", "list", "--limit", "0"], "--limit"),
        (["executions", "list", "--job-id", "job-7"], "--job-id"),
        (["executions", "show", "seven"], "ID"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(cli, conn, capsys, argv, named):
    """An unknown status, a limit below 1, a job id that is no UUID, an id that is no number: exit 2, named."""
    assert cli(argv) == EXIT_USAGE
    assert named in capsys.readouterr().err


def test_the_commands_change_nothing(cli, conn, capsys):
    """list and show only read: the execution, its checkpoints and its token are as they were."""
    execution = add_execution(conn, checkpoints=CHECKPOINTS)
    before = conn.execute(EVERY_EXECUTION).fetchall()
    assert cli(["executions", "list"]) == EXIT_OK and cli(["executions", "show", str(execution)]) == EXIT_OK
    assert conn.execute(EVERY_EXECUTION).fetchall() == before
