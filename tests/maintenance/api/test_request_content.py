"""No request content reaches a 500 (issue 17, item 7): JSON that UTF-8 or PostgreSQL cannot hold, over real HTTP.

A body is sent as raw bytes, so it can hold what a JSON library writes but Python's own
encoder refuses to produce from valid text: ``\\ud800`` escapes, ``NaN``, ``1e999``. Each of
these used to pass the models (a RESUME ``result`` is any JSON) and fail while the command was
fingerprinted or stored: a 500. The hypothesis fuzz sends resolution bodies built from any JSON
value, any text (lone surrogates included) and any number, and asserts only that none is a 5xx.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.api_support import assert_problem
from support.factories import add_dead_letters, add_execution

from maintenance.api.bodies import MAX_JSON_DEPTH

RESOLVE = "/v1/core/executions/{}/resolve"
EVIDENCE = '{"reference": "CASE-1", "reason": "checked at the provider"}'
UNCERTAIN_NOTIFY = (("notify", "NON_IDEMPOTENT_WRITE", "UNCERTAIN", None),)


def resume_with(result: str) -> bytes:
    """A RESUME body whose notify result is the raw JSON text ``result``."""
    return f'{{"command": "RESUME", "results": [{{"action": "notify", "result": {result}}}], "evidence": {EVIDENCE}}}'.encode()


def send(client, path: str, body: bytes, key: str = "key-1"):
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    return client.post(path, content=body, headers=headers)


@pytest.mark.parametrize(
    "result",
    [
        pytest.param('"\\ud800"', id="lone-surrogate-in-a-string"),
        pytest.param('{"\\udfff": 1}', id="lone-surrogate-in-a-key"),
        pytest.param('"a\\u0000b"', id="nul-in-a-string"),
        pytest.param('{"a\\u0000": 1}', id="nul-in-a-key"),
        pytest.param("NaN", id="nan"),
        pytest.param("-Infinity", id="infinity"),
        pytest.param("1e999", id="a-number-beyond-double"),
        pytest.param("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), id="nested-too-deep"),
    ],
)
def test_refuses_a_resolution_result_that_cannot_be_stored_with_422(admin_api, conn, result):
    """A RESUME result holding a lone surrogate, a NUL, NaN, an infinite number or nesting too deep is 422 invalid-request."""
    execution_id = add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)
    body = assert_problem(send(admin_api, RESOLVE.format(execution_id), resume_with(result)), 422, "invalid-request")
    assert body["errors"] and body["errors"][0]["location"][:2] == ["body", "results"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"reason": "dup", "\\ud800": 1}', id="lone-surrogate-as-an-unknown-field"),
        pytest.param(b'{"reason": "dup\\udc00"}', id="lone-surrogate-in-the-reason"),
        pytest.param(b'{"reason": NaN}', id="nan-as-the-reason"),
        pytest.param(b"[" * 100_000, id="nested-beyond-the-parser"),
        pytest.param(b'{"reason": 1' + b"0" * 5000 + b"}", id="an-integer-of-5000-digits"),
    ],
)
def test_refuses_a_hostile_dead_letter_body_with_4xx_problem(api, conn, body):
    """A discard body with a surrogate field name or value, NaN, nesting past the parser or a huge integer is a 4xx problem."""
    (letter,) = add_dead_letters(conn, "q", 1)
    response = send(api, f"/v1/core/dead-letters/{letter}/discard", body)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/problem+json"


# --- the fuzz -------------------------------------------------------------------------------------
# Text of any code point, lone surrogates and NUL often (hypothesis alone mostly pairs its surrogates);
# numbers of any size, NaN and the infinities often.
ANY_TEXT = st.text(st.sampled_from(["\ud800", "\udfff", "\x00"]) | st.characters(codec=None), max_size=12)
ANY_NUMBER = (
    st.sampled_from([math.nan, math.inf, -math.inf])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(10**40), max_value=10**40)
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | ANY_NUMBER | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
# Mostly valid evidence, so that most bodies get past it to the result.
EVIDENCE_FIELDS = st.fixed_dictionaries(
    {"reference": st.just("CASE-1") | ANY_TEXT, "reason": st.just("checked at the provider") | ANY_TEXT}
)
RESOLUTION_BODIES = st.one_of(
    st.fixed_dictionaries(
        {
            "command": st.just("RESUME"),
            "results": st.lists(
                st.fixed_dictionaries({"action": st.just("notify") | ANY_TEXT, "result": ANY_JSON}),
                min_size=1,
                max_size=3,
            ),
            "evidence": EVIDENCE_FIELDS,
        }
    ),
    st.fixed_dictionaries(
        {
            "command": st.sampled_from(["CLOSE_WITHOUT_TRANSITION", "RESUME"]) | ANY_TEXT,
            "evidence": EVIDENCE_FIELDS | ANY_JSON,
        },
        optional={"extra": ANY_JSON},
    ),
    ANY_JSON,
)


@pytest.fixture
def fuzzed_execution(admin_api, conn) -> int:
    """An execution awaiting resolution, its notify action uncertain."""
    return add_execution(conn, checkpoints=UNCERTAIN_NOTIFY)


@given(body=RESOLUTION_BODIES, key=st.integers(min_value=0, max_value=10**9))
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_resolution_body_gets_a_server_error(admin_api, fuzzed_execution, body, key):
    """Any JSON value as a resolution body — lone surrogates, NUL, NaN, infinities, huge numbers included — is never a 5xx."""
    raw = json.dumps(body, allow_nan=True).encode()  # ensure_ascii: a lone surrogate travels as a \\ud800 escape
    response = send(admin_api, RESOLVE.format(fuzzed_execution), raw, key=f"fuzz-{key}")
    assert response.status_code < 500, response.text
