"""The operator's side of running on RabbitMQ: check-config's redelivery horizon, a broker that cannot be reached,
and the documented commands that carry a job through the local broker."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pika
import pytest
from support.factories import QUEUE
from support.harness_support import scalar

from harness.queue.rabbitmq import exhausted_queue_name
from maintenance.cli import main
from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[3]
URL = "amqp://jobs:Horizon-pw-2@rabbit:5672/%2F"


@pytest.fixture
def cli(clean_env, database_url):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


@pytest.fixture
def closed_port() -> int:
    """A local TCP port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_check_config_shows_the_rabbitmq_horizon_where_it_comes_from_and_the_guards_verdict(clean_env, capsys):
    """With an amqp:// queue URL, check-config shows the adapter's horizon, the URL options and policy it comes from,
    the setting it raises, and the guard computed with it; the password nowhere."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL + "?consumer_timeout=600000")
    assert main(["check-config"]) == EXIT_OK
    out = capsys.readouterr().out
    assert (
        "broker redelivery horizon: PT4H23M9S, the RabbitMQ adapter's PT4H23M9S (from CORE_JOBS_QUEUE_URL:"
        " consumer_timeout=600000 ms, delivery_limit=20 (default); worst policy: the default policy"
        " (CORE_JOBS_RETRY_MAX_ATTEMPTS)), which raises CORE_JOBS_BROKER_REDELIVERY_HORIZON=PT0S"
    ) in out
    assert "max retry window PT4H34M21S = PT9H8M42S: ok" in out  # 11m12s + 4h23m9s, x 2
    assert main(["check-config", "--json"]) == EXIT_OK
    out = capsys.readouterr().out
    horizon = json.loads(out)["redelivery_horizon"]
    assert (horizon["value"], horizon["setting"], horizon["adapter"]["horizon"]) == ("PT4H23M9S", "PT0S", "PT4H23M9S")
    assert "consumer_timeout=600000 ms" in horizon["adapter"]["source"]
    assert "Horizon-pw-2" not in out


def test_check_config_fails_the_guard_a_rabbitmq_horizon_makes_too_short(clean_env, capsys):
    """A fence TTL of one day passes on the reference queue but fails (exit 2) once RabbitMQ's horizon counts."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "P1D")
    clean_env.setenv("CORE_JOBS_QUEUE_URL", URL)
    assert main(["check-config"]) == EXIT_USAGE
    assert "max retry window PT13H14M21S = P1DT2H28M42S: TOO SHORT" in capsys.readouterr().out


def test_check_config_without_a_horizon_from_the_adapter_says_so(clean_env, capsys):
    """On the reference queue, check-config shows the configured horizon and that the adapter computes none."""
    assert main(["check-config"]) == EXIT_OK
    assert (
        "broker redelivery horizon: PT0S (CORE_JOBS_BROKER_REDELIVERY_HORIZON=PT0S; the queue adapter computes none)"
        in capsys.readouterr().out
    )


def test_worker_refuses_a_delivery_limit_its_consumers_own_policy_would_outlast(cli, clean_env, capsys):
    """A consumer whose retry_policy (fixed in code) has more attempts than the URL's delivery_limit exits 2 naming
    CORE_JOBS_QUEUE_URL, delivery_limit and the consumer, before any broker connection."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", "amqp://guest:Limit-pw-1@127.0.0.1:1/%2F?delivery_limit=20")
    assert cli(["worker", "--consumer", "support.harness_consumers:patient", "--once"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "CORE_JOBS_QUEUE_URL: delivery_limit=20 is not above max_attempts=200" in err
    assert "consumer points.credit's retry_policy" in err and "Limit-pw-1" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", QUEUE, "--payload", '{"member_id": "m-1", "points": 1}'],
        ["worker", "--consumer", "harness.examples.points:consumer", "--once"],
    ],
)
def test_an_unreachable_broker_is_one_line_naming_its_host_and_port_and_exit_1(
    cli, clean_env, conn, capsys, closed_port, argv
):
    """enqueue and worker against a RabbitMQ port that refuses connections exit 1 with one `broker error` line on
    stderr naming host:port and the cause — no traceback, no password; nothing is enqueued."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", f"amqp://guest:Closed-pw-1@127.0.0.1:{closed_port}/%2F")
    assert cli(argv) == EXIT_FAILED
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"core-jobs: broker error: RabbitMQ at 127.0.0.1:{closed_port} unreachable")
    assert "Connection refused" in lines[0]
    assert "Closed-pw-1" not in captured.err + captured.out and "Traceback" not in captured.err
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def documented_block(page: Path, heading: str) -> str:
    """The first ```sh block under ``heading`` of ``page``."""
    text = page.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    match = re.search(r"^```sh\n(.*?)^```", section, re.M | re.S)
    assert match is not None, f"no sh block under {heading!r} in {page}"
    return match[1]


RABBITMQ_DOC = ROOT / "docs" / "rabbitmq.md"
TRY_IT = "## Try it on a local broker"


