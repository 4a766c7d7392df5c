"""Admin mode's start-up checks (issue 13): the published definitions and a restricted database session, or exit 2."""

from __future__ import annotations

import pytest
from api_support import admin_settings

from maintenance.api.server import build_app
from maintenance.settings import ConfigError


def test_admin_mode_refuses_a_superuser_session(database_url, jwks):
    """Without SET ROLE the test's login is a superuser: admin mode refuses to start, naming the problem."""
    settings = admin_settings(database_url, jwks.url, api_database_role="")
    with pytest.raises(ConfigError, match=r"superuser .*restricted role core_jobs_api"):
        build_app(settings)


def test_admin_mode_starts_as_the_restricted_api_role(database_url, jwks):
    """With SET ROLE core_jobs_api (the default) the session is restricted and the resolve route exists."""
    app = build_app(admin_settings(database_url, jwks.url))
    assert "/v1/core/executions/{id}/resolve" in app.openapi()["paths"]


@pytest.mark.parametrize(
    "consumers, problem",
    [
        (["resolution_consumers:missing"], "CORE_JOBS_ADMIN_CONSUMERS entry 'resolution_consumers:missing'"),
        (["no_such_module_here:consumer"], "cannot import no_such_module_here"),
        (["resolution_consumers:plain"], "declares no actions"),
        (["resolution_consumers:ledger_points", "resolution_consumers:ledger_points"], "a second definition"),
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
