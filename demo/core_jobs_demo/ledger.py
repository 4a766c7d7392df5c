"""A local, stateful HTTP loyalty ledger: the provider the durable-action demo, bench and tests call.

A real HTTP server (stdlib ``ThreadingHTTPServer``) in a thread of this process::

    with LoyaltyLedger() as ledger:          # listens on 127.0.0.1, a free port
        ledger.url                           # http://127.0.0.1:PORT
        ledger.fail("credits", Fault.unavailable(times=2, retry_after="3"))
        ...
        ledger.effects(key="…")              # what it applied, per Idempotency-Key

Endpoints (JSON in and out):

- ``GET /members/{id}`` — READ_ONLY lookup: ``{"member_id", "tier"}``; 404 for an unknown member
  (``unknown=`` at construction).
- ``POST /credits`` — IDEMPOTENT_WRITE: body ``{"member_id", "points"}`` and an
  ``Idempotency-Key`` header (400 without). The first request with a key applies one effect
  and answers ``{"credit_id", "member_id", "points"}``; every later one with that key applies
  nothing and answers the first answer again (header ``Idempotent-Replayed: true``).
- ``POST /legacy/notify`` — NON_IDEMPOTENT_WRITE: no key; every call is one effect, answered
  ``{"notification_id"}``.
- ``GET /effects`` — every effect applied, in order: ``[{"endpoint", "key", "body"}]``.

Every request is counted per endpoint (:meth:`LoyaltyLedger.calls`), effect or not.

Faults, per endpoint (``lookup``, ``credits``, ``notify``), used up in order, one per request:

- :meth:`Fault.unavailable` — HTTP 503 with a ``Retry-After`` (nothing applied);
- :meth:`Fault.hang` — answers only after ``seconds`` (longer than the client's timeout): by
  default the write is applied first, so the answer is what is lost (``applied=False``: not);
- :meth:`Fault.invalid` — HTTP 200 with a body that breaks the endpoint's contract (applied);
- :meth:`Fault.refused` — HTTP 409: the ledger definitely refused it (nothing applied).

A hang waits on an event, not a sleep: :meth:`LoyaltyLedger.close` ends it at once.

Standalone, for ``core-jobs worker --consumer harness.examples.ledger_points:consumer`` (whose
default ledger URL is ``http://127.0.0.1:8765``)::

    python -m core_jobs_demo.ledger [--port 8765]     # until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

__all__ = ["ENDPOINTS", "Effect", "Fault", "LoyaltyLedger"]

ENDPOINTS = ("lookup", "credits", "notify")


@dataclass(frozen=True)
class Fault:
    """One faulty answer of an endpoint (see the module docstring)."""

    kind: Literal["unavailable", "hang", "invalid", "refused"]
    retry_after: str | None = None
    seconds: float = 0.0
    applied: bool = True

    @staticmethod
    def unavailable(retry_after: str | None = "1") -> Fault:
        return Fault("unavailable", retry_after=retry_after)

    @staticmethod
    def hang(seconds: float = 30.0, *, applied: bool = True) -> Fault:
        return Fault("hang", seconds=seconds, applied=applied)

    @staticmethod
    def invalid() -> Fault:
        return Fault("invalid")

    @staticmethod
    def refused() -> Fault:
        return Fault("refused")


@dataclass(frozen=True)
class Effect:
    """One change the ledger applied."""

    endpoint: str
    key: str | None
    body: dict[str, Any]


class LoyaltyLedger:
    """The ledger's state and its HTTP server; a context manager (see the module docstring)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, unknown: frozenset[str] = frozenset()) -> None:
        self.unknown = unknown
        self._lock = threading.Lock()
        self._effects: list[Effect] = []
        self._answers: dict[str, dict[str, Any]] = {}  # Idempotency-Key -> the first answer
        self._faults: dict[str, deque[Fault]] = {e: deque() for e in ENDPOINTS}
        self._calls: Counter[str] = Counter()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="loyalty-ledger", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"

    def fail(self, endpoint: str, *faults: Fault) -> None:
        """Answer the next requests of ``endpoint`` with ``faults``, in order, then normally again."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
        with self._lock:
            self._faults[endpoint].extend(faults)

    def effects(self, *, endpoint: str | None = None, key: str | None = None) -> list[Effect]:
        """The effects applied, in order, of one endpoint and/or one Idempotency-Key if given."""
        with self._lock:
            return [
                e
                for e in self._effects
                if (endpoint is None or e.endpoint == endpoint) and (key is None or e.key == key)
            ]

    def calls(self, endpoint: str) -> int:
        """Requests received by ``endpoint`` so far, answered or not, effect or not."""
        with self._lock:
            return self._calls[endpoint]

    def close(self) -> None:
        self._closing.set()  # a hanging answer ends now
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> LoyaltyLedger:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- the endpoints, called by the request handler ------------------------------------------

    def _next_fault(self, endpoint: str) -> Fault | None:
        with self._lock:
            self._calls[endpoint] += 1
            queue = self._faults[endpoint]
            return queue.popleft() if queue else None

    def _apply(self, endpoint: str, key: str | None, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        """Apply one effect (or, for a key seen before, return the first answer and apply nothing)."""
        with self._lock:
            if key is not None and key in self._answers:
                return self._answers[key] | {"_replayed": True}
            self._effects.append(Effect(endpoint, key, body))
            if key is not None:
                self._answers[key] = answer
            return answer

    def answer(
        self, endpoint: str, path_id: str | None, key: str | None, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON body) for one request: the whole behaviour, HTTP aside."""
        fault = self._next_fault(endpoint)
        if fault is not None and fault.kind == "unavailable":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            return 503, headers, {"error": "ledger unavailable"}
        if fault is not None and fault.kind == "refused":
            return 409, {}, {"error": "refused"}
        if endpoint == "lookup":
            if path_id in self.unknown:
                return 404, {}, {"error": f"no member {path_id}"}
            status, headers, reply = 200, {}, {"member_id": path_id, "tier": "gold"}
        elif endpoint == "credits" and not key:
            return 400, {}, {"error": "an Idempotency-Key header is required"}
        elif not isinstance(body.get("member_id"), str) or not isinstance(body.get("points"), int):
            return 422, {}, {"error": "member_id (text) and points (a whole number) are required"}
        elif fault is None or fault.applied:
            if endpoint == "credits":
                first = {"credit_id": str(uuid.uuid4()), "member_id": body["member_id"], "points": body["points"]}
            else:
                first = {"notification_id": len(self.effects(endpoint="notify")) + 1}
            reply = self._apply(endpoint, key if endpoint == "credits" else None, body, first)
            headers = {"Idempotent-Replayed": "true"} if reply.pop("_replayed", False) else {}
            status = 200
        else:
            status, headers, reply = 200, {}, {}
        if fault is not None and fault.kind == "hang":
            self._closing.wait(fault.seconds)
        if fault is not None and fault.kind == "invalid":
            return 200, {}, {"unexpected": "not what the contract promised"}
        return status, headers, reply


def _handler_for(ledger: LoyaltyLedger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave as separate writes: with Nagle on, the body waits for the client's
        # delayed ACK of the headers (40 ms a request on Linux), which a benchmark would measure.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/effects":
                self._send(200, {}, [e.__dict__ for e in ledger.effects()])
            elif self.path.startswith("/members/") and len(self.path) > len("/members/"):
                self._send(*ledger.answer("lookup", self.path.removeprefix("/members/"), None, {}))
            else:
                self._send(404, {}, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._send(400, {}, {"error": "the body must be a JSON object"})
                return
            endpoint = {"/credits": "credits", "/legacy/notify": "notify"}.get(self.path)
            if endpoint is None:
                self._send(404, {}, {"error": "not found"})
                return
            self._send(*ledger.answer(endpoint, None, self.headers.get("Idempotency-Key"), body))

        def _send(self, status: int, headers: dict[str, str], body: Any) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): the effect, if any, stays applied

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the tests and the demo read the effects, not an access log

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve a ledger on 127.0.0.1 until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m core_jobs_demo.ledger", description="A local loyalty ledger.")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    with LoyaltyLedger(port=args.port) as ledger:
        print(f"loyalty ledger on {ledger.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
