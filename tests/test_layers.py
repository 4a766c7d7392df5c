"""The layers hold: the harness imports nothing of the bundle, no module of the bundle imports the CLI, resources share only dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.pure


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (a function's lazy import too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def offenders(folder: str, forbidden: tuple[str, ...], *, besides: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(besides):
            continue
        found += [f"{where}: {m}" for m in sorted(imports_of(path)) if m.startswith(forbidden)]
    return found


def test_the_harness_imports_nothing_of_the_bundle():
    """No module of harness/ imports maintenance, alerts or migrations: a consumer service installs it alone."""
    assert offenders("harness", ("maintenance", "alerts", "migrations")) == []


def test_no_module_of_the_bundle_imports_the_cli():
    """Outside maintenance/cli/ (and the ``python -m`` entry point), nothing imports maintenance.cli: the API loads consumers from maintenance.consumers."""
    bundle = offenders("maintenance", ("maintenance.cli",), besides=("maintenance/cli/", "maintenance/__main__.py"))
    assert bundle + offenders("alerts", ("maintenance.cli",)) == []


def test_the_api_resources_import_no_sibling_resource():
    """Each resource of maintenance/api/resources/ takes what it shares from maintenance.api.dependencies, never from another resource."""
    found = []
    for path in sorted((ROOT / "maintenance/api/resources").glob("*.py")):
        own = f"maintenance.api.resources.{path.stem}"
        found += [
            f"{path.name}: {m}"
            for m in sorted(imports_of(path))
            if m.startswith("maintenance.api.resources.") and not m.startswith(own)
        ]
    assert found == []
