"""The small HTTP server of `core-jobs serve`: ``/healthz`` and ``/metrics``.

* ``GET /healthz`` — 200 with JSON while the scheduler runs, 503 otherwise (starting, stopping).
  The body lists every scheduled job: its schedule, next run, and last run (ok, finished_at,
  duration_s, error — secrets masked as in the logs) since this process started.
* ``GET /metrics`` — the Prometheus text format of the process's telemetry registry (every
  job's run metrics and the metrics job's latest success/dead-letter figures).

Anything else is 404. Requests are not logged (probes every few seconds would drown the job
events).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Health = Callable[[], tuple[bool, dict[str, Any]]]


def make_server(host: str, port: int, *, health: Health, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """A server bound to (host, port) — port 0 picks a free one — not yet serving."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok, body = health()
                self._send(200 if ok else 503, "application/json", json.dumps(body, default=str).encode())
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /healthz or /metrics\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="core-jobs-http", daemon=True)
    thread.start()
    return thread
