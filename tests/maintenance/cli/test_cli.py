"""The core-jobs CLI: commands and documented exit codes (issue 2, point 7)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import psycopg
import pytest
from support.factories import QUEUE, add_dead_letters

from maintenance.cli import main
from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def test_migrate_twice_succeeds_on_an_empty_database(clean_env, empty_database_url, capsys):
    """`core-jobs migrate` creates the schema, and a second run is a no-op that still exits 0."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == EXIT_OK
    assert main(["migrate"]) == EXIT_OK
    lines = [line for line in capsys.readouterr().out.splitlines() if "maintenance.migrate.done" in line]
    assert '"changed": true' in lines[0] and '"changed": false' in lines[1]
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('core.dead_letters') IS NOT NULL").fetchone()[0]


def test_downgrade_command_reverts_the_schema(clean_env, empty_database_url):
    """`core-jobs downgrade base` removes the tables the migrations created."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == EXIT_OK
    assert main(["downgrade", "base"]) == EXIT_OK
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('core.dead_letters')").fetchone()[0] is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CORE_JOBS_PROCESED_JOBS_TTL", "P7D"),
        ("CORE_JOBS_PROCESSED_JOBS_TTL", "-P1D"),
        ("CORE_JOBS_PROCESSED_JOBS_TTL", "a week"),
        ("CORE_JOBS_RETRY_OVERRIDES", '{"points.credit": {"max_attempts": 9}}'),
        # Durations that become a PostgreSQL parameter: at most 2 147 483 647 ms, at least 1 ms (0 disables it).
        ("CORE_JOBS_MIGRATE_LOCK_TIMEOUT", "P9999999D"),
        ("CORE_JOBS_MIGRATE_LOCK_TIMEOUT", "P25D"),
        ("CORE_JOBS_MIGRATE_LOCK_TIMEOUT", "PT0.0001S"),
        ("CORE_JOBS_PURGE_STATEMENT_TIMEOUT", "P25D"),
        ("CORE_JOBS_API_STATEMENT_TIMEOUT", "P25D"),
        ("CORE_JOBS_API_STATEMENT_TIMEOUT", "PT0.0004S"),
    ],
)
def test_bad_setting_exits_2_naming_it_before_touching_data(clean_env, empty_database_url, capsys, name, value):
    """A bad setting exits 2 with a message naming it, and migrate has not run."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    clean_env.setenv(name, value)
    assert main(["migrate"]) == EXIT_USAGE
    assert name in capsys.readouterr().err
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regnamespace('core')").fetchone()[0] is None


def test_missing_database_url_exits_2(clean_env, capsys):
    """Commands that need the database exit 2 and say which setting is missing."""
    assert main(["run-once"]) == EXIT_USAGE
    assert "CORE_JOBS_DATABASE_URL is not set" in capsys.readouterr().err


def test_unknown_job_exits_2(clean_env, database_url, capsys):
    """run-once with a job name that is not registered exits 2 and lists the valid ones."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    assert main(["run-once", "no-such-job"]) == EXIT_USAGE
    assert "unknown job no-such-job" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["migrate"], ["downgrade", "base"], ["run-once"]])
def test_unreachable_database_is_one_clear_line_and_exit_1(clean_env, capsys, argv):
    """A database that cannot be reached gives exit 1 and a one-line error (no traceback), the password masked."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:pw-unreachable-9@127.0.0.1:1/core")
    assert main(argv) == EXIT_FAILED
    captured = capsys.readouterr()
    assert "pw-unreachable-9" not in captured.out + captured.err
    if argv[0] != "run-once":  # run-once reports each job's failure in its .error event instead
        assert captured.err.startswith("core-jobs: database error: ")
        assert "127.0.0.1" in captured.err and captured.err.count("\n") == 1


