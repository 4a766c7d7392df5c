"""Import paths that moved keep working for one minor version, with a DeprecationWarning naming the new path."""

from __future__ import annotations

import importlib
import sys

import pytest

import harness.consumer
from harness.consumer import actions, consumer, retry

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("old", "new"),
    [("harness.actions", actions), ("harness.retry", retry)],
)
def test_a_moved_module_still_imports_and_warns_with_its_new_path(monkeypatch, old, new):
    """``import harness.actions`` (``harness.retry``) is the module at its new home, and says where that is."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated.*{new.__name__}"):
        module = importlib.import_module(old)
    assert module is new


@pytest.mark.parametrize("name", ["Consumer", "ConsumerError", "JobContext"])
def test_a_name_of_the_old_consumer_module_still_resolves_and_warns_with_its_new_path(name):
    """``from harness.consumer import Consumer`` is ``harness.Consumer``, with a warning naming where it now lives."""
    with pytest.warns(DeprecationWarning, match=rf"harness\.consumer\.{name} is deprecated.*harness\.{name}"):
        value = getattr(harness.consumer, name)
    assert value is getattr(consumer, name)


def test_an_unknown_name_of_the_consumer_package_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="Nope"):
        harness.consumer.Nope  # noqa: B018
