"""The harness's public surface: one façade, ``harness``, whose ``__all__`` is what a consumer service imports."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

import harness

OPERATOR_SIDE = ("operations", "execution_views", "reconciliation", "keyset", "credentials")

pytestmark = pytest.mark.pure


def test_every_public_name_is_the_object_its_home_module_defines():
    """Each name of ``harness.__all__`` resolves, and is the very object of the submodule that defines it."""
    for name in harness.__all__:
        value = getattr(harness, name)
        home = importlib.import_module(harness._HOMES[name])
        assert getattr(home, name) is value, name
    assert set(harness._HOMES) == set(harness.__all__)


def test_the_type_checkers_view_of_the_facade_names_the_same_homes():
    """The TYPE_CHECKING imports of harness/__init__.py (what mypy and an editor read) import each public name from
    its home in ``_HOMES`` (what runs), and nothing else."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(harness))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    imported = {
        alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert imported == harness._HOMES


def test_the_facade_exports_the_consumer_runtime_the_queue_durable_actions_and_the_errors():
    """The façade names what the examples and docs/harness.md use: the declaration, the worker, the queue and its
    choice from a URL, actions, errors."""
    assert {
        "Consumer",
        "JobContext",
        "Worker",
        "WorkerConfig",
        "RetryPolicy",
        "Action",
        "Effect",
        "QueuePort",
        "PgQueue",
        "open_queue",
        "TransientError",
        "NotSent",
        "PermanentError",
        "PoisonMessage",
    } <= set(harness.__all__)


def test_an_unknown_name_is_an_attribute_error():
    """A name the façade does not export raises AttributeError, as any module's would."""
    try:
        harness.Nope  # noqa: B018
    except AttributeError as exc:
        assert "Nope" in str(exc)
    else:
        raise AssertionError("harness.Nope resolved")


def test_the_harness_holds_no_operator_side_module():
    """No module of harness/ is the operator's (dead-letter actions, execution views, resolution, paging): the bundle's."""
    modules = [m.name for m in pkgutil.walk_packages(harness.__path__, "harness.")]
    assert not [m for m in modules if m.rsplit(".", 1)[-1] in OPERATOR_SIDE]


def test_importing_the_facade_or_the_enumerations_loads_no_psycopg():
    """``import harness`` and ``import harness.enumerations`` (the CLI's parser) leave psycopg unimported: the façade is lazy."""
    code = "import json, sys, harness, harness.enumerations; print(json.dumps('psycopg' in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) is False
