"""Every installation has its own alert identity: keys and lookups never cross databases (issue 9, item 1).

Staging and prod share one Better Stack team and, being young databases, the same dead-letter
ids. Each test database of ``database_url`` is a copy of one migrated template (so they all
share that template's identity); ``prod_database_url`` is migrated on its own, as a second
installation is.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
from support.alerts_support import alert_rows, feed_settings, handle, make_feed
from support.factories import add_dead_letters
from support.fake_betterstack import TOKEN, Fault, metadata_values
from support.logcapture import events_in

from alerts.feed import INSTALLATION_METADATA_KEY, METADATA_KEY, read_installation
from alerts.identity import ADOPTED, RENEWED, IdentityUnconfirmed, read_identity, rebind
from harness.pg import server_now
from maintenance.cli import main as cli_main
from maintenance.runtime import migrate
from maintenance.runtime.db import Database
from tests.conftest import create_database, drop_database


@pytest.fixture
def prod_database_url(empty_database_url: str) -> str:
    """A second installation: a database migrated from scratch, with an identity of its own."""
    migrate.upgrade(empty_database_url)
    return empty_database_url


@pytest.fixture
def prod_conn(prod_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(prod_database_url, autocommit=True) as connection:
        yield connection


def metadata_value(fake, incident_id: str, key: str) -> list[str]:
    """The values of metadata ``key`` of an incident as the fake Better Stack stored them."""
    return metadata_values(fake.incidents[incident_id]["metadata"], key)


def test_two_installations_have_distinct_identities(conn, prod_conn):
    """The template-copied staging database and the separately migrated prod one each read their own UUID."""
    staging, prod = read_installation(conn), read_installation(prod_conn)
    assert staging != prod
    assert len(staging) == len(prod) == 36


def test_a_retried_post_never_adopts_the_other_installations_incident(db, conn, prod_database_url, prod_conn, fake_bs):
    """Issue 9's repro: staging alerts dead letters 1-2; prod's POST of its own 1-2 gets a 503 once and
    the lookup that follows must not take staging's incident: prod posts its own, and resolving prod's
    dead letters later resolves only prod's incident."""
    staging_ids = add_dead_letters(conn, "points.credit", 2)
    prod_ids = add_dead_letters(prod_conn, "points.credit", 2)
    assert staging_ids == prod_ids  # the collision's precondition: same kind, same ids
    make_feed(db, fake_bs).run_once(server_now(conn))
    [staging_incident] = list(fake_bs.incidents)

    fake_bs.fail_next("create", Fault(status=503))
    prod_feed = make_feed(Database(prod_database_url), fake_bs)
    posted = prod_feed.run_once(server_now(prod_conn))

    assert (posted.incidents_posted, posted.incidents_recovered, posted.ok) == (1, 0, True)
    [prod_incident] = [i for i in fake_bs.incidents if i != staging_incident]
    assert alert_rows(prod_conn)[0][2:4] == ("open", prod_incident)
    assert metadata_value(fake_bs, prod_incident, INSTALLATION_METADATA_KEY) == [read_installation(prod_conn)]
    assert metadata_value(fake_bs, staging_incident, INSTALLATION_METADATA_KEY) == [read_installation(conn)]
    prod_key = metadata_value(fake_bs, prod_incident, METADATA_KEY)
    assert prod_key != metadata_value(fake_bs, staging_incident, METADATA_KEY)
    assert read_installation(prod_conn) in prod_key[0]

    handle(prod_conn, prod_ids)
    resolved = prod_feed.run_once(server_now(prod_conn))
    assert resolved.incidents_resolved == 1
    assert fake_bs.incidents[prod_incident]["status"] == "Resolved"
    assert fake_bs.incidents[staging_incident]["status"] == "Started"  # staging's dead letters are still pending


