"""How `--consumer module:object` finds its module: from the current directory too (as `python -m` and uvicorn do),
through the `core-jobs` console script; a module not found is one line saying where it was looked for, a module whose
own import fails one line saying what it could not import — exit 2 either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from maintenance.consumers import load_consumer
from maintenance.settings import ConfigError

CORE_JOBS = str(Path(sys.executable).with_name("core-jobs"))  # the console script: sys.path[0] is its bin folder

CREDIT_MEMBER = """\
from harness.consumer.consumer import Consumer
from harness.examples.points import CreditPoints
from harness.examples.points import consumer as points

consumer = Consumer(name="credit.member", queue="credit.member", payload_schema=CreditPoints, handler=points.handler)
"""


def core_jobs(folder: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_") and k != "PYTHONPATH"} | settings
    return subprocess.run(
        [CORE_JOBS, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def consumer_folder(tmp_path: Path) -> Path:
    (tmp_path / "credit_member.py").write_text(CREDIT_MEMBER, encoding="utf-8")
    return tmp_path


def test_check_config_finds_a_consumer_module_in_the_current_directory(consumer_folder):
    """From the module's own folder, `core-jobs check-config --consumer credit_member:consumer` loads it: exit 0."""
    done = core_jobs(consumer_folder, "check-config", "--consumer", "credit_member:consumer")
    assert done.returncode == 0, done.stderr
    assert "credit.member (credit_member:consumer)" in done.stdout


def test_a_worker_run_from_the_consumers_folder_finds_it_and_runs_it(consumer_folder, database_url):
    """`core-jobs worker --consumer credit_member:consumer --once`, run where credit_member.py is: exit 0."""
    done = core_jobs(
        consumer_folder, "worker", "--consumer", "credit_member:consumer", "--once", CORE_JOBS_DATABASE_URL=database_url
    )
    assert done.returncode == 0, done.stderr


def test_a_module_found_nowhere_is_one_line_saying_where_it_was_looked_for(tmp_path):
    """Run from a folder without it: exit 2, one line naming the module, the current directory and PYTHONPATH."""
    done = core_jobs(tmp_path, "check-config", "--consumer", "credit_member:consumer")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "cannot import credit_member: No module named 'credit_member'" in line
    assert f"current directory, {tmp_path}" in line and "PYTHONPATH" in line


def test_a_module_whose_own_import_fails_says_what_it_could_not_import(consumer_folder):
    """credit_member found, but it imports a package not installed: the line names that package and the module's line."""
    (consumer_folder / "credit_member.py").write_text("import ledger_client_not_installed\n" + CREDIT_MEMBER)
    done = core_jobs(consumer_folder, "check-config", "--consumer", "credit_member:consumer")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "No module named 'ledger_client_not_installed'" in line
    assert "credit_member was found" in line and "credit_member.py, line 1" in line


def test_the_lookup_leaves_sys_path_as_it_was(consumer_folder, monkeypatch):
    """In-process the current directory is on sys.path only while the consumer is looked up."""
    monkeypatch.chdir(consumer_folder)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(consumer_folder))])
    monkeypatch.delitem(sys.modules, "credit_member", raising=False)
    before = list(sys.path)
    try:
        assert load_consumer("credit_member:consumer").name == "credit.member"
    finally:
        sys.modules.pop("credit_member", None)
    assert sys.path == before
    with pytest.raises(ConfigError, match="current directory"):
        load_consumer("no_such_module_here:consumer")
    assert sys.path == before
