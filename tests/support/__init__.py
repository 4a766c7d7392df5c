"""What the tests share: factories, fixtures' modules, fakes, the consumers they load by name, crash-worker scripts.

Imported as ``support.<module>`` (pyproject's ``pythonpath = ["tests"]``); a consumer loaded by name is
``support.harness_consumers:blocking``, and a subprocess that loads one gets :data:`TESTS` on its PYTHONPATH.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
"""The tests' folder: the one on ``sys.path`` under which ``support`` imports."""

ROOT = TESTS.parent
"""The repository's root: the code, the docs, the chart, the Dockerfile."""
