"""Every commit a guarantee rests on is durable, whatever the server, role or database default (issue 17, item 1).

A DBA's ``ALTER DATABASE … SET synchronous_commit = off`` (or the role's, or the server's
configuration) makes every commit that does not say otherwise asynchronous: the commit returns
before its WAL is written, and a server crash forgets it. The STARTED checkpoint of a
NON_IDEMPOTENT_WRITE is the durable proof that nothing was sent: forgotten, the next worker sends
again. The crash test proves it on a private cluster (tests/support/private_cluster.py) that it really
crashes (``pg_ctl stop -m immediate``), the provider being the local ledger that counts effects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from support.alerts_support import make_feed
from support.factories import add_dead_letters, add_execution, publish
from support.harness_support import run_worker, scalar
from support.ledger_support import PAYLOAD, checkpoints, execution
from support.private_cluster import PrivateCluster, private_cluster
from support.resolutions import UNCERTAIN_NOTIFY, close
from support.waiting import wait_until

import harness.pg
from harness.pg import server_now
from harness.queue.pgqueue import ASYNC_COMMIT
from maintenance.api.server import session_setup
from maintenance.runtime.db import Database
from maintenance.settings import Settings
from tests.harness.durable.test_execution_crash import crash_worker, recover_leases

# The relations whose commits guarantees rest on: a checkpoint (STARTED: the proof nothing was sent),
# the history, the fence with the work, a dead letter and its audit, a resolution, an alert intent
# and its coverage, a published message (an INSERT; claims and acks may be lost, the fence absorbs them).
GUARANTEED = (
    "execution_checkpoints",
    "execution_events",
    "processed_jobs",
    "dead_letters",
    "dead_letter_actions",
    "execution_resolutions",
    "dead_letter_alerts",
    "dead_letter_alert_coverage",
    "queue_messages",
)

# Deferred constraint triggers run at COMMIT, so they see the synchronous_commit that commit uses.
NOTE_COMMIT_SETTINGS = """
CREATE TABLE public.commit_settings (
    id bigserial PRIMARY KEY, relation text NOT NULL, operation text NOT NULL, setting text NOT NULL);
CREATE FUNCTION public.note_commit_setting() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO public.commit_settings (relation, operation, setting)
    VALUES (TG_TABLE_NAME, TG_OP, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as running:
        yield running


@pytest.fixture
def asynchronous_database(cluster: PrivateCluster) -> str:
    """A migrated database of the private cluster whose default is ``synchronous_commit = off``; its URL."""
    name = f"async_{secrets.token_hex(4)}"
    url = cluster.create_migrated_database(name)
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name)))
    return url


@pytest.fixture
def asynchronous_by_default(request, cluster: PrivateCluster) -> Iterator[str]:
    """A URL of the private cluster whose sessions start with synchronous_commit = off, set by the
    server's configuration, a role, a database or the URL's options (``request.param``); undone afterwards."""
    source, admin = request.param, cluster.url()
    suffix = secrets.token_hex(4)
    with psycopg.connect(admin, autocommit=True) as conn:
        if source == "server":
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: _default_of(admin) == "off", what="the server's configuration reloaded")
            url = admin
        elif source == "role":
            conn.execute(f"CREATE ROLE async_{suffix} LOGIN")
            conn.execute(f"ALTER ROLE async_{suffix} SET synchronous_commit = off")
            url = admin.replace("postgres@", f"async_{suffix}@")
        elif source == "database":
            conn.execute(f"CREATE DATABASE async_{suffix}")
            conn.execute(f"ALTER DATABASE async_{suffix} SET synchronous_commit = off")
            url = cluster.url(f"async_{suffix}")
        else:
            url = admin + "?options=-c%20synchronous_commit%3Doff"
    assert _default_of(url) == "off"
    try:
        yield url
    finally:
        if source == "server":
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET synchronous_commit")
                conn.execute("SELECT pg_reload_conf()")
            wait_until(lambda: _default_of(admin) == "on", what="the server's configuration reloaded")


def _default_of(url: str) -> str:
    """What a session of ``url`` starts with, unpinned."""
    with psycopg.connect(url) as conn:
        return conn.execute("SHOW synchronous_commit").fetchone()[0]


@pytest.mark.parametrize("asynchronous_by_default", ["server", "role", "database", "url"], indirect=True)
def test_every_connection_commits_synchronously_whatever_sets_the_default_off(asynchronous_by_default, clean_env):
    """synchronous_commit off from the server's configuration, a role, a database or the URL: a connection of the
    harness, of the jobs and of the API's pool commits with on — and a transaction that turns it off turns it off for itself only."""
    url = asynchronous_by_default
    api_session = psycopg.connect(url, autocommit=True)
    session_setup(Settings(database_url=url, api_database_role=""))(api_session)
    with harness.pg.connect(url, autocommit=True) as worker, Database(url).connect() as job, api_session:
        assert [c.execute("SHOW synchronous_commit").fetchone()[0] for c in (worker, job, api_session)] == ["on"] * 3
        with worker.transaction():
            worker.execute(ASYNC_COMMIT)  # the take's, the claim's: for this transaction alone
            assert scalar(worker, "SHOW synchronous_commit") == "off"
        assert scalar(worker, "SHOW synchronous_commit") == "on"