def test_after_downgrade_base_and_migrate_old_incidents_are_never_adopted(db, database_url, conn, fake_bs):
    """Down to base and up again restarts the ids under a new identity: a retried POST for the new
    dead letters 1-2 posts a new incident instead of adopting the one of the database's earlier life."""
    ids = add_dead_letters(conn, "points.credit", 2)
    make_feed(db, fake_bs).run_once(server_now(conn))
    [old_incident] = list(fake_bs.incidents)
    old_identity = read_installation(conn)

    migrate.downgrade(database_url, "base")
    migrate.upgrade(database_url)
    assert add_dead_letters(conn, "points.credit", 2) == ids
    assert read_installation(conn) != old_identity
    fake_bs.fail_next("create", Fault(status=503))
    result = make_feed(db, fake_bs).run_once(server_now(conn))

    assert (result.incidents_posted, result.incidents_recovered, result.ok) == (1, 0, True)
    [new_incident] = [i for i in fake_bs.incidents if i != old_incident]
    assert alert_rows(conn)[0][2:4] == ("open", new_incident)


@pytest.fixture
def copy_database(pg_server_url: str) -> Iterator[Callable[[str], str]]:
    """Copies a database with ``CREATE DATABASE … TEMPLATE`` (nobody may be connected to it); dropped afterwards."""
    made: list[str] = []

    def copy(origin_url: str) -> str:
        name = f"core_jobs_copy_{os.getpid()}_{secrets.token_hex(4)}"
        made.append(name)
        return create_database(pg_server_url, name, template=urlsplit(origin_url).path.lstrip("/"))

    yield copy
    for name in made:
        drop_database(pg_server_url, name)


def test_a_template_copy_with_alerts_refuses_to_alert_until_an_operator_renews_it(
    database_url, copy_database, fake_bs, clean_env
):
    """A copy (CREATE DATABASE … TEMPLATE) of a database with an open incident sends Better Stack nothing — no
    post, lookup or resolve — and its run fails naming the copy, while the original keeps posting and resolving;
    after `alerts identity renew` the copy posts its own incidents under a new identity and never resolves the
    original's."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        ids = add_dead_letters(origin, "points.credit", 2)
    make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
    [origin_incident] = list(fake_bs.incidents)
    copy_url = copy_database(database_url)
    copy_db = Database(copy_url)

    with psycopg.connect(copy_url, autocommit=True) as copy:
        handle(copy, ids)  # the copy's own review would resolve the origin's incident
        add_dead_letters(copy, "points.credit", 1)
        sent_before = len(fake_bs.requests)
        with pytest.raises(IdentityUnconfirmed, match="copy"):
            make_feed(copy_db, fake_bs).run_once(copy_db.server_now())
        assert len(fake_bs.requests) == sent_before
        assert fake_bs.incidents[origin_incident]["status"] == "Started"

        with psycopg.connect(database_url, autocommit=True) as origin:
            add_dead_letters(origin, "points.expire", 1)
            posted = make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
            assert (posted.incidents_posted, posted.ok) == (1, True)
            origin_identity = read_installation(origin)

        clean_env.setenv("CORE_JOBS_DATABASE_URL", copy_url)
        assert cli_main(["alerts", "identity", "renew", "--reason", "staging restored from prod"]) == 0
        assert read_installation(copy) != origin_identity
        renewed = make_feed(copy_db, fake_bs).run_once(copy_db.server_now())
        assert (renewed.incidents_posted, renewed.incidents_resolved, renewed.ok) == (1, 0, True)
        assert fake_bs.incidents[origin_incident]["status"] == "Started"
        copy_identity = read_installation(copy)
        [copy_incident] = [
            i for i in fake_bs.incidents if metadata_value(fake_bs, i, INSTALLATION_METADATA_KEY) == [copy_identity]
        ]
        assert metadata_value(fake_bs, copy_incident, METADATA_KEY)[0].startswith(f"core-jobs:{copy_identity}:new:")
        assert alert_rows(copy)[1][2:5] == ("open", copy_incident, 1)
        assert alert_rows(copy)[0][2:4] == ("resolved", origin_incident)

    with psycopg.connect(database_url, autocommit=True) as origin:
        handle(origin, ids)
        assert make_feed(origin_db, fake_bs).run_once(origin_db.server_now()).incidents_resolved == 1
    assert fake_bs.incidents[origin_incident]["status"] == "Resolved"


def test_a_copy_that_never_alerted_takes_a_new_identity_by_itself(database_url, copy_database, fake_bs, logs):
    """A copy of a database that recorded no alert gets a new identity on its first run, bound to the copy and
    recorded as an automatic renew, and alerts; its origin keeps its own identity."""
    with psycopg.connect(database_url, autocommit=True) as origin:
        origin_identity = read_installation(origin)
    copy_url = copy_database(database_url)
    copy_db = Database(copy_url)
    with psycopg.connect(copy_url, autocommit=True) as copy:
        add_dead_letters(copy, "points.credit", 1)
        result = make_feed(copy_db, fake_bs).run_once(copy_db.server_now())
        assert (result.incidents_posted, result.ok) == (1, True)
        renewed = read_installation(copy)
        assert renewed != origin_identity
        assert read_identity(copy, configured=None).state == "bound_here"
        assert copy.execute(
            "SELECT previous_id::text, bound_how, bound_by FROM core.installation_history ORDER BY id DESC LIMIT 1"
        ).fetchone() == (origin_identity, "renewed", "core-jobs alerts (automatic)")
    assert '"event": "alerts.identity.renewed"' in logs.text
    with psycopg.connect(database_url, autocommit=True) as origin:
        assert read_installation(origin) == origin_identity


def test_a_moved_installation_adopted_by_an_operator_keeps_resolving_its_incidents(
    database_url, copy_database, fake_bs, clean_env, capsys
):
    """`alerts identity show` exits 1 naming the refusal; after `adopt` (the same installation, moved) the
    identity is kept and the moved database resolves the incident it opened before the move."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        ids = add_dead_letters(origin, "points.credit", 2)
        make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
        identity = read_installation(origin)
    [incident] = list(fake_bs.incidents)
    moved_url = copy_database(database_url)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", moved_url)

    assert cli_main(["alerts", "identity", "show"]) == 1
    assert "state     unconfirmed: the alert feed refuses to alert" in capsys.readouterr().out
    assert cli_main(["alerts", "identity", "adopt", "--reason", " "]) == 2
    assert cli_main(["alerts", "identity", "adopt", "--reason", "pg_upgrade to PostgreSQL 16"]) == 0
    assert cli_main(["alerts", "identity", "show"]) == 0
    assert "state     bound_here" in capsys.readouterr().out
    with psycopg.connect(moved_url, autocommit=True) as moved:
        assert read_installation(moved) == identity
        handle(moved, ids)
        moved_db = Database(moved_url)
        assert make_feed(moved_db, fake_bs).run_once(moved_db.server_now()).incidents_resolved == 1
    assert fake_bs.incidents[incident]["status"] == "Resolved"


