"""The small HTTP server of `core-jobs serve`: ``/healthz`` and ``/metrics``.

* ``GET /healthz`` — 200 with JSON while the scheduler runs, 503 otherwise (starting, stopping).
  The body lists every scheduled job: its schedule, next run, and last run (ok, finished_at,
  duration_s, error — secrets masked as in the logs) since this process started.
* ``GET /metrics`` — the process's telemetry registry (every job's run metrics, result gauges
  and the metrics job's latest figures; docs/reference/metrics.md), served by prometheus_client's
  own WSGI app: Prometheus text by default, OpenMetrics to a scraper whose ``Accept`` asks for
  ``application/openmetrics-text`` (Prometheus does), gzip when accepted, ``?name[]=`` filtering.

Anything else is 404. The server is prometheus_client's (wsgiref, one thread per request, the
same one ``core-jobs worker --metrics-port`` uses); requests are not logged (probes every few
seconds would drown the job events).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer
from wsgiref.simple_server import make_server as make_wsgi_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

Health = Callable[[], tuple[bool, dict[str, Any]]]
StartResponse = Callable[..., Any]


def make_app(*, health: Health, registry: CollectorRegistry) -> Callable[[dict, StartResponse], Iterable[bytes]]:
    """The WSGI app: /healthz ours, /metrics prometheus_client's."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            ok, body = health()
            return _send(
                start_response,
                "200 OK" if ok else "503 Service Unavailable",
                "application/json",
                json.dumps(body, default=str).encode(),
            )
        return _send(
            start_response, "404 Not Found", "text/plain; charset=utf-8", b"not found: try /healthz or /metrics\n"
        )

    return app


def _send(start_response: StartResponse, status: str, content_type: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


def make_server(host: str, port: int, *, health: Health, registry: CollectorRegistry) -> WSGIServer:
    """A server bound to (host, port) — port 0 picks a free one — not yet serving."""
    family, address = _get_best_family(host, port)  # "::" listens on IPv6, as start_http_server does

    class Server(ThreadingWSGIServer):
        address_family = family

    return make_wsgi_server(
        address, port, make_app(health=health, registry=registry), server_class=Server, handler_class=_SilentHandler
    )


def serve_in_background(server: WSGIServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="core-jobs-http", daemon=True)
    thread.start()
    return thread
