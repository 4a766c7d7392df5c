"""The CLI's names from before one module per command group keep working for one minor version, each with a
DeprecationWarning naming its new home; nothing of ours uses them."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

import maintenance.cli
from maintenance import errors
from maintenance.cli import common, config, dead_letters, demo, enqueue, jobs, schema, worker

pytestmark = pytest.mark.pure

MOVED_FROM_THE_PACKAGE = {
    "EXIT_OK": errors.EXIT_OK,
    "EXIT_JOB_FAILED": errors.EXIT_FAILED,
    "EXIT_CONFIG": errors.EXIT_USAGE,
    "after_run_hooks": jobs.after_run_hooks,
    "cmd_migrate": schema.cmd_migrate,
    "cmd_check_config": config.cmd_check_config,
    "cmd_run_once": jobs.cmd_run_once,
    "cmd_demo": demo.cmd_demo,
    "SHOWN_DELAYS": config.SHOWN_DELAYS,
}


@pytest.mark.parametrize(("name", "new"), MOVED_FROM_THE_PACKAGE.items(), ids=list(MOVED_FROM_THE_PACKAGE))
def test_a_name_moved_out_of_the_cli_package_is_the_same_object_and_warns_with_its_home(name, new):
    with pytest.warns(DeprecationWarning, match=rf"maintenance\.cli\.{name} is deprecated.*: use maintenance\."):
        assert getattr(maintenance.cli, name) is new


def test_an_unknown_name_of_the_cli_package_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        maintenance.cli.no_such_name  # noqa: B018


def test_the_split_harness_module_warns_and_hands_out_the_very_same_objects(monkeypatch):
    monkeypatch.delitem(sys.modules, "maintenance.cli.harness", raising=False)
    with pytest.warns(DeprecationWarning, match=r"maintenance\.cli\.harness is deprecated.*maintenance\.cli\.worker"):
        old = importlib.import_module("maintenance.cli.harness")
    assert old.consumer_references is common.consumer_references
    assert old.add_limit_option is common.add_limit_option
    assert old.cmd_worker is worker.cmd_worker and old.broker_failure is worker.broker_failure
    assert old.cmd_enqueue is enqueue.cmd_enqueue
    assert old.cmd_dead_letters_replay is dead_letters.cmd_dead_letters_replay
    assert (old.EXIT_OK, old.EXIT_FAILED, old.EXIT_USAGE) == (errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_USAGE)


# `from maintenance.cli import <a moved name>` or the old module's path, anywhere but in the shims and this test.
OLD_USE = re.compile(
    r"maintenance\.cli\.harness|from maintenance\.cli import [^\n]*\b(?:"
    + "|".join(maintenance.cli._MOVED)
    + r")\b|maintenance\.cli\.(?:"
    + "|".join(maintenance.cli._MOVED)
    + r")\b"
)


def test_nothing_of_ours_uses_a_moved_cli_name():
    from support import ROOT

    offenders = []
    for package in ("maintenance", "alerts", "harness", "tests", "bench", "demo", "tools", "docs"):
        for path in (ROOT / package).rglob("*.py" if package != "docs" else "*.md"):
            relative = path.relative_to(ROOT).as_posix()
            if ".venv" in path.parts or relative in (
                "maintenance/cli/harness.py",
                "tests/maintenance/cli/test_moved_names.py",
            ):
                continue
            offenders += [f"{relative}: {m.group(0)}" for m in OLD_USE.finditer(path.read_text())]
    assert offenders == []