def test_run_once_of_a_copy_with_alerts_exits_1_with_an_error_event_naming_both_places(
    database_url, copy_database, fake_bs, clean_env, capsys
):
    """`core-jobs run-once alerts` on an unconfirmed copy exits 1; its alerts.identity.unconfirmed event names the
    origin's and the copy's database, and alerts.feed.error says what to run."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        add_dead_letters(origin, "points.credit", 1)
    make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
    copy_url = copy_database(database_url)
    clean_env.setenv("CORE_JOBS_DATABASE_URL", copy_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_URL", fake_bs.url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", TOKEN)
    sent_before = len(fake_bs.requests)

    assert cli_main(["run-once", "alerts"]) == 1
    assert len(fake_bs.requests) == sent_before
    printed = capsys.readouterr().out
    [event] = events_in(printed, "alerts.identity.unconfirmed")
    assert (event["bound_database"], event["database"]) == (
        urlsplit(database_url).path.lstrip("/"),
        urlsplit(copy_url).path.lstrip("/"),
    )
    [error] = events_in(printed, "alerts.feed.error")
    assert "core-jobs alerts identity renew" in error["error"] and "adopt" in error["error"]


def test_a_renewed_copy_cancels_the_origins_pending_intents_and_pages_their_dead_letters_as_its_own(
    database_url, copy_database, fake_bs
):
    """An intent the origin left pending (Better Stack down) is cancelled 'inherited' by `renew`, never looked up or
    posted under the origin's key; the copy pages its dead letters under its own identity, once."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        add_dead_letters(origin, "points.credit", 2)
    fake_bs.fail_next("create", *[Fault(status=503)] * 4)
    assert make_feed(origin_db, fake_bs).run_once(origin_db.server_now()).post_failures == 1
    copy_url = copy_database(database_url)
    with psycopg.connect(copy_url, autocommit=True) as copy:
        origin_key = copy.execute("SELECT alert_key FROM core.dead_letter_alerts").fetchone()[0]
        done = rebind(
            copy, RENEWED, by="ops", reason="staging restored from prod", now=server_now(copy), environment=None
        )
        assert (done.cancelled_inherited, done.resolved_inherited) == (1, 0)
        copy_db = Database(copy_url)
        sent_before = len(fake_bs.requests)
        result = make_feed(copy_db, fake_bs).run_once(copy_db.server_now())
        assert (result.incidents_posted, result.dead_letters_alerted, result.ok) == (1, 2, True)
        assert copy.execute("SELECT state, cancel_reason FROM core.dead_letter_alerts ORDER BY id").fetchall() == [
            ("cancelled", "inherited"),
            ("open", None),
        ]
    [incident] = list(fake_bs.incidents)
    assert metadata_value(fake_bs, incident, INSTALLATION_METADATA_KEY) == [done.installation]
    assert not any(origin_key in str(r.args) or origin_key in str(r.body) for r in fake_bs.requests[sent_before:])


