"""``core-jobs relay`` (maintenance/cli/relay.py): the outbox published on the broker the settings name, exit codes as ``worker``.

The broker is the parametrised ``relay_target`` (tests/support/relay_support.py), handed to the
command in place of the adapter ``CORE_JOBS_QUEUE_URL`` would open.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.factories import QUEUE, publish
from support.harness_support import expire_leases, scalar
from support.logcapture import events_in

from harness.queue.pgqueue import PgQueue
from maintenance.cli import main
from maintenance.cli import relay as relay_cli
from maintenance.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE

OTHER_QUEUE = "points.other"
SECRET = "s3cr3t-pw"


@pytest.fixture
def cli(clean_env, database_url):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    return main


@pytest.fixture
def on_target(monkeypatch, relay_target):
    """The command's broker is ``relay_target``."""
    monkeypatch.setattr(relay_cli, "open_target", lambda url, conn, **_: relay_target.port())
    return relay_target


def test_relay_once_publishes_the_outbox_of_every_queue_named_and_exits_0(cli, conn, on_target, capsys):
    """`relay --queue Q --queue Q2 --once` publishes both queues' messages, empties the outbox and logs the count."""
    first = publish(conn, {"member_id": "m-1", "points": 1})
    second = publish(conn, {"member_id": "m-2", "points": 2}, queue=OTHER_QUEUE)
    argv = ["relay", "--queue", QUEUE, "--queue", OTHER_QUEUE, "--once", "--queue-url", on_target.url]
    assert cli(argv) == EXIT_OK
    assert [d.envelope.job_id for d in on_target.take(QUEUE)] == [first]
    assert [d.envelope.job_id for d in on_target.take(OTHER_QUEUE)] == [second]
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0
    (stop,) = events_in(capsys.readouterr().out, "harness.relay.stop")
    assert (stop["num_published"], stop["ok"]) == (2, True)


def test_relay_once_reports_rows_still_leased_by_a_dead_relay_instead_of_an_empty_outbox(cli, conn, on_target, capsys):
    """A row a dead relay claimed is under its lease: `--once` publishes the rest, exits 0 and says how many rows
    are still leased and until when (PostgreSQL's clock), in harness.relay.still_leased and harness.relay.stop; once
    the lease is over (back-dated here, never waited for) the next run publishes it."""
    held = publish(conn, {"member_id": "m-1", "points": 1})
    PgQueue(conn, worker="dead-relay", lease=timedelta(minutes=5)).claim(QUEUE, 10)  # and then it died
    free = publish(conn, {"member_id": "m-2", "points": 2})
    argv = ["relay", "--queue", QUEUE, "--once", "--queue-url", on_target.url]
    assert cli(argv) == EXIT_OK
    assert [d.envelope.job_id for d in on_target.take(QUEUE)] == [free]
    out = capsys.readouterr().out
    (leased,) = events_in(out, "harness.relay.still_leased")
    until = scalar(conn, "SELECT lease_expires_at FROM core.queue_messages WHERE job_id = %s", (held,))
    assert (leased["queue"], leased["num_leased"], leased["leased_until"]) == (QUEUE, 1, until.isoformat())
    (stop,) = events_in(out, "harness.relay.stop")
    assert (stop["num_published"], stop["num_still_leased"]) == (1, 1)

    expire_leases(conn)
    assert cli(argv) == EXIT_OK
    assert [d.envelope.job_id for d in on_target.take(QUEUE)] == [held]
    (stop,) = events_in(capsys.readouterr().out, "harness.relay.stop")
    assert (stop["num_published"], stop["num_still_leased"]) == (1, 0)


class Refusing:
    def publish_many(self, messages, *, delay=timedelta(0)) -> None:
        raise ConnectionError("broker unreachable")


def test_relay_exits_1_when_the_broker_fails_and_gives_the_batch_back(cli, conn, monkeypatch, capsys):
    """A publish that fails: exit 1, harness.relay.error names it, and the message is in the outbox, unleased, its attempt not counted."""
    monkeypatch.setattr(relay_cli, "open_target", lambda url, conn, **_: Refusing())
    publish(conn, {"member_id": "m-1", "points": 1})
    assert cli(["relay", "--queue", QUEUE, "--once", "--queue-url", "amqp://guest@127.0.0.1:5672/"]) == EXIT_FAILED
    (error,) = events_in(capsys.readouterr().out, "harness.relay.error")
    assert error["queue"] == QUEUE and "broker unreachable" in error["error"]
    assert conn.execute("SELECT attempts, lease_token FROM core.queue_messages").fetchall() == [(0, None)]


@pytest.mark.parametrize("url", [None, f"postgresql://core:{SECRET}@db.internal/core"], ids=["unset", "postgresql"])
def test_relay_refuses_the_reference_queue_as_its_broker(cli, conn, capsys, url):
    """With no broker URL, or one naming PostgreSQL, the command exits 2 saying there is nothing to relay, the password never printed."""
    publish(conn, {"member_id": "m-1", "points": 1})
    assert cli(["relay", "--queue", QUEUE, "--once", *(["--queue-url", url] if url else [])]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "nothing to relay" in captured.err and SECRET not in captured.err + captured.out
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages WHERE lease_token IS NULL") == 1


def test_relay_refuses_an_unknown_broker_scheme_without_printing_its_password(cli, conn, capsys):
    """A URL of a scheme no adapter serves exits 2 naming the scheme, never the URL's password."""
    url = f"nosuchbroker://relay:{SECRET}@broker.internal/"
    assert cli(["relay", "--queue", QUEUE, "--once", "--queue-url", url]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "nosuchbroker" in captured.err and SECRET not in captured.err + captured.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["relay", "--once"], "--queue"),
        (["relay", "--queue", QUEUE, "--interval", "0"], "--interval"),
        (["relay", "--queue", QUEUE, "--batch-size", "0"], "--batch-size"),
    ],
)
def test_bad_relay_arguments_exit_2_naming_the_option(cli, capsys, argv, message):
    """A missing --queue, a zero interval or batch size: usage error 2 naming the option."""
    assert cli(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
