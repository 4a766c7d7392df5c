"""Every installation has its own alert identity: keys and lookups never cross databases (issue 9, item 1).

Staging and prod share one Better Stack team and, being young databases, the same dead-letter
ids. Each test database of ``database_url`` is a copy of one migrated template (so they all
share that template's identity); ``prod_database_url`` is migrated on its own, as a second
installation is.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from alerts_support import alert_rows, handle, make_feed
from factories import add_dead_letters
from fake_betterstack import Fault

from alerts.feed import INSTALLATION_METADATA_KEY, METADATA_KEY, read_installation
from harness.pg import server_now
from maintenance.runtime import migrate
from maintenance.runtime.db import Database


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
    return [v["value"] for v in fake.incidents[incident_id]["metadata"].get(key, [])]


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