PRODUCTION = feed_settings(alerts_environment="production")
STAGING = feed_settings(alerts_environment="staging-eu")


def physical_copy(copy_database: Callable[[str], str], origin_url: str) -> str:
    """A copy that keeps its origin's identity *and* binding, as a base backup or a disk snapshot does: a TEMPLATE
    copy (its own oid) rebound to itself with the identity and the environment kept — from inside, the origin."""
    copy_url = copy_database(origin_url)
    with psycopg.connect(copy_url, autocommit=True) as copy:
        environment = read_identity(copy, configured=None).environment
        rebind(
            copy,
            ADOPTED,
            by="test",
            reason="what a physical copy looks like",
            now=server_now(copy),
            environment=environment,
        )
        assert read_identity(copy, configured=environment).state == "bound_here"
    return copy_url


def test_a_physical_copy_started_with_another_environment_refuses_to_alert_until_an_operator_renews_it(
    database_url, copy_database, fake_bs, clean_env
):
    """Production's physical copy (same identity, bound where it is, environment production) run with staging's
    configuration sends Better Stack nothing and fails; the original with production's keeps posting; after `alerts
    identity renew` (which records staging-eu) the copy posts under a new identity and leaves production's incident
    alone."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        ids = add_dead_letters(origin, "points.credit", 2)
    make_feed(origin_db, fake_bs, PRODUCTION).run_once(origin_db.server_now())
    [origin_incident] = list(fake_bs.incidents)
    copy_url = physical_copy(copy_database, database_url)
    copy_db = Database(copy_url)

    with psycopg.connect(copy_url, autocommit=True) as copy:
        handle(copy, ids)
        add_dead_letters(copy, "points.credit", 1)
        sent_before = len(fake_bs.requests)
        with pytest.raises(IdentityUnconfirmed, match="staging-eu"):
            make_feed(copy_db, fake_bs, STAGING).run_once(copy_db.server_now())
        assert len(fake_bs.requests) == sent_before
        assert fake_bs.incidents[origin_incident]["status"] == "Started"

        with psycopg.connect(database_url, autocommit=True) as origin:
            add_dead_letters(origin, "points.expire", 1)
            posted = make_feed(origin_db, fake_bs, PRODUCTION).run_once(origin_db.server_now())
            assert (posted.incidents_posted, posted.ok) == (1, True)
            origin_identity = read_installation(origin)

        clean_env.setenv("CORE_JOBS_DATABASE_URL", copy_url)
        clean_env.setenv("CORE_JOBS_ALERTS_ENVIRONMENT", "staging-eu")
        assert cli_main(["alerts", "identity", "renew", "--reason", "staging restored from a prod snapshot"]) == 0
        renewed_identity = read_identity(copy, configured="staging-eu")
        assert (renewed_identity.environment, renewed_identity.state) == ("staging-eu", "bound_here")
        assert renewed_identity.id != origin_identity
        renewed = make_feed(copy_db, fake_bs, STAGING).run_once(copy_db.server_now())
        assert (renewed.incidents_posted, renewed.incidents_resolved, renewed.ok) == (1, 0, True)
        [copy_incident] = [
            i
            for i in fake_bs.incidents
            if metadata_value(fake_bs, i, INSTALLATION_METADATA_KEY) == [renewed_identity.id]
        ]
        assert alert_rows(copy)[1][2:4] == ("open", copy_incident)
        assert alert_rows(copy)[0][2:4] == ("resolved", origin_incident)
    assert fake_bs.incidents[origin_incident]["status"] == "Started"
    with psycopg.connect(database_url, autocommit=True) as origin:
        handle(origin, ids)
        assert make_feed(origin_db, fake_bs, PRODUCTION).run_once(origin_db.server_now()).incidents_resolved == 1
    assert fake_bs.incidents[origin_incident]["status"] == "Resolved"


def test_run_once_under_another_environment_exits_1_with_an_error_event_naming_both_environments(
    database_url, fake_bs, clean_env, capsys
):
    """`core-jobs run-once alerts` on production's database configured as staging-eu (what a physical copy is)
    exits 1 without a request to Better Stack; alerts.identity.unconfirmed names both environments."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as origin:
        add_dead_letters(origin, "points.credit", 1)
    make_feed(origin_db, fake_bs, PRODUCTION).run_once(origin_db.server_now())
    clean_env.setenv("CORE_JOBS_DATABASE_URL", database_url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_URL", fake_bs.url)
    clean_env.setenv("CORE_JOBS_BETTERSTACK_API_TOKEN", TOKEN)
    clean_env.setenv("CORE_JOBS_ALERTS_ENVIRONMENT", "staging-eu")
    sent_before = len(fake_bs.requests)

    assert cli_main(["run-once", "alerts"]) == 1
    assert len(fake_bs.requests) == sent_before
    printed = capsys.readouterr().out
    [event] = events_in(printed, "alerts.identity.unconfirmed")
    assert (event["bound_environment"], event["environment"]) == ("production", "staging-eu")
    [error] = events_in(printed, "alerts.feed.error")
    assert "CORE_JOBS_ALERTS_ENVIRONMENT" in error["error"] and "renew" in error["error"]
    assert cli_main(["alerts", "identity", "show"]) == 1
    assert "unconfirmed" in capsys.readouterr().out


def test_an_installation_with_no_recorded_environment_records_the_first_one_and_keeps_alerting(
    database_url, fake_bs, logs
):
    """An installation that alerted before it declared an environment (the upgrade of an existing production)
    records the first one it is given — an automatic `declared` binding, a warning — and resolves its own incident
    in that same run; a later run with no environment configured then refuses."""
    origin_db = Database(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = add_dead_letters(conn, "points.credit", 1)
        make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
        [incident] = list(fake_bs.incidents)
        identity = read_installation(conn)
        handle(conn, ids)

        result = make_feed(origin_db, fake_bs, PRODUCTION).run_once(origin_db.server_now())

        assert (result.incidents_resolved, result.ok) == (1, True)
        assert fake_bs.incidents[incident]["status"] == "Resolved"
        assert read_installation(conn) == identity
        assert conn.execute(
            "SELECT installation_id::text, environment, bound_how, bound_by FROM core.installation_history"
            " ORDER BY id DESC LIMIT 1"
        ).fetchone() == (identity, "production", "declared", "core-jobs alerts (automatic)")
        [declared] = events_in(logs.text, "alerts.identity.declared")
        assert (declared["installation"], declared["environment"]) == (identity, "production")
        sent_before = len(fake_bs.requests)
        with pytest.raises(IdentityUnconfirmed, match="none"):
            make_feed(origin_db, fake_bs).run_once(origin_db.server_now())
        assert len(fake_bs.requests) == sent_before


def test_the_database_refuses_an_environment_changed_other_than_by_a_rebind_or_a_first_declaration(conn):
    """core.installation's environment changes only by adopt/renew, or from none by a `declared` binding that
    keeps the id and the place; a second declaration, a blank name or a bare UPDATE is refused."""
    rebind(conn, ADOPTED, by="test", reason="this test database bound here", now=server_now(conn), environment=None)
    declare = (
        "UPDATE core.installation SET environment = %s, bound_how = 'declared', bound_at = now(), bound_by = 'ops'"
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE core.installation SET environment = 'production'")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(declare, (" production",))
    conn.execute(declare, ("production",))
    with pytest.raises(psycopg.errors.CheckViolation, match="declared"):
        conn.execute(declare, ("staging-eu",))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE core.installation SET environment = NULL, bound_how = 'declared', bound_at = now()")
    assert conn.execute("SELECT environment FROM core.installation").fetchone() == ("production",)
