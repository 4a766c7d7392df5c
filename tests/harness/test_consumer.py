"""Declaring a consumer and describing errors: pure logic (issue 6, point 1)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from harness.consumer.actions import Action, ActionError, Effect
from harness.consumer.consumer import Consumer, ConsumerError
from harness.consumer.retry import RetryPolicy
from harness.errors import describe_error

pytestmark = pytest.mark.pure


class Payload(BaseModel):
    n: int


def noop(conn, payload, ctx):
    return None


def test_a_consumer_without_a_policy_uses_its_queues_configured_one():
    """No retry_policy declared: policy(configured) is the configured policy (J-B3 defaults or the queue's override)."""
    configured = RetryPolicy(max_attempts=3)
    consumer = Consumer(name="points.credit", queue="points.credit", payload_schema=Payload, handler=noop)
    assert consumer.policy(configured) is configured


def test_a_policy_fixed_in_code_needs_a_justification():
    """J-B3: declaring a retry_policy without retry_justification is refused; with one, it wins."""
    fixed = RetryPolicy(max_attempts=8, base_delay=timedelta(seconds=10))
    with pytest.raises(ConsumerError, match="retry_justification"):
        Consumer(name="c", queue="q", payload_schema=Payload, handler=noop, retry_policy=fixed)
    consumer = Consumer(
        name="c",
        queue="q",
        payload_schema=Payload,
        handler=noop,
        retry_policy=fixed,
        retry_justification="the provider's outages last ~20 minutes",
    )
    assert consumer.policy(RetryPolicy()) is fixed


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("name", {"name": " "}),
        ("queue", {"queue": ""}),
        ("payload_schema", {"payload_schema": dict}),
        ("handler", {"handler": "not callable"}),
    ],
)
def test_an_invalid_declaration_names_the_field(field, kwargs):
    """Blank names, a schema that is not a pydantic model, or a non-callable handler are refused, naming the field."""
    values = {"name": "c", "queue": "q", "payload_schema": Payload, "handler": noop} | kwargs
    with pytest.raises(ConsumerError, match=field):
        Consumer(**values)


def _two(conn, payload):
    return None


def _keyword_only(conn, payload, *, ctx):
    return None


class _Handler:
    def __call__(self, conn, payload, ctx, extra=None):
        return None


@pytest.mark.parametrize("handler", [_two, _keyword_only, lambda: None, len])
def test_a_handler_that_cannot_take_conn_payload_ctx_is_refused_naming_the_consumer_and_its_signature(handler):
    """A handler the worker could never call is refused at declaration, not retried for minutes at every delivery."""
    with pytest.raises(
        ConsumerError, match=r"consumer c: handler .*\(.*\) cannot be called as handler\(conn, payload, ctx\)"
    ):
        Consumer(name="c", queue="q", payload_schema=Payload, handler=handler)


@pytest.mark.parametrize("handler", [noop, _Handler(), lambda *args: None, lambda conn, payload, ctx, **kw: None])
def test_a_handler_that_can_take_conn_payload_ctx_is_accepted(handler):
    assert Consumer(name="c", queue="q", payload_schema=Payload, handler=handler).handler is handler


def test_an_action_whose_call_cannot_take_payload_ctx_is_refused_naming_it():
    with pytest.raises(
        ActionError, match=r"action lookup: call .*<lambda>\(payload\) cannot be called as call\(payload, ctx\)"
    ):
        Action(name="lookup", effect=Effect.READ_ONLY, call=lambda payload: None)


def test_describe_error_escapes_nul_characters_postgresql_text_cannot_hold():
    """A NUL in an error message is written as the two characters \\0, so the retry or dead letter that stores it cannot fail."""
    assert describe_error(ValueError("body: ab\x00cd")) == "ValueError: body: ab\\0cd"


def test_describe_error_is_type_and_message_bounded():
    """'Type: message', just 'Type' without a message, and never longer than the bound."""
    assert describe_error(ValueError("bad points")) == "ValueError: bad points"
    assert describe_error(TimeoutError()) == "TimeoutError"
    long = describe_error(RuntimeError("y" * 5000), limit=100)
    assert len(long) == 100 and long.startswith("RuntimeError: yyy") and long.endswith("[truncated]")


class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("broken __str__")


class StrNotAString(Exception):
    def __str__(self):
        return 42


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (StrRaises("x"), "StrRaises: <message unprintable: RuntimeError: broken __str__>"),
        (StrNotAString("x"), "StrNotAString: <message unprintable: TypeError: __str__ returned non-string (type int)>"),
    ],
    ids=["str-raises", "str-returns-int"],
)
def test_describe_error_names_the_type_of_an_exception_that_cannot_be_printed(error, expected):
    """An exception whose __str__ raises or returns a non-string is described by its type and why it could not be printed."""
    assert describe_error(error) == expected


def test_describe_error_escapes_lone_surrogates_utf8_cannot_encode():
    """A lone surrogate (from bytes decoded with surrogateescape) is written as \\udcff, so the text encodes as UTF-8."""
    text = describe_error(ValueError("ledger said \udcff"))
    assert text == "ValueError: ledger said \\udcff"
    text.encode("utf-8")
