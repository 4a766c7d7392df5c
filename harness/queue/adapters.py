"""Choosing the queue adapter: one URL says which queue a worker (and ``core-jobs enqueue``) uses.

=============================================  ===========================================================
URL                                            adapter
=============================================  ===========================================================
none, empty, ``postgresql://…``,               :class:`~harness.queue.pgqueue.PgQueue`, the reference queue
``postgres://…``                               in the database of the connection it is given (the worker's
                                               own): the URL's host, user and database are not read
``amqp://…``, ``amqps://…``                    ``harness.queue.rabbitmq.RabbitQueue`` (the ``rabbitmq``
                                               extra: ``core-jobs-harness[rabbitmq]``, pika)
``memory://<name>``                            :class:`~harness.queue.memory.MemoryQueue`, a queue in the
                                               process's memory, for a consumer's own tests
any other scheme                               the entry point of that name in the group
                                               ``core_jobs_harness.queues``
=============================================  ===========================================================

Schemes are compared without case. A third party's adapter is a distribution that declares its
class under its scheme, e.g. in its ``pyproject.toml``::

    [project.entry-points."core_jobs_harness.queues"]
    sqs = "my_package.sqs:SqsQueue"

The class implements :class:`~harness.queue.port.QueuePort` and opens a port with
``from_url(url, conn, *, worker="", lease) -> QueuePort``, as the built-in ones do: ``url`` whole
(credentials included), ``conn`` the caller's PostgreSQL connection in autocommit mode (the
dead letters and fences live there), ``worker`` the name of the worker thread, ``lease`` how long
a delivery may be held. A built-in scheme cannot be taken over by an entry point.

Nothing is imported before a port is opened: :func:`adapter_reference` names the class a URL
selects without loading it (what ``core-jobs check-config`` shows, pika or not);
:func:`adapter_class` imports it (a worker does when it is made, so a missing extra stops it
before any thread starts) and has the URL checked by the adapter's optional ``check_url(url)``
classmethod (RabbitMQ's: what pika would refuse), so a URL the adapter cannot read is refused
before any connection too; :func:`open_queue` opens a port of it. A URL of no known scheme, an adapter that
cannot be imported (the extra not installed), or a URL its adapter refuses is a :class:`QueueUrlError`
(a ``ValueError``) that names the problem — never the password (harness/urls.py masks the URL).
"""

from __future__ import annotations

import re
from datetime import timedelta
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from harness.queue.port import QueuePort

__all__ = ["ENTRY_POINT_GROUP", "QueueUrlError", "adapter_class", "adapter_reference", "open_queue", "url_scheme"]

# The entry-point group a third party's adapter registers in: name = its scheme, value = module:Class.
ENTRY_POINT_GROUP = "core_jobs_harness.queues"

REFERENCE_QUEUE = "harness.queue.pgqueue:PgQueue"
RABBITMQ_QUEUE = "harness.queue.rabbitmq:RabbitQueue"
MEMORY_QUEUE = "harness.queue.memory:MemoryQueue"
BUILT_IN = {
    "postgresql": REFERENCE_QUEUE,
    "postgres": REFERENCE_QUEUE,
    "amqp": RABBITMQ_QUEUE,
    "amqps": RABBITMQ_QUEUE,
    "memory": MEMORY_QUEUE,
}
# What to install when a built-in adapter cannot be imported.
_EXTRAS = {RABBITMQ_QUEUE: "core-jobs-harness[rabbitmq]"}

# RFC 3986's scheme: read by hand, so no URL parser sees (and no error of one quotes) the rest.
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):")


class QueueUrlError(ValueError):
    """A queue URL no adapter can open: its scheme is unknown, or its adapter cannot be imported."""


def url_scheme(url: str | None) -> str | None:
    """The URL's scheme in lower case; None for no URL (the reference queue). QueueUrlError when it has none."""
    if url is None or not url.strip():
        return None
    match = _SCHEME.match(url)
    if match is None:
        raise QueueUrlError(f"the queue URL has no scheme: start it with one of {', '.join(_known())}://")
    return match[1].lower()


def adapter_reference(url: str | None) -> str:
    """``module:Class`` of the adapter ``url`` selects, not imported; QueueUrlError for an unknown scheme."""
    return _entry_point(url).value


def open_queue(
    url: str | None, conn: psycopg.Connection, *, worker: str = "", lease: timedelta = timedelta(seconds=30)
) -> QueuePort:
    """A port of the adapter ``url`` selects, opened on ``conn``: the reference queue when ``url`` is unset.

    The caller closes it (``close()``); ``conn`` stays the caller's. QueueUrlError when no adapter can open ``url``.
    """
    port: QueuePort = adapter_class(url).from_url(url, conn, worker=worker, lease=lease)
    return port


def adapter_class(url: str | None) -> Any:
    """The adapter class ``url`` selects, imported, ``url`` checked by its ``check_url`` when it has one;
    QueueUrlError for an unknown scheme, a failed import or a URL the adapter refuses."""
    entry = _entry_point(url)
    try:
        cls = entry.load()
    except ImportError as exc:
        extra = _EXTRAS.get(entry.value)
        hint = f": install {extra}" if extra else ""
        raise QueueUrlError(
            f"the queue adapter of the scheme {entry.name!r}, {entry.value}, cannot be imported ({exc}){hint}"
        ) from None
    check = getattr(cls, "check_url", None)
    if url is not None and callable(check):
        check(url)
    return cls


def _entry_point(url: str | None) -> EntryPoint:
    scheme = url_scheme(url) or "postgresql"
    if scheme in BUILT_IN:
        return EntryPoint(name=scheme, value=BUILT_IN[scheme], group=ENTRY_POINT_GROUP)
    installed = _installed()
    if scheme in installed:
        return installed[scheme]
    raise QueueUrlError(
        f"no queue adapter for the scheme {scheme!r} (known: {', '.join(_known(installed))};"
        f" a third party's adapter registers its scheme in the entry-point group {ENTRY_POINT_GROUP})"
    )


def _installed() -> dict[str, EntryPoint]:
    """The third parties' adapters installed, by scheme (read from the distributions' metadata, nothing imported)."""
    return {entry.name.lower(): entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _known(installed: dict[str, EntryPoint] | None = None) -> list[str]:
    return sorted({*BUILT_IN, *(_installed() if installed is None else installed)})
