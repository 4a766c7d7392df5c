"""The servers the tests start themselves: a developer without their binaries is skipped, CI (required) fails."""

from __future__ import annotations

import pytest
from support import ROOT
from support.failover import rig_bin_dir
from support.rigs import REQUIRE_VARIABLE

pytestmark = pytest.mark.pure


@pytest.fixture
def without_pg_basebackup(tmp_path):
    """A directory with initdb and pg_ctl but no pg_basebackup: a server package without its client tools."""
    for name in ("initdb", "pg_ctl"):
        (tmp_path / name).touch()
    return tmp_path


def test_a_missing_pg_basebackup_skips_the_failover_rig_for_a_developer(without_pg_basebackup, monkeypatch):
    monkeypatch.delenv(REQUIRE_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="pg_basebackup"):
        rig_bin_dir(without_pg_basebackup)


def test_a_missing_pg_basebackup_fails_the_failover_rig_when_required(without_pg_basebackup, monkeypatch):
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match=f"pg_basebackup.*{REQUIRE_VARIABLE}=1"):
        rig_bin_dir(without_pg_basebackup)


def test_no_postgresql_binaries_at_all_fail_the_failover_rig_when_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match="initdb, pg_ctl and pg_basebackup"):
        rig_bin_dir(None)


def test_ci_requires_the_rigs():
    """.ci/run exports CORE_JOBS_REQUIRE_CLUSTERS=1: a rig that cannot start there is a failure, never a green skip."""
    assert f"export {REQUIRE_VARIABLE}=1" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
