"""A small stateful Better Stack, served by pytest-httpserver on 127.0.0.1 (a real socket).

It checks each create body against the parameters Better Stack's v3 documentation defines
(https://betterstack.com/docs/uptime/api/create-a-new-incident/): an undocumented key, a
mistyped value or metadata not in the typed form ``{key: [{"type": "String", "value": "…"}]}``
is answered 422, so a test fails the moment the client sends what the API does not define.

It speaks the endpoints the feed uses — create, list with the metadata filter and pagination,
resolve (409 when already resolved) — plus the heartbeat, and can be scripted to fail: answer
500 or 429 (with Retry-After), create the incident and *then* answer 500 (the response was
lost), or hold a request until the test releases it (a timeout, or a run caught mid-POST).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from alerts.betterstack import BetterStackClient

TOKEN = "bs-test-token-7f3a9c1e5d"
_METADATA_FILTER = re.compile(r"^metadata\[(?P<key>.+)\]\[\]\[value\]$")

# POST /api/v3/incidents: every body parameter the v3 documentation lists, with its JSON type.
CREATE_PARAMETERS: dict[str, type | tuple[type, ...]] = {
    "team_name": str,
    "requester_email": str,
    "name": str,
    "summary": str,
    "description": str,
    "call": bool,
    "sms": bool,
    "email": bool,
    "critical_alert": bool,
    "team_wait": int,
    "policy_id": str,
    "metadata": dict,
}


def body_errors(body: dict[str, Any]) -> list[str]:
    """What in a create body the v3 documentation does not define (empty: all of it does)."""
    errors = [f"unknown parameter {key!r}" for key in body if key not in CREATE_PARAMETERS]
    for key, expected in CREATE_PARAMETERS.items():
        value = body.get(key)
        if key in body and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            errors.append(f"{key} must be {getattr(expected, '__name__', expected)}, got {value!r}")
    metadata = body.get("metadata")
    for key, values in metadata.items() if isinstance(metadata, dict) else ():
        if not isinstance(values, list) or not all(
            isinstance(v, dict)
            and set(v) == {"type", "value"}
            and v["type"] == "String"
            and isinstance(v["value"], str)
            for v in values
        ):
            errors.append(f"metadata {key!r} must be a list of {{type: String, value: str}}, got {values!r}")
    return errors


def metadata_values(metadata: dict[str, Any], key: str) -> list[str]:
    """The plain values of metadata ``key`` in a body or stored incident (typed form)."""
    return [v["value"] for v in metadata.get(key, [])]


@dataclass
class Fault:
    """One scripted answer: ``status`` (with ``headers``), after creating when ``after_create``.
    ``hold`` blocks the request until ``release`` is set, then serves it normally, or answers
    ``status`` without processing it when one is given (a request the client gave up on)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    after_create: bool = False
    hold: bool = False


@dataclass
class Recorded:
    method: str
    path: str
    args: dict[str, list[str]]
    body: Any
    authorization: str | None