def test_the_readme_shows_the_same_rabbitmq_commands_as_docs_rabbitmq():
    """README.md's RabbitMQ commands are docs/rabbitmq.md's, word for word, so the test below proves both."""
    assert documented_block(RABBITMQ_DOC, TRY_IT) in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_documented_commands_carry_a_job_through_the_local_rabbitmq(database_url, conn, rabbit_url):
    """docs/rabbitmq.md's commands, run as written in a shell (the database theirs to choose), enqueue a job on the
    broker and the worker credits its points from there, leaving the queue empty."""
    block = documented_block(RABBITMQ_DOC, TRY_IT)
    url = re.search(r"CORE_JOBS_QUEUE_URL='([^']+)'", block)
    assert url is not None and url[1] == "amqp://guest:guest@127.0.0.1:5672/%2F"
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv is not None, "uv (the documented commands' runner) is not on PATH"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
    env |= {"CORE_JOBS_DATABASE_URL": database_url, "PATH": f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"}
    env["UV_FROZEN"] = "1"  # never let `uv run` touch uv.lock from a test
    _delete_queues(url[1], "points.credit")  # the documented queue, free of what an earlier run left
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "enqueued job" in done.stdout
        assert scalar(conn, "SELECT sum(points) FROM example.loyalty_points WHERE member_id = 'm-42'") == 50
        assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0  # it went through the broker
        assert _ready(url[1], "points.credit") == 0
    finally:
        _delete_queues(url[1], "points.credit")


def _ready(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def _delete_queues(url: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for name in (queue, exhausted_queue_name(queue)):
            channel.queue_delete(name)
    finally:
        connection.close()


# A queue URL nothing can read (its host part), and one only pika refuses (its query): the password is "Parse-pw-9"
# (or holds it: with a space, over 1024 characters).
UNREADABLE_URLS = {
    "a port that is no number": ("amqp://app:Parse-pw-9@127.0.0.1:notaport/%2F", "port"),
    "a port out of range": ("amqp://app:Parse-pw-9@127.0.0.1:99999/%2F", "port"),
    "an unclosed [": ("amqp://svc@team:Parse-pw-9@[::1/%2F", "IPv6"),
    "no host (what follows user: is no port)": ("amqp://app:Parse-pw-9/%2F", "port"),
    "a space in the password, a port that is no number": ("amqp://app:Parse-pw-9 Parse-pw-9@127.0.0.1:x/%2F", "port"),
    "a password over 1024 characters, a port that is no number": (
        f"amqp://app:{'Parse-pw-9' * 110}@127.0.0.1:x/%2F",
        "port",
    ),
}
PIKA_REFUSES = {
    "an option value pika cannot read": (
        "amqp://svc@team:Parse-pw-9@127.0.0.1:1/%2F?connection_attempts=many",
        "connection_attempts",
    ),
    "an option pika does not know": ("amqp://app:Parse-pw-9@127.0.0.1:1/%2F?no_such_option=1", "no_such_option"),
}
QUEUE_COMMANDS = {
    "enqueue": ["enqueue", QUEUE, "--payload", '{"member_id": "m-1", "points": 1}'],
    "worker": ["worker", "--consumer", "harness.examples.points:consumer", "--once"],
    "relay": ["relay", "--queue", QUEUE, "--once"],
}


def _one_config_line(capsys, problem: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("core-jobs: configuration error: CORE_JOBS_QUEUE_URL: ") and problem in lines[0]
    assert "Parse-pw-9" not in captured.err + captured.out and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command", [*QUEUE_COMMANDS, "check-config"])
@pytest.mark.parametrize(("url", "problem"), UNREADABLE_URLS.values(), ids=UNREADABLE_URLS.keys())
def test_a_queue_url_that_does_not_parse_exits_2_in_one_line_naming_the_setting_and_the_problem(
    cli, clean_env, conn, capsys, command, url, problem
):
    """An unparsable CORE_JOBS_QUEUE_URL is a configuration error at load for every command: exit 2, one line naming
    the setting and the problem, the URL's host shown, its password masked, no traceback; nothing enqueued."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", url)
    assert cli(QUEUE_COMMANDS.get(command, [command])) == EXIT_USAGE
    assert ":***" in _one_config_line(capsys, problem)  # the user shown, the password masked
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


@pytest.mark.parametrize("command", QUEUE_COMMANDS)
@pytest.mark.parametrize(("url", "problem"), PIKA_REFUSES.values(), ids=PIKA_REFUSES.keys())
def test_a_queue_url_pika_refuses_exits_2_in_one_line_before_any_connection(
    cli, clean_env, conn, capsys, command, url, problem
):
    """A URL whose query pika refuses (checked when the adapter opens it) exits 2 too, one line naming the setting
    and the option, the password masked — not a traceback and exit 1."""
    clean_env.setenv("CORE_JOBS_QUEUE_URL", url)
    assert cli(QUEUE_COMMANDS[command]) == EXIT_USAGE
    _one_config_line(capsys, problem)
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
