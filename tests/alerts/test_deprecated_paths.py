"""The alerting side's old import paths (before it became the top-level package ``alerts``) keep working for one
minor version, each with a DeprecationWarning naming its new home."""

from __future__ import annotations

import importlib
import sys

import pytest

pytestmark = pytest.mark.pure

MOVED = {
    "maintenance.jobs.alerts.job": "alerts.feed",
    "maintenance.jobs.alerts.settings": "alerts.settings",
    "maintenance.jobs.alerts.identity": "alerts.identity",
    "maintenance.jobs.alerts.incidents": "alerts.incidents",
    "maintenance.jobs.alerts.groups": "alerts.incidents",
    "maintenance.jobs.alerts.sources": "alerts.sources",
    "maintenance.jobs.alerts.sql": "alerts.sql",
    "maintenance.jobs.alerts.execution_sql": "alerts.sql",
    "maintenance.integrations.betterstack.client": "alerts.betterstack",
    "maintenance.integrations.betterstack.heartbeat": "alerts.heartbeat",
    "maintenance.cli.alerts": "alerts.cli",
    "alerts.groups": "alerts.incidents",  # folded in: one planning module
    "alerts.execution_sql": "alerts.sql",  # folded in: one SQL module, one section per source
}


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_a_moved_module_still_imports_as_its_new_home_and_warns_with_the_new_path(monkeypatch, old, new):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated.*import {new}$"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_nothing_of_the_bundle_imports_a_deprecated_path():
    """The shims are for code outside: no module of ours (nor a test but this one) names an old path."""
    from support import ROOT

    old_dotted = (*MOVED, "maintenance.integrations")
    offenders = []
    for package in ("maintenance", "alerts", "harness", "migrations", "tests", "bench", "demo"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "test_deprecated_paths.py" or ".venv" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            if relative.parts[:2] in (("maintenance", "integrations"),) or relative.parts[:3] == (
                "maintenance",
                "jobs",
                "alerts",
            ):
                continue  # the shims themselves
            if relative.as_posix() in ("maintenance/cli/alerts.py", "alerts/groups.py", "alerts/execution_sql.py"):
                continue
            text = path.read_text()
            offenders += [f"{relative}: {old}" for old in old_dotted if old in text]
    assert offenders == []
