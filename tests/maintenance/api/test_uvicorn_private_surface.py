"""The private surface of uvicorn that ``BoundedHttpToolsProtocol`` (maintenance/api/transport.py) subclasses is there,
as the subclass relies on it: pyproject.toml bounds uvicorn to the minor tested, and this fails loudly, naming what
changed, when a new uvicorn moves a method, renames a parameter or an attribute, or stops answering a parser error
through ``send_400_response``."""

from __future__ import annotations

import asyncio
import inspect
import socket

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from maintenance.api.transport import BoundedHttpToolsProtocol

pytestmark = pytest.mark.pure

# Each method the subclass overrides or calls through super(), with the parameters it passes.
OVERRIDDEN = {
    "__init__": ["config", "server_state", "app_state", "_loop"],
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "send_400_response": ["msg"],
    "on_message_begin": [],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
}
# What the subclass reads of a request's cycle (uvicorn's RequestResponseCycle).
CYCLE_ATTRIBUTES = ("response_started", "response_complete", "disconnected", "message_event")


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_every_method_the_bounded_protocol_overrides_is_uvicorns_with_the_same_parameters(name):
    method = HttpToolsProtocol.__dict__.get(name)
    assert method is not None, f"uvicorn's HttpToolsProtocol no longer defines {name}: BoundedHttpToolsProtocol breaks"
    parameters = list(inspect.signature(method).parameters)[1:]
    assert parameters == OVERRIDDEN[name], f"HttpToolsProtocol.{name}{inspect.signature(method)} changed"
    assert name in BoundedHttpToolsProtocol.__dict__ or name == "__init__"


async def _app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class Recording(BoundedHttpToolsProtocol):
    """The bounded protocol, recording what it reads of uvicorn's state at each step."""

    seen: dict[str, object]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.seen["method"] = self.parser.get_method()
        self.seen["url"] = self.url
        self.seen["headers"] = list(self.headers)
        self.seen["cycle"] = {name: getattr(self.cycle, name) for name in CYCLE_ATTRIBUTES}
        self.seen["read_paused"] = self.flow.read_paused

    def send_400_response(self, msg: str) -> None:
        self.seen["400"] = msg
        super().send_400_response(msg)


def test_a_live_connection_has_the_state_the_bounded_protocol_reads_and_a_parser_error_reaches_send_400_response():
    """On a real socket: the parser, the request's url and headers, the cycle's flags, the flow control and the
    loop are where the subclass reads them, and a malformed request ends in ``send_400_response``."""

    async def scenario() -> dict[str, object]:
        loop = asyncio.get_running_loop()
        config = uvicorn.Config(_app, log_level="warning")
        config.load()
        ours, theirs = socket.socketpair()
        protocol = Recording(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        protocol.seen = {}
        await loop.connect_accepted_socket(lambda: protocol, ours)
        assert protocol.loop is loop and protocol.transport is not None
        theirs.sendall(b"GET /x HTTP/1.1\r\nHost: api\r\n\r\nNOT HTTP\r\n\r\n")
        theirs.settimeout(5)
        while await loop.run_in_executor(None, theirs.recv, 65536):  # until the server closes
            pass
        theirs.close()
        return protocol.seen

    seen = asyncio.run(scenario())
    assert seen["method"] == b"GET" and seen["url"] == b"/x"
    assert seen["headers"] == [(b"host", b"api")]
    assert seen["cycle"] == {
        "response_started": False,
        "response_complete": False,
        "disconnected": False,
        "message_event": seen["cycle"]["message_event"],  # type: ignore[index]
    }
    assert isinstance(seen["cycle"]["message_event"], asyncio.Event)  # type: ignore[index]
    assert seen["read_paused"] is False
    assert "400" in seen, "a parser error no longer reaches send_400_response"
