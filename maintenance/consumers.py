"""Loading a consumer a command or a deployment names (``package.module:object``), in one place.

The CLI (``core-jobs worker --consumer``, ``check-config --consumer``) and the API's admin mode
(``CORE_JOBS_ADMIN_CONSUMERS``) load consumers the same way, with the same refusals: whatever goes
wrong in the user's module is one ConfigError line naming the file and line of their code, never
a traceback (docs/cli.md). :func:`consumer_ttl_guard` is one consumer's fence-TTL guard (J-B7),
which the worker checks before it starts and ``check-config`` reports.

A consumer's module is found as ``python -m`` and uvicorn find an application's: in the current
directory first (put at the front of ``sys.path`` while it is looked up), then on ``PYTHONPATH``
and among the installed packages. A module not found there is one line saying so and where it was
looked for; a module found whose own import fails names what it could not import.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the caller's parser stays light: each function imports what it needs when it runs
    from harness.consumer.consumer import Consumer
    from maintenance.settings import Settings, TtlGuard

__all__ = ["consumer_ttl_guard", "load_consumer"]


def load_consumer(reference: str, label: str = "--consumer") -> Consumer:
    """``package.module:object`` → the Consumer it names; ConfigError saying what is wrong (after ``label``).

    Whatever goes wrong in the user's module — an import it lacks, a syntax error, its own code
    raising or calling ``sys.exit()`` at import, a declaration refused (an action's retry policy
    without a justification) — is that ConfigError, naming the file and line of their code where it
    failed: exit 2 and one line, never a traceback (docs/cli.md)."""
    from harness.consumer.consumer import Consumer
    from maintenance.settings import ConfigError

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{label} {reference!r}: expected module:object, e.g. harness.examples.points:consumer")
    with _current_directory_importable():  # and while the place of a failure is looked for
        module = _import(module_name, reference, label)
    if not hasattr(module, attribute):
        raise ConfigError(f"{label} {reference!r}: module {module_name} has no {attribute}")
    found = getattr(module, attribute)
    if not isinstance(found, Consumer):
        raise ConfigError(f"{label} {reference!r}: {module_name}.{attribute} is not a harness Consumer")
    return found


def _import(module_name: str, reference: str, label: str) -> Any:
    """The module ``module_name``; ConfigError saying what failed (see :func:`load_consumer`)."""
    from harness.errors import describe_error
    from maintenance.settings import ConfigError

    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing is not None and _is_part_of(missing, module_name):  # the consumer's module itself is not found
            raise ConfigError(
                f"{label} {reference!r}: cannot import {module_name}: {exc} (a consumer's module is looked up in the"
                f" current directory, {os.getcwd()}, then on PYTHONPATH and among the installed packages: run from"
                " the folder that holds it, or add that folder to PYTHONPATH)"
            ) from None
        where = _where_it_failed(exc, module_name)
        raise ConfigError(
            f"{label} {reference!r}: cannot import {module_name}: {exc} ({module_name} was found{where}, but what it"
            " imports was not: install it, or add its folder to PYTHONPATH)"
        ) from None
    except (Exception, SystemExit) as exc:  # the module's own code failed: a declaration refused, a typo, sys.exit()
        where = _where_it_failed(exc, module_name)
        raise ConfigError(
            f"{label} {reference!r}: importing {module_name} failed{where}: {describe_error(exc)}"
        ) from None


@contextmanager
def _current_directory_importable() -> Iterator[None]:
    """The current directory at the front of ``sys.path`` while a consumer is looked up (``python -m`` puts it
    there for the whole run; a console script like ``core-jobs`` does not), ``sys.path`` as it was afterwards."""
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)


def _is_part_of(missing: str, module_name: str) -> bool:
    """Whether the module that could not be found is ``module_name`` or one of its parent packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _where_it_failed(exc: BaseException, module_name: str) -> str:
    """`` (path, line N)``: the place in the user's own code where importing ``module_name`` failed — the
    module's file or its package's — or ``""`` when no frame is theirs. A SyntaxError names its own place."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    spec = importlib.util.find_spec(module_name.partition(".")[0])
    if spec is None or spec.origin is None:
        return ""
    theirs = (
        [os.path.abspath(p) for p in spec.submodule_search_locations]
        if spec.submodule_search_locations
        else [os.path.abspath(spec.origin)]
    )
    found = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = os.path.abspath(frame.f_code.co_filename)
        if any(path == p or path.startswith(p + os.sep) for p in theirs):
            found = f" ({path}, line {line})"  # the deepest wins: where their code raised or called what did
    return found


def consumer_ttl_guard(settings: Settings, consumer: Consumer[Any]) -> TtlGuard:
    """The TTL guard (J-B7) of one consumer: its window is the longest of the configured policies'
    and its own — a policy fixed in its code, or a durable consumer's execution window
    (harness/durable/window.py: its actions' retries and its take-overs) — plus the broker horizon
    (:meth:`Settings.redelivery_horizon`, covering the consumer's own policy too). A fence shorter
    than that would let a late retry apply twice. ConfigError when the queue URL's delivery limit is
    not above the consumer's own ``max_attempts``."""
    from harness.durable.window import max_execution_window
    from maintenance.settings import ENV_PREFIX, ConfigError, TtlGuard

    configured = settings.retry_policy(consumer.queue)
    own = max_execution_window(consumer, configured, settings.worker_lease)
    # The broker's horizon covers the consumer's own policy too (a RabbitMQ delivery limit is checked against it).
    extra = (
        {}
        if consumer.retry_policy is None
        else {f"consumer {consumer.name}'s retry_policy": consumer.policy(configured)}
    )
    try:
        horizon = settings.redelivery_horizon(extra)
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}QUEUE_URL: {exc}") from None
    window = max(settings.max_retry_window(), own + horizon.value)
    return TtlGuard(ttl=settings.processed_jobs_ttl, window=window, margin=settings.ttl_margin)
