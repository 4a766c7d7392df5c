"""A third party's queue adapter, registered for real: the ``echo_queues`` fixture and its :class:`EchoQueue`.

The fixture writes a distribution's metadata (``*.dist-info`` with an ``entry_points.txt``) into
a temporary directory and puts it on ``sys.path``, so ``importlib.metadata`` finds the entry point
``echo = support.queue_adapters:EchoQueue`` in the group ``core_jobs_harness.queues`` exactly as
it finds one of an installed package. :class:`EchoQueue` is the reference queue under another
scheme that remembers every port opened and closed, and cannot tell its figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import ClassVar

import psycopg
import pytest

from harness.queue.adapters import ENTRY_POINT_GROUP
from harness.queue.pgqueue import PgQueue

SCHEME = "echo"


class EchoQueue(PgQueue):
    """The reference queue behind an ``echo://`` URL: each port opened is kept in :attr:`opened`."""

    system = "echo"
    opened: ClassVar[list[EchoQueue]] = []

    def __init__(self, url: str, conn: psycopg.Connection, *, worker: str, lease: timedelta) -> None:
        super().__init__(conn, lease=lease, worker=worker)
        self.url = url
        self.closed = False

    @classmethod
    def from_url(cls, url: str, conn: psycopg.Connection, *, worker: str = "", lease: timedelta) -> EchoQueue:
        port = cls(url, conn, worker=worker, lease=lease)
        cls.opened.append(port)
        return port

    def figures(self, queue: str) -> None:  # type: ignore[override]
        """This adapter cannot tell its depth."""
        return None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def echo_queues(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[EchoQueue]]:
    """The ``echo`` scheme installed as an entry point of ``core_jobs_harness.queues``; EchoQueue's record emptied."""
    info = tmp_path / "core_jobs_echo_queue-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: core-jobs-echo-queue\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{SCHEME} = {__name__}:EchoQueue\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    EchoQueue.opened.clear()
    yield EchoQueue
    EchoQueue.opened.clear()
