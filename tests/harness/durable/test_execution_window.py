"""The TTL guard of a durable consumer (J-B7, issue 12): its execution window, and check-config --consumer."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from support.harness_consumers import durable_ledger

from harness.consumer.actions import ACTION_RETRY_POLICY
from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.durable.window import max_execution_window, max_takes
from harness.examples.points import consumer as points
from maintenance.cli import main
from maintenance.errors import EXIT_OK, EXIT_USAGE

QUEUE_POLICY = RetryPolicy()  # J-B3's defaults: 5 attempts, window 11 min 12 s
LEASE = timedelta(seconds=30)


@pytest.mark.pure
def test_execution_window_is_the_actions_windows_plus_the_final_write_plus_a_lease_per_take():
    """3 actions of 240 s each + the queue's 672 s + 14 takes x 30 s = 1 812 s."""
    assert max_retry_window(ACTION_RETRY_POLICY) == timedelta(seconds=240)
    assert max_retry_window(QUEUE_POLICY) == timedelta(seconds=672)
    assert max_takes(durable_ledger, QUEUE_POLICY) == 3 + 3 + 3 + 5
    assert max_execution_window(durable_ledger, QUEUE_POLICY, LEASE) == timedelta(seconds=3 * 240 + 672 + 14 * 30)


@pytest.mark.pure
def test_execution_window_grows_by_one_lease_per_possible_take():
    """A longer lease adds (lease difference) x the crash-loop bound, nothing else."""
    longer = max_execution_window(durable_ledger, QUEUE_POLICY, LEASE + timedelta(seconds=10))
    assert longer - max_execution_window(durable_ledger, QUEUE_POLICY, LEASE) == timedelta(seconds=10) * 14


@pytest.mark.pure
def test_an_action_with_more_attempts_lengthens_the_window_by_its_retries_and_takes():
    """An action allowed 4 attempts adds one more retry (at the 120 s Retry-After bound) and one more take."""
    patient = replace(
        durable_ledger.actions[1],
        retry_policy=replace(ACTION_RETRY_POLICY, max_attempts=4),
        retry_justification="test: one more attempt",
    )
    consumer = replace(durable_ledger, actions=(durable_ledger.actions[0], patient, durable_ledger.actions[2]))
    base = max_execution_window(durable_ledger, QUEUE_POLICY, LEASE)
    assert max_execution_window(consumer, QUEUE_POLICY, LEASE) - base == timedelta(seconds=120) + LEASE


@pytest.mark.pure
def test_a_consumer_without_actions_has_its_final_write_window_alone():
    """No actions, no take-overs: the window is the queue policy's retry window."""
    assert max_execution_window(points, QUEUE_POLICY, LEASE) == max_retry_window(QUEUE_POLICY)


@pytest.mark.pure
def test_the_final_write_uses_a_policy_fixed_in_the_consumer_over_the_queue_policy():
    """A consumer's own justified retry_policy replaces the queue's, in the window and in the take bound."""
    own = RetryPolicy(max_attempts=2)
    consumer = replace(durable_ledger, retry_policy=own, retry_justification="test")
    assert max_takes(consumer, QUEUE_POLICY) == 3 + 3 + 3 + 2
    assert (
        max_execution_window(consumer, QUEUE_POLICY, LEASE)
        == 3 * timedelta(seconds=240) + max_retry_window(own) + 11 * LEASE
    )


@pytest.mark.pure
def test_a_lease_that_is_not_positive_is_refused():
    """A zero lease is a configuration error named as such, not a window."""
    with pytest.raises(ValueError, match="lease must be positive"):
        max_execution_window(durable_ledger, QUEUE_POLICY, timedelta(0))


def test_check_config_fails_a_durable_consumer_whose_window_outlasts_the_ttl(clean_env, capsys):
    """With a 1 h TTL the settings' guard passes, but the durable consumer's 30 min 12 s x 2 does not: exit 2."""
    clean_env.setenv("CORE_JOBS_PROCESSED_JOBS_TTL", "PT1H")
    code = main(["check-config", "--consumer", "support.harness_consumers:durable_ledger"])
    out = capsys.readouterr().out
    assert code == EXIT_USAGE
    assert "max retry window PT11M12S = PT22M24S: ok" in out  # the settings' own guard
    assert "at most 14 takes x lease PT30S; execution window PT30M12S" in out
    assert "max retry window PT30M12S = PT1H24S: TOO SHORT" in out


def test_check_config_passes_each_consumer_whose_window_fits_the_ttl(clean_env, capsys):
    """With the default 7-day TTL both a durable and a plain consumer pass: exit 0, each line shown."""
    code = main(
        [
            "check-config",
            "--consumer",
            "support.harness_consumers:durable_ledger",
            "--consumer",
            "harness.examples.points:consumer",
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "points.credit.ledger (support.harness_consumers:durable_ledger): durable" in out
    assert "points.credit (harness.examples.points:consumer): no actions; retry window PT11M12S" in out
    assert out.count(": ok\n") == 3


def test_check_config_with_a_consumer_that_does_not_exist_is_a_configuration_error(clean_env, capsys):
    """An unknown module:object is exit 2 with a message naming it."""
    assert main(["check-config", "--consumer", "support.harness_consumers:nobody"]) == EXIT_USAGE
    assert "support.harness_consumers has no nobody" in capsys.readouterr().err
