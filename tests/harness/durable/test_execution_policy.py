"""Seed 002's per-action retry policy (R-2) and the failure table of docs/durable-actions.md, as pure logic.

tests/harness/test_retry.py covers ``compute_delay`` on the queue defaults; these pin the action
defaults (``ACTION_RETRY_POLICY``) and what :func:`harness.durable.decide.decide` makes of each failure.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from support import ROOT

from harness.consumer.actions import ACTION_RETRY_POLICY, Action, ActionError, Effect
from harness.consumer.effects import RULES, EffectRules
from harness.consumer.retry import RetryPolicy, compute_delay, max_retry_window
from harness.durable.decide import Decision, OutputBroken, decide
from harness.errors import NotSent, PermanentError, TransientError

pytestmark = pytest.mark.pure

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = ACTION_RETRY_POLICY


def delay(retry_number: int, draw: float = 0.5, retry_after: object = None) -> timedelta:
    return compute_delay(POLICY, retry_number, retry_after=retry_after, now=NOW, random=lambda: draw)


def test_the_action_policy_is_three_attempts_from_2_s_doubling():
    """3 attempts in total (2 retries); nominal delays 2 s then 4 s; at most 60 s; Retry-After up to 120 s."""
    assert (POLICY.max_attempts, POLICY.max_retries) == (3, 2)
    assert [delay(1), delay(2)] == [timedelta(seconds=2), timedelta(seconds=4)]
    assert (POLICY.max_delay, POLICY.retry_after_cap) == (timedelta(seconds=60), timedelta(seconds=120))


@pytest.mark.parametrize(("retry_number", "low", "high"), [(1, 1.6, 2.4), (2, 3.2, 4.8)])
def test_the_jitter_stays_within_80_to_120_percent(retry_number, low, high):
    """The lowest draw gives 80 %, the highest 120 %, and every draw between lies between."""
    assert delay(retry_number, 0.0) == timedelta(seconds=low)
    assert delay(retry_number, 1.0) == timedelta(seconds=high)
    for draw in (0.1, 0.37, 0.5, 0.99):
        assert timedelta(seconds=low) <= delay(retry_number, draw) <= timedelta(seconds=high)


@pytest.mark.parametrize(
    ("retry_after", "expected_s"),
    [
        ("7", 7),  # seconds, larger than the 2 s backoff
        ("1", 2),  # seconds, smaller: the backoff wins
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30),  # an HTTP-date, on the given clock
        (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 2),  # a date in the past: no wait, backoff
        ("-5", 2),  # negative: ignored
        ("NaN", 2),  # not a number: ignored
        ("soon", 2),  # garbage: ignored
        ("", 2),
        ("600", 120),  # over 120 s: bounded
        (format_datetime(NOW + timedelta(hours=1), usegmt=True), 120),
    ],
)
def test_retry_after_of_an_action_is_honoured_bounded_or_ignored(retry_after, expected_s):
    """The larger of the jittered backoff (2 s at the midpoint) and a valid Retry-After bounded to 120 s."""
    assert delay(1, retry_after=retry_after) == timedelta(seconds=expected_s)


def test_the_longest_retry_window_of_an_action_is_two_capped_retry_afters():
    """Worst case: each of the 2 retries waits the 120 s Retry-After bound (the TTL guard's input)."""
    assert max_retry_window(POLICY) == timedelta(seconds=240)


def test_another_action_policy_needs_a_justification():
    """An action with its own policy and no retry_justification is refused, naming the action (R-2, like J-B3)."""
    with pytest.raises(ActionError, match="lookup"):
        Action(name="lookup", effect=Effect.READ_ONLY, call=lambda p, c: None, retry_policy=RetryPolicy())
    justified = Action(
        name="lookup",
        effect=Effect.READ_ONLY,
        call=lambda p, c: None,
        retry_policy=RetryPolicy(max_attempts=5),
        retry_justification="the directory is flaky at night; 5 attempts measured enough",
    )
    assert justified.policy.max_attempts == 5


READ, IDEM, NON = Effect.READ_ONLY, Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE
RETRY, RECONCILE = Decision("retry"), Decision("reconcile")
PERMANENT, EXHAUSTED = Decision("failed", "permanent"), Decision("failed", "exhausted")


@pytest.mark.parametrize(
    ("effect", "error", "attempt", "expected"),
    [
        (READ, TransientError("503"), 1, RETRY),
        (READ, RuntimeError("unclassified"), 2, RETRY),
        (READ, TransientError("503"), 3, EXHAUSTED),
        (READ, PermanentError("404"), 1, PERMANENT),
        (READ, OutputBroken("bad body"), 1, PERMANENT),
        (IDEM, TransientError("timeout"), 1, RETRY),
        (IDEM, TransientError("timeout"), 3, RECONCILE),
        (IDEM, NotSent("refused"), 3, RECONCILE),  # an earlier attempt may have been sent
        (IDEM, PermanentError("409"), 2, PERMANENT),
        (IDEM, OutputBroken("bad body"), 1, RECONCILE),
        (NON, TransientError("timeout"), 1, RECONCILE),
        (NON, RuntimeError("unclassified"), 1, RECONCILE),
        (NON, NotSent("refused"), 1, RETRY),
        (NON, NotSent("refused"), 3, EXHAUSTED),  # every attempt proven unsent
        (NON, PermanentError("409"), 1, PERMANENT),
        (NON, OutputBroken("bad body"), 1, RECONCILE),
        (None, TransientError("deadlock"), 1, RETRY),  # the final local write, on the queue policy
        (None, TransientError("deadlock"), 3, EXHAUSTED),
        (None, PermanentError("bad data"), 1, PERMANENT),
    ],
)
def test_each_failure_goes_where_the_contract_table_says(effect, error, attempt, expected):
    """docs/durable-actions.md's table, with 3 attempts allowed."""
    assert decide(effect, error, attempt, 3) == expected


# How docs/durable-actions.md words each value of a rule, in its table "Effect classes: one table of rules".
_WORDS = {
    True: "yes",
    False: "no",
    "failed": "`FAILED`",
    "reconcile": "`RECONCILIATION_REQUIRED`",
    "none": "no",
    "autocommit": "one autocommit statement",
    "transaction": "an explicit transaction (only a live worker commits it)",
    "retry": "re-send with its key while attempts remain",
}


def test_the_manual_states_each_effect_class_rule_the_executor_consults():
    """docs/durable-actions.md's rules table has one row per rule of EffectRules and says in each cell what RULES holds."""
    manual = (ROOT / "docs" / "durable-actions.md").read_text(encoding="utf-8")
    rows = {}
    for line in manual.split("## Effect classes: one table of rules", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].split("`")[1]] = cells[1:4]
    assert set(rows) == {f.name for f in fields(EffectRules)}
    for rule, cells in rows.items():
        for effect, cell in zip(Effect, cells, strict=True):
            value = getattr(RULES[effect], rule)
            expected = "—" if rule == "lost_while_started" and RULES[effect].started == "none" else _WORDS[value]
            assert cell == expected, f"{rule} of {effect}"
