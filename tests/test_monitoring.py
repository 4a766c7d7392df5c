"""The alert rules and the dashboard the chart ships (helm/core-jobs/monitoring/) are valid and
query only what core-jobs exports.

The rules go through Prometheus's own tooling: ``promtool check rules`` and ``promtool test
rules`` on the unit tests next to them (Debian's ``prometheus`` package; .ci/run installs it, a
machine without it skips those two with the reason). Every alert links a section of
docs/runbook.md. No database.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_docs import anchors

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "helm" / "core-jobs" / "monitoring"
RULES = MONITORING / "core-jobs.rules.yaml"
RULE_TESTS = MONITORING / "core-jobs.rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run installs it)"
)


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120, check=False)


@needs_promtool
def test_promtool_check_rules_accepts_the_rules_file():
    """`promtool check rules` finds the rules file valid."""
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_of_every_alert_pass():
    """`promtool test rules` passes the unit tests, which show each alert both firing and silent."""
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tested for case in test.get("alert_rule_test", [])]
    for rule in alert_rules():
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == rule["alert"]}
        assert outcomes == {True, False}, f"{rule['alert']} is not tested both firing and silent"


@pytest.mark.pure
def test_every_alert_has_a_runbook_url_to_a_runbook_section():
    """Each alert's runbook_url is docs/runbook.md#<a heading of docs/runbook.md>, and it names a severity."""
    sections = anchors(RUNBOOK.read_text())
    for rule in alert_rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbook.md", rule["alert"]
        assert anchor in sections, f"{rule['alert']}: no heading #{anchor} in docs/runbook.md"
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
