"""The chart the helm tests render: its directory and the ``chart`` fixture (a pytest plugin loaded by conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python
import pytest

from support import ROOT

CHART_DIR = ROOT / "helm" / "core-jobs"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    """The chart in helm/core-jobs, loaded once per test module."""
    with helm_python.Chart.load(CHART_DIR) as loaded:
        yield loaded
