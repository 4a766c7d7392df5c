"""A TCP proxy in front of the real PostgreSQL that a test can cut and restore: an outage the worker sees as one.

``cut()`` drops every proxied connection at once and refuses new ones (the listening socket closed),
as a server that died or a network partition does; ``restore()`` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _address = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def proxy_of(database_url: str) -> Iterator[TcpProxy]:
    """A proxy in front of ``database_url``'s server, closed afterwards; the test is skipped if it is not over TCP."""
    parts = urlsplit(database_url)
    if not parts.hostname or "host=" in parts.query:
        pytest.skip("the proxy needs a server over TCP (CORE_JOBS_TEST_DATABASE_URL; .ci/run sets it)")
    proxy = TcpProxy(parts.hostname, parts.port or 5432)
    try:
        yield proxy
    finally:
        proxy.close()


def through(database_url: str, proxy: TcpProxy) -> str:
    """``database_url`` by way of ``proxy``."""
    parts = urlsplit(database_url)
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}" if parts.username else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))
