"""The chart the helm tests render: its directory and the ``chart`` fixture (a pytest plugin loaded by conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import helm_python
import pytest

CHART_DIR = Path(__file__).resolve().parents[1] / "helm" / "core-jobs"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    """The chart in helm/core-jobs, loaded once per test module."""
    with helm_python.Chart.load(CHART_DIR) as loaded:
        yield loaded
