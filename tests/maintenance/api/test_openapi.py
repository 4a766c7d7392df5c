"""schemathesis against the operations API's own OpenAPI document (issue 11).

Every documented operation is called with generated requests — valid and invalid parameters
and bodies — authenticated with a token of every permission, over real HTTP against a real
PostgreSQL holding a few dead letters and executions (with checkpoints and history); and the
resolve operation of admin mode (issue 13) with an operator's token and a few executions. Each
response must be documented (status code, media type, schema) and none may be a server error. The number of examples is bounded
(``EXAMPLES`` per operation) so that the suite stays quick.

Two runs over every operation, each with schemathesis's examples, coverage and fuzzing phases:
**positive** (requests the document allows) and **negative** (requests it does not: wrong types,
missing and extra fields, out-of-range values — issue 17, item 7), both generating text of any
code point, lone surrogates and NUL included (``codec=None``, ``allow_x00``). No request content
may get a 5xx.

One check is left out: ``positive_data_acceptance`` (every schema-valid request gets 2xx or
404/409). The API rightly refuses some requests the schema cannot describe — an opaque cursor
it did not issue, a reason that is blank once trimmed, a NUL that PostgreSQL text cannot
hold — with a documented 400 or 422, which that check counts as a failure.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from support.factories import QUEUE, add_dead_letters, add_execution

EXAMPLES = 25


def _document(*, admin: bool = False) -> dict:
    """The app's OpenAPI document (it depends on the routes only, not on a database, keys or definitions)."""
    from psycopg_pool import ConnectionPool

    from maintenance.api.admin import AdminConfig
    from maintenance.api.app import create_app

    mode = AdminConfig(consumers={}, business_scopes=frozenset()) if admin else None
    return create_app(pool=ConnectionPool("", open=False), verifier=None, admin=mode).openapi()


def _schemas(mode: GenerationMode) -> tuple:
    """The document's operations and admin mode's resolve operation (issue 13), generating ``mode`` data only,
    its text of any code point (lone surrogates, NUL): what a client's JSON may carry."""
    pair = (
        schemathesis.openapi.from_dict(_document()),
        schemathesis.openapi.from_dict(_document(admin=True)).include(path_regex="/resolve$"),
    )
    for generated in pair:
        generated.config.generation.update(modes=[mode], codec=None, allow_x00=True)
    return pair


schema, admin_schema = _schemas(GenerationMode.POSITIVE)
negative_schema, negative_admin_schema = _schemas(GenerationMode.NEGATIVE)
PLACEHOLDER = "Bearer operator-token"  # cases are built at collection, before a token can be minted


@negative_admin_schema.auth()
@negative_schema.auth()
@admin_schema.auth()
@schema.auth()
class OperatorToken:
    """Schemathesis's auth for the bearer scheme: marks where the test puts the operator's real token."""

    def get(self, case, context):
        return PLACEHOLDER

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": data}


@pytest.fixture
def seeded_api(api, conn):
    """The running API with a few dead letters, pending, in two queues, and executions in every state; its token for OperatorToken."""
    add_dead_letters(conn, QUEUE, 5)
    add_dead_letters(conn, "q", 3)
    for status in ("PENDING", "RUNNING", "RETRY_WAIT", "FAILED", "RECONCILIATION_REQUIRED"):
        add_execution(
            conn,
            status=status,
            checkpoints=(
                ("lookup", "READ_ONLY", "SUCCEEDED", {"tier": "gold"}),
                ("notify", "NON_IDEMPOTENT_WRITE", "STARTED", None),
            ),
            events=(("RETRY_SCHEDULED", "lookup"),),
        )
    return api


@pytest.fixture
def seeded_admin_api(admin_api, conn):
    """The API in admin mode with executions awaiting resolution and one that is running."""
    for _ in range(3):
        add_execution(conn, checkpoints=(("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),))
    add_execution(conn, status="RUNNING")
    return admin_api


def call_and_validate(case, client) -> None:
    """Send ``case`` with the client's real token in place of the placeholder; schemathesis's checks."""
    if (case.headers or {}).get("Authorization") == PLACEHOLDER:  # not a case that tests a missing token
        case.headers["Authorization"] = client.headers["Authorization"]
    case.call_and_validate(
        base_url=str(client.base_url).rstrip("/"), excluded_checks=[schemathesis.checks.positive_data_acceptance]
    )


BOUNDED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@schema.parametrize()
@BOUNDED
def test_every_operation_answers_as_its_openapi_document_says(case, seeded_api):
    """Generated requests get documented statuses, media types and bodies, and never a 5xx."""
    call_and_validate(case, seeded_api)


@admin_schema.parametrize()
@BOUNDED
def test_the_resolve_operation_answers_as_its_openapi_document_says(case, seeded_admin_api):
    """In admin mode, generated resolutions get documented statuses, media types and bodies, and never a 5xx."""
    call_and_validate(case, seeded_admin_api)


@negative_schema.parametrize()
@BOUNDED
def test_every_operation_refuses_invalid_data_without_a_server_error(case, seeded_api):
    """Requests the document does not allow (any text, surrogates and NUL included) get documented 4xx, never a 5xx."""
    call_and_validate(case, seeded_api)


@negative_admin_schema.parametrize()
@BOUNDED
def test_the_resolve_operation_refuses_invalid_data_without_a_server_error(case, seeded_admin_api):
    """In admin mode, resolutions the document does not allow get documented 4xx, never a 5xx."""
    call_and_validate(case, seeded_admin_api)


def test_the_command_is_a_named_discriminated_union_without_a_target_state(admin_api):
    """ReconciliationCommand is in the document: RESUME or CLOSE_WITHOUT_TRANSITION, no field naming a state."""
    document = admin_api.get("/openapi.json").json()
    assert document["paths"]["/v1/core/executions/{id}/resolve"]["post"]["security"] == [{"bearer": []}]
    command = document["components"]["schemas"]["ReconciliationCommand"]
    assert command["discriminator"]["propertyName"] == "command"
    assert set(command["discriminator"]["mapping"]) == {"RESUME", "CLOSE_WITHOUT_TRANSITION"}
    for variant in ("ResumeCommand", "CloseCommand"):
        fields = document["components"]["schemas"][variant]
        assert not {"status", "target_status", "state"} & set(fields["properties"])
        assert fields["additionalProperties"] is False


def test_the_document_covers_every_endpoint_of_the_spec(api):
    """The OpenAPI lists the spec's paths, each /v1 operation secured by a bearer token."""
    document = api.get("/openapi.json").json()
    assert set(document["paths"]) == {
        "/v1/core/dead-letters",
        "/v1/core/dead-letters/{id}",
        "/v1/core/dead-letters/errors",
        "/v1/core/dead-letters/{id}/replay",
        "/v1/core/dead-letters/{id}/discard",
        "/v1/core/dead-letters/replay",
        "/v1/core/dead-letters/discard",
        "/v1/core/executions",
        "/v1/core/executions/{id}",
        "/healthz",
        "/readyz",
    }
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert (operation.get("security") == [{"bearer": []}]) == path.startswith("/v1/")


def test_every_generated_operation_test_has_a_node_id_of_its_own(request):
    """The collected tests' node ids are all different, so pytest-xdist (which goes by node id) runs each operation's."""
    ids = [item.nodeid for item in request.session.items]
    assert sorted({i for i in ids if ids.count(i) > 1}) == []
