"""schemathesis against the resolve operation of the API in admin mode (issue 13).

The same checks as tests/test_api_openapi.py (documented statuses, media types and bodies,
never a 5xx), for the operation that exists only in admin mode, with an operator's token and a
few executions awaiting resolution (ids 1-3) and one that is not.
"""

from __future__ import annotations

import pytest
import schemathesis
from factories import add_execution
from hypothesis import HealthCheck, settings

EXAMPLES = 40
UNCERTAIN = (("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),)


def _document() -> dict:
    """The admin-mode app's OpenAPI document (routes only: no database, keys or definitions needed)."""
    from psycopg_pool import ConnectionPool

    from maintenance.api.admin import AdminConfig
    from maintenance.api.app import create_app

    admin = AdminConfig(consumers={}, business_scopes=frozenset())
    return create_app(pool=ConnectionPool("", open=False), verifier=None, admin=admin).openapi()


schema = schemathesis.openapi.from_dict(_document()).include(path_regex="/executions/")
PLACEHOLDER = "Bearer operator-token"


@schema.auth()
class OperatorToken:
    """Marks where the test puts the operator's real token."""

    def get(self, case, context):
        return PLACEHOLDER

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": data}


@pytest.fixture
def seeded_admin_api(admin_api, conn):
    """The API in admin mode with executions awaiting resolution and one that is running."""
    for _ in range(3):
        add_execution(conn, checkpoints=UNCERTAIN)
    add_execution(conn, status="RUNNING")
    return admin_api


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_the_resolve_operation_answers_as_its_openapi_document_says(case, seeded_admin_api):
    """Generated resolutions get documented statuses, media types and bodies, and never a 5xx."""
    if (case.headers or {}).get("Authorization") == PLACEHOLDER:
        case.headers["Authorization"] = seeded_admin_api.headers["Authorization"]
    case.call_and_validate(
        base_url=str(seeded_admin_api.base_url).rstrip("/"),
        excluded_checks=[schemathesis.checks.positive_data_acceptance],
    )


def test_the_command_is_a_named_discriminated_union_without_a_target_state(admin_api):
    """ReconciliationCommand is in the document: RESUME or CLOSE_WITHOUT_TRANSITION, no field naming a state."""
    document = admin_api.get("/openapi.json").json()
    operation = document["paths"]["/v1/core/executions/{id}/resolve"]["post"]
    assert operation["security"] == [{"bearer": []}]
    command = document["components"]["schemas"]["ReconciliationCommand"]
    assert command["discriminator"]["propertyName"] == "command"
    assert set(command["discriminator"]["mapping"]) == {"RESUME", "CLOSE_WITHOUT_TRANSITION"}
    for variant in ("ResumeCommand", "CloseCommand"):
        fields = document["components"]["schemas"][variant]["properties"]
        assert not {"status", "target_status", "state"} & set(fields)
        assert document["components"]["schemas"][variant]["additionalProperties"] is False