@pytest.mark.parametrize("stronger", ["local", "remote_write", "remote_apply"])
def test_a_database_default_that_already_flushes_is_kept_not_weakened(conn, database_url, stronger):
    """A database default other than off (a synchronous standby's remote_apply, say) is what the pinned session commits with."""
    name = sql.Identifier(conninfo_to_dict(database_url)["dbname"])
    conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(name, sql.Literal(stronger)))
    with harness.pg.connect(database_url) as pinned:
        assert scalar(pinned, "SHOW synchronous_commit") == stronger


def test_a_non_idempotent_write_sent_before_a_server_crash_is_never_sent_again_when_the_database_commits_asynchronously(
    cluster, asynchronous_database, ledger, ledger_consumer
):
    """Database default synchronous_commit off: notify sent, the server crashed at once, restarted — the next worker sends nothing: one effect, RECONCILIATION_REQUIRED."""
    url = asynchronous_database
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = publish(conn, PAYLOAD, queue="points.ledger")
        conn.execute("CHECKPOINT")  # the job itself is on disk, whatever its commit
    process = crash_worker(url, ledger.url, "notify", "paused")
    try:
        while (line := process.stdout.readline()) and line.strip() != "sent":
            pass  # the worker's log lines
        assert line.strip() == "sent", process.stderr.read()
        assert len(ledger.effects(endpoint="notify")) == 1
        cluster.crash()  # the request went out after notify's STARTED committed: now the server dies
    finally:
        process.kill()
        process.wait(timeout=30)
    cluster.start()
    with psycopg.connect(url, autocommit=True) as conn:
        survived = checkpoints(conn, job_id)
        recover_leases(conn, job_id)
        stats = run_worker(url, consumer=ledger_consumer)
        assert len(ledger.effects(endpoint="notify")) == 1, f"sent again: the crash left the checkpoints {survived}"
        assert survived["notify"] == ("STARTED", 1)
        assert (stats.held, stats.processed) == (1, 0)
        assert execution(conn, job_id)["status"] == "RECONCILIATION_REQUIRED"


@pytest.fixture
def database_commits_asynchronously(conn, database_url) -> None:
    """This test's database with the default synchronous_commit = off (every session opened afterwards has it)."""
    name = sql.Identifier(conninfo_to_dict(database_url)["dbname"])
    conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(name))


def note_commit_settings(conn) -> None:
    """From now on, every commit that writes a GUARANTEED relation (queue_messages: an INSERT) or inserts
    an execution (the take) notes the synchronous_commit it committed with in public.commit_settings."""
    conn.execute(NOTE_COMMIT_SETTINGS)
    for relation in (*GUARANTEED, "executions"):
        events = "INSERT" if relation in ("queue_messages", "executions") else "INSERT OR UPDATE OR DELETE"
        conn.execute(
            sql.SQL(
                "CREATE CONSTRAINT TRIGGER note_commit_setting AFTER {} ON core.{} DEFERRABLE INITIALLY DEFERRED"
                " FOR EACH ROW EXECUTE FUNCTION public.note_commit_setting()"
            ).format(sql.SQL(events), sql.Identifier(relation))
        )


def test_every_commit_a_guarantee_rests_on_is_synchronous_when_the_database_default_is_off(
    database_commits_asynchronously, conn, database_url, db, ledger, ledger_consumer, admin_api, fake_bs
):
    """Database default off: the worker's checkpoints, fences and dead letters, the API's resolution and replay, the
    alert feed's intents all commit with synchronous_commit on; the take alone commits with off."""
    reconciling = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    letters = add_dead_letters(conn, "points.credit", 3)
    publish(conn, PAYLOAD, queue="points.ledger")
    publish(conn, {"member_id": "m-1", "points": 5})
    publish(conn, {"member_id": "m-2", "points": -1})  # poison: a dead letter
    note_commit_settings(conn)

    resolved = admin_api.post(
        f"/v1/core/executions/{reconciling}/resolve",
        json=close("COMPENSATED_VERIFIED"),
        headers={"Idempotency-Key": "key-1"},
    )
    assert resolved.status_code == 200, resolved.text
    replayed = admin_api.post(
        f"/v1/core/dead-letters/{letters[0]}/replay", json={"reason": "INC-1"}, headers=admin_api.as_operator()
    )
    assert replayed.status_code == 200, replayed.text
    assert run_worker(database_url, consumer=ledger_consumer).processed == 1
    stats = run_worker(database_url)
    assert (stats.processed, stats.dead_lettered) == (1, 2)  # the poison job, and the replayed letter's again
    assert make_feed(db, fake_bs).run_once(server_now(conn)).incidents_posted == 1

    seen = conn.execute(
        "SELECT relation, array_agg(DISTINCT setting ORDER BY setting) FROM public.commit_settings GROUP BY relation"
    ).fetchall()
    assert dict(seen) == {relation: ["on"] for relation in GUARANTEED} | {"executions": ["off"]}
    assert scalar(conn, "SELECT current_setting('synchronous_commit')") == "on"  # this session predates the default