class FakeBetterStack:
    def __init__(self, server: HTTPServer, token: str = TOKEN) -> None:
        self.server = server
        self.token = token
        self.incidents: dict[str, dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.heartbeats: list[Recorded] = []
        self.faults: dict[str, deque[Fault]] = {}
        self.ignore_metadata_filter = False  # behave like a server that dropped the filter
        self.pagination_origin: str | None = None  # put another host in pagination.next
        self.arrived = threading.Event()  # set when a held request arrives
        self.release = threading.Event()  # set by the test to let a held request go on
        self._ids = itertools.count(1001)
        self._lock = threading.Lock()
        server.expect_request(re.compile(r"^/api/v3/incidents.*$")).respond_with_handler(self._handle)
        server.expect_request(re.compile(r"^/api/v1/heartbeat/.*$")).respond_with_handler(self._heartbeat)

    @property
    def url(self) -> str:
        return self.server.url_for("").rstrip("/")

    def heartbeat_url(self, token: str = "hb-secret-0123456789") -> str:
        return f"{self.url}/api/v1/heartbeat/{token}"

    # --- scripting ------------------------------------------------------------------------------
    def fail_next(self, route: str, *faults: Fault) -> None:
        """Queue faults for ``route``: ``create``, ``list``, ``resolve`` or ``heartbeat``."""
        self.faults.setdefault(route, deque()).extend(faults)

    def posts(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/api/v3/incidents"]

    def open_incidents(self) -> list[dict[str, Any]]:
        return [i for i in self.incidents.values() if i["status"] != "Resolved"]

    # --- the API --------------------------------------------------------------------------------
    def _handle(self, request: Request) -> Response:
        body = request.get_json(silent=True) if request.data else None
        with self._lock:
            self.requests.append(
                Recorded(
                    request.method,
                    request.path,
                    request.args.to_dict(flat=False),
                    body,
                    request.headers.get("Authorization"),
                )
            )
        presented = request.headers.get("Authorization")
        if presented != f"Bearer {self.token}":
            # Echoes what it was given, on purpose: the client must scrub it from its errors.
            return _json({"errors": f"Invalid Team API token: {presented}"}, 401)
        if request.method == "POST" and request.path == "/api/v3/incidents":
            return self._faulty("create", lambda: self._create(body))
        if request.method == "GET" and request.path == "/api/v3/incidents":
            return self._faulty("list", lambda: self._list(request))
        match = re.fullmatch(r"/api/v3/incidents/(?P<id>[^/]+)/resolve", request.path)
        if request.method == "POST" and match:
            return self._faulty("resolve", lambda: self._resolve(match["id"], body or {}))
        return _json({"errors": "Resource not found"}, 404)

    def _faulty(self, route: str, serve) -> Response:
        with self._lock:
            queue = self.faults.get(route)
            fault = queue.popleft() if queue else None
        if fault is None:
            return serve()
        if fault.hold:
            self.arrived.set()
            self.release.wait(timeout=30)
            if fault.status is None:
                return serve()
        if fault.after_create:
            serve()
        return _json({"errors": f"scripted {fault.status}"}, fault.status or 500, fault.headers)

    def _create(self, body: dict[str, Any] | None) -> Response:
        if not isinstance(body, dict):
            return _json({"errors": "body must be a JSON object"}, 400)
        if "summary" not in body and "name" not in body:
            return _json({"errors": "Summary can't be blank"}, 422)
        errors = body_errors(body)
        if errors:
            return _json({"errors": "; ".join(errors)}, 422)
        with self._lock:
            incident_id = str(next(self._ids))
            metadata = body.get("metadata") or {}
            self.incidents[incident_id] = {
                "id": incident_id,
                "status": "Started",
                "body": body,
                "metadata": metadata,
                "resolved_by": None,
            }
        return _json({"data": self._resource(incident_id)}, 201)

    def _list(self, request: Request) -> Response:
        wanted = {}
        for name in request.args:
            match = _METADATA_FILTER.match(name)
            if match:
                wanted[match["key"]] = request.args[name]
        resolved = request.args.get("resolved")
        per_page = min(int(request.args.get("per_page", 10)), 50)
        page = int(request.args.get("page", 1))
        with self._lock:
            matching = [
                i
                for i in self.incidents.values()
                if (
                    self.ignore_metadata_filter
                    or all(
                        any(v["value"] == value for v in i["metadata"].get(key, [])) for key, value in wanted.items()
                    )
                )
                and (resolved is None or (i["status"] == "Resolved") == (resolved == "true"))
            ]
            chunk = matching[(page - 1) * per_page : page * per_page]
            data = [self._resource(i["id"]) for i in chunk]
        next_url = None
        if page * per_page < len(matching):
            args = request.args.to_dict() | {"page": str(page + 1)}
            next_url = f"{self.pagination_origin or self.url}/api/v3/incidents?{urlencode(args)}"
        return _json({"data": data, "pagination": {"next": next_url}}, 200)

    def _resolve(self, incident_id: str, body: dict[str, Any]) -> Response:
        with self._lock:
            incident = self.incidents.get(incident_id)
            if incident is None:
                return _json({"errors": "Resource not found"}, 404)
            if incident["status"] == "Resolved":
                return _json({"errors": "Incident is already resolved"}, 409)
            incident["status"] = "Resolved"
            incident["resolved_by"] = body.get("resolved_by")
        return _json({"data": self._resource(incident_id)}, 200)

    def _resource(self, incident_id: str) -> dict[str, Any]:
        incident = self.incidents[incident_id]
        return {
            "id": incident_id,
            "type": "incident",
            "attributes": {
                "name": incident["body"].get("name"),
                "status": incident["status"],
                "metadata": incident["metadata"],
                "resolved_by": incident["resolved_by"],
            },
        }

    # --- the heartbeat --------------------------------------------------------------------------
    def _heartbeat(self, request: Request) -> Response:
        with self._lock:
            self.heartbeats.append(Recorded(request.method, request.path, {}, request.get_data(as_text=True), None))
            queue = self.faults.get("heartbeat")
            fault = queue.popleft() if queue else None
        if fault is not None:
            return Response("scripted failure", status=fault.status or 500)
        return Response("OK", status=200)


def _json(payload: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload), status=status, headers=headers or {}, content_type="application/json")


@pytest.fixture(scope="session")
def bs_server() -> Iterator[HTTPServer]:
    """One threaded server for the session (stopping one costs 0.5 s); handlers are per test."""
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fake_bs(bs_server: HTTPServer) -> Iterator[FakeBetterStack]:
    """A fresh fake Better Stack (held requests never block others: the server is threaded)."""
    bs_server.clear()
    fake = FakeBetterStack(bs_server)
    try:
        yield fake
    finally:
        fake.release.set()
        bs_server.clear()


class FakeClock:
    """monotonic() and sleep() for the client: sleeping advances the clock and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_client(fake: FakeBetterStack, clock: FakeClock | None = None, **options: Any) -> BetterStackClient:
    """A client of ``fake`` that never sleeps in real time; jitter drawn at its middle (factor 1)."""
    clock = clock or FakeClock()
    options.setdefault("timeout", 2.0)
    return BetterStackClient(
        fake.url, fake.token, sleep=clock.sleep, monotonic=clock.monotonic, random=lambda: 0.5, **options
    )