@pytest.mark.parametrize("argv", [["migrate", "--revision", "no_such_rev"], ["downgrade", "no_such_rev"]])
def test_unknown_revision_is_a_usage_error(clean_env, empty_database_url, capsys, argv):
    """migrate/downgrade to a revision that does not exist exits 2 with a one-line message naming it."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", empty_database_url)
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"core-jobs: usage error: {argv[0]}: ") and "no_such_rev" in err and err.count("\n") == 1


def test_usage_error_exits_2(clean_env):
    """An unknown command is a usage error: exit 2."""
    assert main(["frobnicate"]) == EXIT_USAGE


def test_check_config_shows_redacted_settings_and_the_guard(clean_env, capsys):
    """check-config prints every setting with the password masked, and the TTL guard computation."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:pw-secret-1@db/core")
    assert main(["check-config"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "CORE_JOBS_DATABASE_URL=postgresql://app:***@db/core" in out
    assert "pw-secret-1" not in out
    assert "max retry window PT11M12S = PT22M24S: ok" in out


def test_check_config_exits_2_when_the_ttl_guard_fails(clean_env, capsys):
    """check-config exits 2 when the TTL is shorter than margin x retry window."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT10M")
    assert main(["check-config"]) == EXIT_USAGE
    assert "TOO SHORT" in capsys.readouterr().out


def test_check_config_with_an_absurd_margin_fails_the_guard_instead_of_crashing(clean_env, capsys):
    """A margin so large that margin x window overflows a timedelta fails the guard (exit 2), not with a traceback."""
    clean_env.setenv("CORE_JOBS_TTL_MARGIN", "1e12")
    assert main(["check-config"]) == EXIT_USAGE
    assert "TOO SHORT" in capsys.readouterr().out


def test_check_config_lists_a_bounded_number_of_delays(clean_env, capsys):
    """With a huge RETRY_MAX_ATTEMPTS, check-config prints the first delays and a count, not one entry per retry."""
    clean_env.setenv("CORE_JOBS_RETRY_MAX_ATTEMPTS", "100000")
    main(["check-config"])
    line = next(li for li in capsys.readouterr().out.splitlines() if "default: 100000 attempts" in li)
    assert "PT30S, PT1M, PT2M" in line and "more)" in line and len(line) < 400


def test_python_dash_m_maintenance_runs_the_cli(clean_env):
    """`python -m maintenance --help` is the same CLI and exits 0."""
    done = subprocess.run([sys.executable, "-m", "maintenance", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert "run-once" in done.stdout


SCHEMES = ["postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres"]
# Passwords libpq would misread, each with the fragments that must never be printed.
MISREAD_PASSWORDS = {
    "raw @": ("Frag1-xY3@Frag2-bPw9", ["Frag1-xY3", "Frag2-bPw9"]),
    "bad %": ("Frag3-qW7%zzFrag4-kL2", ["Frag3-qW7", "Frag4-kL2"]),
}
DATABASE_COMMANDS = {
    "run-once": ["run-once"],
    "migrate": ["migrate"],
    "downgrade": ["downgrade", "base"],
    "dead-letters list": ["dead-letters", "list"],
    "executions list": ["executions", "list"],
    "enqueue": ["enqueue", "points.credit", "--payload", "{}"],
    "worker": ["worker", "--consumer", "harness.examples.points:consumer", "--once"],
    "check-config": ["check-config"],
}


@pytest.mark.parametrize("command", DATABASE_COMMANDS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("password", MISREAD_PASSWORDS)
def test_database_url_libpq_would_misread_exits_2_in_every_spelling_without_any_part_of_the_password(
    clean_env, capsys, command, scheme, password
):
    """Every accepted scheme gets the same URL check: a raw @ or a bad %-escape in the password exits 2 at load, printing no fragment of it."""
    secret, fragments = MISREAD_PASSWORDS[password]
    clean_env.setenv("CORE_JOBS_DATABASE_URL", f"{scheme}://app:{secret}@127.0.0.1:1/core")
    assert main(DATABASE_COMMANDS[command]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err.startswith("core-jobs: configuration error: CORE_JOBS_DATABASE_URL: ")
    assert not [f for f in fragments if f in captured.out + captured.err]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("sslmode=bogus", "sslmode"),
        ("target_session_attrs=primary-ish", "target_session_attrs"),
        ("connect_timeout=abc", "connect_timeout"),
        ("keepalives_idle=1.5", "keepalives_idle"),
        ("port=99999", "port"),
        ("port=0", "port"),
        ("options=-c%20statement_timeout%3Dbogus", "options"),
        ("options=-c%20lock_timeout%3D99999999999", "options"),
        ("options=-cstatement_timeout", "options"),
    ],
)
def test_database_url_parameters_libpq_or_the_server_would_refuse_exit_2_naming_the_parameter(
    clean_env, capsys, query, parameter
):
    """A libpq parameter with a value libpq or the server would refuse at the first connection exits 2 at load, naming the parameter and never the password."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", f"postgresql://app:s3cr3t-pw@127.0.0.1:1/core?{query}")
    assert main(["migrate"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("core-jobs: configuration error: CORE_JOBS_DATABASE_URL: ") and parameter in err, err
    assert "s3cr3t" not in err


def test_a_port_out_of_range_in_the_url_host_part_exits_2(clean_env, capsys):
    """A port beyond 65535 written after the host exits 2 at load, naming the port."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:s3cr3t-pw@127.0.0.1:99999/core")
    assert main(["migrate"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "port" in err and "s3cr3t" not in err, err


# check-config validates the schedules with APScheduler's cron parser (apscheduler.triggers.cron,
# as the settings do when loaded); the scheduler itself is for `serve` only.
HEAVY_MODULES = ("alembic", "sqlalchemy", "apscheduler.schedulers")
# Runs one command in a fresh interpreter; prints its exit code and the heavy packages it loaded.
IMPORTS_OF_A_COMMAND = """
import contextlib, io, json, sys
from maintenance.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[2:])
print(json.dumps([code, sorted(set(sys.modules) & set(sys.argv[1].split(",")))]))
"""


@pytest.mark.parametrize("argv", [["--help"], ["check-config"], ["dead-letters", "--help"], ["executions", "--help"]])
def test_a_command_that_never_migrates_or_schedules_imports_no_alembic_sqlalchemy_or_scheduler(clean_env, argv):
    """`core-jobs --help`, `check-config` and `dead-letters --help` load none of Alembic, SQLAlchemy, APScheduler's scheduler."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_OF_A_COMMAND, ",".join(HEAVY_MODULES), *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    code, heavy = json.loads(done.stdout.splitlines()[-1])
    assert code == 0, done.stderr
    assert heavy == [], f"{argv} imported {heavy}"


def _run_into_a_closed_pipe(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``core-jobs argv`` with its stdout a pipe whose reader has gone (``… | head`` after head exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "maintenance", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "argv",
    [["check-config"], ["dead-letters", "list"], ["dead-letters", "list", "--json"], ["executions", "list", "--json"]],
    ids=" ".join,
)
def test_a_reader_that_goes_away_ends_the_command_quietly_as_unix_tools_do(clean_env, database_url, conn, argv):
    """With stdout's reader gone, every command exits 141 (128 + SIGPIPE) with nothing on stderr: no BrokenPipeError traceback."""
    add_dead_letters(conn, QUEUE, 50)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")} | {
        "CORE_JOBS_DATABASE_URL": database_url
    }
    done = _run_into_a_closed_pipe(argv, env)
    assert done.stderr == "" and done.returncode == 128 + signal.SIGPIPE


def test_demo_without_the_demo_distribution_exits_2_saying_how_to_get_it(clean_env, monkeypatch, capsys):
    """With core-jobs-demo not installed (a production install), `core-jobs demo` exits 2 with one line naming `uv sync`."""
    monkeypatch.setitem(sys.modules, "core_jobs_demo", None)  # None in sys.modules: the import fails as if absent
    assert main(["demo"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "core-jobs-demo" in err[0] and "uv sync" in err[0]


def test_check_config_json_is_one_document_with_redacted_settings_and_the_guard(clean_env, capsys):
    """check-config --json prints one JSON document: the settings with the password masked, the guard's verdict and explanation, and the jobs."""
    import json

    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:pw-secret-1@db/core")
    assert main(["check-config", "--json"]) == EXIT_OK
    out = capsys.readouterr().out
    document = json.loads(out)
    assert "pw-secret-1" not in out
    assert document["settings"]["CORE_JOBS_DATABASE_URL"] == "postgresql://app:***@db/core"
    assert document["guard"]["ok"] is True and "PT22M24S: ok" in document["guard"]["explanation"]
    assert document["jobs"] == ["purge", "alerts", "metrics"]


def test_check_config_json_exits_2_with_the_failed_guard_in_the_document(clean_env, capsys):
    """check-config --json with a TTL too short exits 2 and its document says ok false, guard ok false."""
    import json

    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT10M")
    assert main(["check-config", "--json"]) == EXIT_USAGE
    document = json.loads(capsys.readouterr().out)
    assert (document["ok"], document["guard"]["ok"]) == (False, False)


def test_run_once_json_prints_each_jobs_outcome_and_fields_and_logs_to_stderr(clean_env, database_url, capsys):
    """run-once --json purge metrics: stdout is one JSON document with each job's ok, duration and stop fields; the events go to stderr."""
    import json

    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    assert main(["run-once", "--json", "purge", "metrics"]) == EXIT_OK
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["ok"] is True
    assert [run["job"] for run in document["jobs"]] == ["purge", "metrics"]
    purge = document["jobs"][0]
    assert purge["ok"] is True and purge["error"] is None and purge["duration_s"] >= 0
    assert {"num_deleted", "rows_left", "longest_batch_ms"} <= purge["fields"].keys()
    assert '"maintenance.purge.stop"' in captured.err


def test_run_once_json_masks_credentials_in_a_failed_jobs_error(clean_env, database_url, capsys, monkeypatch):
    """run-once --json: a job error quoting a URL password is in the document with the password masked, as in its error event."""
    from support.jobs import spec

    from maintenance.service import runner

    class LeakyJob:
        def run_once(self, now):
            raise RuntimeError("refused at postgresql://app:pw-9876@db/core")

    leaky = dataclasses.replace(spec("leaky"), build=lambda *_: LeakyJob())
    monkeypatch.setattr(runner, "jobs", lambda: {"leaky": leaky})
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    assert main(["run-once", "--json"]) == EXIT_FAILED
    captured = capsys.readouterr()
    assert "pw-9876" not in captured.out + captured.err
    assert json.loads(captured.out)["jobs"][0]["error"] == "RuntimeError: refused at postgresql://app:***@db/core"


def test_run_once_json_stays_one_document_with_the_console_span_exporter(database_url):
    """With OTEL_TRACES_EXPORTER=console, run-once --json's stdout is still exactly one JSON document (the spans go to stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORE_JOBS_", "OTEL_"))}
    env |= {"CORE_JOBS_DATABASE_URL": database_url, "OTEL_TRACES_EXPORTER": "console"}
    done = subprocess.run(
        [sys.executable, "-m", "maintenance", "run-once", "--json", "metrics"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["jobs"][0]["job"] == "metrics"
    assert '"name": "job metrics"' in done.stderr


def test_check_config_json_reports_a_configuration_error_as_a_document_too(clean_env, capsys):
    """check-config --json with a bad setting exits 2 with {"ok": false, "error": ...} on stdout naming it, and the stderr line."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", "postgresql://app:pw-cfg-77@db/core")
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "a week")
    assert main(["check-config", "--json"]) == EXIT_USAGE
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["ok"] is False and "CORE_JOBS_PROCESSED_JOBS_TTL" in document["error"]
    assert "CORE_JOBS_PROCESSED_JOBS_TTL" in captured.err
    assert "pw-cfg-77" not in captured.out + captured.err


def test_check_config_shows_the_queue_url_redacted_and_the_adapter_it_selects(clean_env, capsys):
    """check-config prints CORE_JOBS_QUEUE_URL with its password masked and names the adapter it selects, in text
    and in JSON; unset, the reference queue."""
    assert main(["check-config"]) == EXIT_OK
    assert "Queue: harness.queue.pgqueue:PgQueue (CORE_JOBS_QUEUE_URL unset: the reference queue" in (
        capsys.readouterr().out
    )
    clean_env.setenv("CORE_JOBS_QUEUE_URL", "amqp://jobs:Rabbit-pw-3@rabbit:5672/%2F")
    assert main(["check-config"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "CORE_JOBS_QUEUE_URL=amqp://jobs:***@rabbit:5672/%2F" in out
    assert "Queue: harness.queue.rabbitmq:RabbitQueue (selected by the scheme amqp)" in out
    assert main(["check-config", "--json"]) == EXIT_OK
    out = capsys.readouterr().out
    document = json.loads(out)
    assert document["settings"]["CORE_JOBS_QUEUE_URL"] == "amqp://jobs:***@rabbit:5672/%2F"
    assert document["queue"] == {
        "url": "amqp://jobs:***@rabbit:5672/%2F",
        "adapter": "harness.queue.rabbitmq:RabbitQueue",
    }
    assert "Rabbit-pw-3" not in out
