"""The harness knows its durability tier and says it; a consumer whose needs exceed it refuses to start; a decision
read never goes to a standby.

On the failover rig (tests/support/failover.py): asynchronous (a standby streaming, no synchronous_standby_names) and
synchronous (``ANY 1 (standby1)``); a private cluster with no standby for the single node. A broker queue or a
NON_IDEMPOTENT_WRITE over asynchronous standbys with no barrier refuses the worker (exit 2 from ``core-jobs worker``)
unless accepted; a worker whose URL reaches the standby is refused (ServerInRecovery).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from support import ROOT, TESTS
from support.failover import DATABASE
from support.failover_consumers import effect, sender
from support.private_cluster import private_cluster

from harness.consumer.retry import RetryPolicy
from harness.durability import DurabilityTierTooLow, parse_standby_names, read_tier
from harness.metrics import HarnessMetrics
from harness.pg import ServerInRecovery
from harness.worker import Worker, WorkerConfig
from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE

SENDER = "support.failover_consumers:sender"
EFFECT = "support.failover_consumers:effect"


@pytest.mark.pure
@pytest.mark.parametrize(
    ("setting", "parsed"),
    [
        ("", (None, 0, ())),
        ("ANY 1 (standby1)", ("ANY", 1, ("standby1",))),
        ('any 2 (a, b, "c")', ("ANY", 2, ("a", "b", "c"))),
        ("FIRST 2 (a, b, c)", ("FIRST", 2, ("a", "b", "c"))),
        ("2 (a, b)", ("FIRST", 2, ("a", "b"))),
        ("a, b", ("FIRST", 1, ("a", "b"))),
        ("*", ("FIRST", 1, ("*",))),
    ],
)
def test_synchronous_standby_names_read_as_postgresql_does(setting, parsed):
    assert parse_standby_names(setting) == parsed


@pytest.fixture(scope="module")
def asynchronous(failover_rigs):
    return failover_rigs.fresh(synchronous=False)


@pytest.fixture(scope="module")
def synchronous(failover_rigs):
    return failover_rigs.fresh(synchronous=True)


def tier_of(url: str):
    with psycopg.connect(url, autocommit=True) as conn:
        return read_tier(conn)


def worker(url: str, consumer, queue_url: str | None = None, **config) -> Worker:
    return Worker(
        url,
        consumer,
        policy=RetryPolicy(),
        config=WorkerConfig(fence_ttl=timedelta(days=7), **config),
        metrics=HarnessMetrics(CollectorRegistry()),
        queue_url=queue_url,
    )


def core_jobs(url: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
    return subprocess.run(
        [sys.executable, "-m", "maintenance", *argv],
        cwd=ROOT,
        env=inherited | {"CORE_JOBS_DATABASE_URL": url, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_server_with_no_standby_is_a_single_node():
    with private_cluster() as cluster:
        tier = tier_of(cluster.url())
    assert (tier.kind, tier.standbys) == ("single", 0)
    assert tier.describe() == "single node (no standby)"


def test_standbys_without_synchronous_standby_names_are_asynchronous(asynchronous):
    tier = tier_of(asynchronous.url())
    assert (tier.kind, tier.standbys, tier.number) == ("asynchronous", 1, 0)
    assert tier.describe() == "asynchronous standbys (1)"
    assert "on a broker queue an acked job is lost" in tier.meaning()


def test_a_quorum_of_synchronous_standbys_is_synchronous_and_counted(synchronous):
    tier = tier_of(synchronous.url())
    assert (tier.kind, tier.method, tier.number, tier.names) == ("synchronous", "ANY", 1, ("standby1",))
    assert tier.synchronous_connected == 1
    assert tier.describe() == "synchronous (ANY 1 of 1: standby1, 1 connected)"


def test_a_session_committing_locally_only_makes_synchronous_standbys_asynchronous(synchronous):
    with psycopg.connect(synchronous.url(), autocommit=True, options="-c synchronous_commit=local") as conn:
        tier = read_tier(conn)
    assert tier.kind == "asynchronous"
    assert tier.describe() == "asynchronous standbys (1, synchronous_commit local)"


def test_a_broker_queue_over_asynchronous_standbys_refuses_to_start(asynchronous, rabbit_target):
    running = worker(asynchronous.url(), effect, rabbit_target.worker_url())
    with pytest.raises(DurabilityTierTooLow, match=r"asynchronous standbys .* a broker queue") as refused:
        running.run(once=True)
    assert "CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION=true" in str(refused.value)


def test_a_broker_queue_over_asynchronous_standbys_starts_when_accepted_or_behind_the_barrier(
    asynchronous, rabbit_target
):
    for config in ({"accept_asynchronous_replication": True}, {"await_standby": timedelta(seconds=30)}):
        running = worker(asynchronous.url(), effect, rabbit_target.worker_url(), **config)
        assert running.run(once=True).processed == 0
        assert running.tier is not None and running.tier.kind == "asynchronous"


def test_a_non_idempotent_write_over_asynchronous_standbys_refuses_to_start_even_on_the_reference_queue(asynchronous):
    with pytest.raises(DurabilityTierTooLow, match="NON_IDEMPOTENT_WRITE send"):
        worker(asynchronous.url(), sender).run(once=True)
    assert worker(asynchronous.url(), sender, await_standby=timedelta(seconds=30)).run(once=True).processed == 0


def test_the_reference_queue_with_no_write_to_resend_starts_over_asynchronous_standbys(asynchronous):
    running = worker(asynchronous.url(), effect)
    running.run(once=True)
    assert running.tier is not None and running.tier.kind == "asynchronous"


def test_a_broker_queue_and_a_non_idempotent_write_start_over_synchronous_standbys(synchronous, rabbit_target):
    for consumer, queue_url in ((effect, rabbit_target.worker_url()), (sender, None)):
        running = worker(synchronous.url(), consumer, queue_url)
        running.run(once=True)
        assert running.tier is not None and running.tier.kind == "synchronous"


def test_core_jobs_worker_refused_by_its_tier_exits_2_with_one_line(asynchronous):
    done = core_jobs(asynchronous.url(), "worker", "--consumer", SENDER, "--once")
    assert done.returncode == EXIT_USAGE, done.stderr
    refusal = [line for line in done.stderr.splitlines() if line.startswith("core-jobs: ")]
    assert len(refusal) == 1 and "asynchronous standbys (1)" in refusal[0], done.stderr
    tier_event = next(json.loads(line) for line in done.stdout.splitlines() if "durability_tier" in line)
    assert (tier_event["tier"], tier_event["accepted"]) == ("asynchronous", False)
    accepted = core_jobs(
        asynchronous.url(),
        "worker",
        *("--consumer", SENDER, "--once"),
        CORE_JOBS_WORKER_ACCEPT_ASYNCHRONOUS_REPLICATION="true",
    )
    assert accepted.returncode == EXIT_OK, accepted.stderr


def test_a_worker_whose_url_reaches_a_standby_is_refused(asynchronous):
    assert asynchronous.standby is not None
    standby = asynchronous.standby.url(DATABASE)
    with pytest.raises(ServerInRecovery, match="target_session_attrs=read-write"):
        worker(standby, effect).run(once=True)
    done = core_jobs(standby, "worker", "--consumer", EFFECT, "--once")
    assert done.returncode == EXIT_USAGE and "in recovery" in done.stderr, done.stderr


def test_the_relay_and_the_api_pool_refuse_a_standby_too(asynchronous):
    """Every connection that reads decisions is refused on a standby: the relay's (exit 2, one line) and each the
    operations API's pool opens (its configure step: the pool discards it and requests get a 503)."""
    from maintenance.api.server import session_setup
    from maintenance.settings import Settings

    assert asynchronous.standby is not None
    standby = asynchronous.standby.url(DATABASE)
    broker = "amqp://guest:guest@127.0.0.1:5672/%2F"  # never reached: the database connection is refused first
    done = core_jobs(standby, "relay", "--once", "--queue", "points", "--queue-url", broker)
    assert done.returncode == EXIT_USAGE and "in recovery" in done.stderr, done.stderr
    configure = session_setup(Settings(database_url=standby, api_database_role=None))
    with psycopg.connect(standby, autocommit=True) as conn, pytest.raises(ServerInRecovery, match="read-write"):
        configure(conn)


def test_check_config_shows_the_tier_and_each_consumers_verdict(asynchronous, clean_env, capsys):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", asynchronous.url())
    assert main(["check-config", "--tier", "--consumer", SENDER, "--consumer", EFFECT]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "Durability tier (read from the primary): asynchronous standbys (1)" in out
    assert f"{SENDER}: needs NON_IDEMPOTENT_WRITE send" in out and "REFUSED" in out
    assert f"{EFFECT}: needs nothing beyond the reference queue" in out
    clean_env.setenv("CORE_JOBS_WORKER_AWAIT_STANDBY", "PT30S")
    assert main(["check-config", "--tier", "--json", "--consumer", SENDER]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["durability"]["fields"]["tier"] == "asynchronous"
    assert document["durability"]["barrier"] is True
    assert document["durability"]["consumers"][0]["ok"] is True


def test_check_config_tier_alone(synchronous, clean_env, capsys):
    clean_env.setenv("CORE_JOBS_DATABASE_URL", synchronous.url())
    assert main(["check-config", "--tier"]) == EXIT_OK
    assert "Durability tier (read from the primary): synchronous (ANY 1 of 1: standby1, 1 connected)" in (
        capsys.readouterr().out
    )
