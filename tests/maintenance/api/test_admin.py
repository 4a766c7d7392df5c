"""Admin mode's start-up checks (issue 13): the published definitions and a restricted database session, or exit 2."""

from __future__ import annotations

import pytest
from support.api_support import admin_settings

from maintenance.api.server import build_app
from maintenance.settings import ConfigError


def test_admin_mode_refuses_a_superuser_session(database_url, jwks):
    """Without SET ROLE the test's login is a superuser: admin mode refuses to start, naming the problem."""
    settings = admin_settings(database_url, jwks.url, api_database_role="")
    with pytest.raises(ConfigError, match=r"login postgres is a superuser.*restricted role core_jobs_api"):
        build_app(settings)


def test_admin_mode_starts_as_the_restricted_api_role(restricted_login_url, jwks):
    """A login granted only core_jobs_api, with SET ROLE core_jobs_api (the default): the resolve route exists."""
    app = build_app(admin_settings(restricted_login_url, jwks.url))
    assert "/v1/core/executions/{id}/resolve" in app.openapi()["paths"]


def test_admin_mode_refuses_a_superuser_login_that_sets_the_api_role(database_url, jwks):
    """The test's superuser login with SET ROLE core_jobs_api could RESET ROLE at will: refused, naming the login."""
    with pytest.raises(ConfigError, match=r"login postgres is a superuser"):
        build_app(admin_settings(database_url, jwks.url))


@pytest.mark.parametrize(
    "options, problem",
    [
        ("CREATEROLE IN ROLE core_jobs_api", r"may CREATEROLE"),
        ("BYPASSRLS REPLICATION IN ROLE core_jobs_api", r"may BYPASSRLS, REPLICATION"),
        ("IN ROLE core_jobs_api, pg_write_all_data", r"is a member of pg_write_all_data"),
        ("IN ROLE core_jobs_api, {owner}", r"is a member of pg_database_owner, postgres"),
        ("NOINHERIT IN ROLE core_jobs_api, pg_read_all_data", r"is a member of pg_read_all_data"),
    ],
    ids=["createrole", "bypassrls-replication", "write-all-data", "owner-role", "not-inherited-member"],
)
def test_admin_mode_refuses_a_login_that_holds_more_than_the_api_role(login_role, jwks, options, problem):
    """A login with a role attribute or a membership (inherited or only SET ROLE-able) beyond core_jobs_api: refused."""
    url = login_role(options.format(owner="postgres"))
    with pytest.raises(ConfigError, match=rf"CORE_JOBS_ADMIN_ENABLED: the API's login core_jobs_login_\w+ {problem}"):
        build_app(admin_settings(url, jwks.url))


def test_admin_mode_refuses_a_login_granted_more_of_schema_core(login_role, database_url, jwks):
    """A login granted DELETE on core.dead_letters itself (not through the API role) holds more: refused."""
    import psycopg

    url = login_role("IN ROLE core_jobs_api")
    with psycopg.connect(database_url, autocommit=True) as conn:
        login = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'core_jobs_login_%' ORDER BY oid DESC")
        conn.execute(f"GRANT DELETE ON core.dead_letters TO {login.fetchone()[0]}")
    with pytest.raises(ConfigError, match=r"holds DELETE on core.dead_letters"):
        build_app(admin_settings(url, jwks.url))


def test_the_api_command_exits_2_on_a_superuser_login_in_admin_mode(clean_env, database_url, jwks, capsys):
    """`core-jobs api` in admin mode with the superuser login exits 2 (configuration error) before serving."""
    from support.api_support import AUDIENCE, ISSUER, PUBLISHED_CONSUMERS, SERVED_SCOPES

    from maintenance.cli import main

    for name, value in {
        "DATABASE_URL": database_url,
        "API_JWKS_URL": jwks.url,
        "API_JWT_ISSUER": ISSUER,
        "API_JWT_AUDIENCE": AUDIENCE,
        "ADMIN_ENABLED": "true",
        "ADMIN_CONSUMERS": ",".join(PUBLISHED_CONSUMERS),
        "ADMIN_BUSINESS_SCOPES": ",".join(SERVED_SCOPES),
    }.items():
        clean_env.setenv(f"CORE_JOBS_{name}", value)
    assert main(["api"]) == 2
    assert "login postgres is a superuser" in capsys.readouterr().err


@pytest.mark.parametrize(
    "consumers, problem",
    [
        (
            ["support.resolution_consumers:missing"],
            "CORE_JOBS_ADMIN_CONSUMERS entry 'support.resolution_consumers:missing'",
        ),
        (["no_such_module_here:consumer"], "cannot import no_such_module_here"),
        (["support.resolution_consumers:plain"], "declares no actions"),
        (
            ["support.resolution_consumers:ledger_points", "support.resolution_consumers:ledger_points"],
            "a second definition",
        ),
    ],
    ids=["no-attribute", "no-module", "not-durable", "twice"],
)
def test_a_published_definition_that_cannot_be_used_stops_the_start(database_url, jwks, consumers, problem):
    """Each unusable CORE_JOBS_ADMIN_CONSUMERS entry is a configuration error naming the entry."""
    with pytest.raises(ConfigError, match=problem):
        build_app(admin_settings(database_url, jwks.url, admin_consumers=consumers))


@pytest.mark.parametrize("missing", ["admin_consumers", "admin_business_scopes"])
def test_admin_mode_needs_definitions_and_scopes(database_url, jwks, missing):
    """Admin mode without published consumers or served scopes is a configuration error naming the variable."""
    with pytest.raises(ConfigError, match=f"CORE_JOBS_{missing.upper()}"):
        build_app(admin_settings(database_url, jwks.url, **{missing: []}))


@pytest.mark.pure
@pytest.mark.parametrize(
    "variable, value",
    [("CORE_JOBS_ADMIN_CONSUMERS", "not a reference"), ("CORE_JOBS_ADMIN_BUSINESS_SCOPES", "loyalty, two words")],
)
def test_malformed_admin_entries_are_refused_at_load(clean_env, variable, value):
    """An entry that is not module:attribute, or a scope that is not a name, fails when the settings load."""
    from maintenance.settings import load_settings

    clean_env.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings()
