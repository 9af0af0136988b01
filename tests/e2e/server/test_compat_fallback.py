"""When the installed uvicorn fails the compatibility check, the server still serves:
over uvicorn's own WebSocket and HTTP protocols (the plain ASGI path), with a warning."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest

from broadcaster import _compat
from broadcaster._compat import Contract
from broadcaster.connection import AsgiConnection
from broadcaster.server import http_protocol, ws_protocol
from broadcaster.settings import load_settings
from tests.support.live import APP_ID, Client, StartServer

Connect = Callable[..., Awaitable[Client]]

_BROKEN = (
    Contract(
        module="uvicorn.protocols.websockets.websockets_sansio_impl",
        cls="WebSocketsSansIOProtocol",
        methods=("renamed_in_a_later_uvicorn",),
    ),
)


def test_a_failed_check_selects_uvicorns_own_protocols_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(port=0)
    assert ws_protocol(settings) != "auto"
    assert http_protocol(settings) != "auto"
    monkeypatch.setattr(_compat, "WEBSOCKET", _BROKEN)
    monkeypatch.setattr(_compat, "GUARD", _BROKEN)
    with caplog.at_level(logging.WARNING, logger="broadcaster.server"):
        assert ws_protocol(settings) == "auto"
        assert http_protocol(settings) == "auto"
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert all("renamed_in_a_later_uvicorn()" in message for message in warnings)
    assert "the fast WebSocket path is off" in warnings[0]
    assert "the connection guard is off" in warnings[1]


async def test_the_fallback_serves_pusher_clients_over_asgi(
    monkeypatch: pytest.MonkeyPatch, start_server: StartServer, clients: Connect
) -> None:
    monkeypatch.setattr(_compat, "WEBSOCKET", _BROKEN)
    monkeypatch.setattr(_compat, "GUARD", _BROKEN)
    settings = load_settings(port=0)
    live = await start_server(ws=ws_protocol(settings), http=http_protocol(settings))
    client = await clients(live.app_url())
    assert type(live.node.connections[client.socket_id]) is AsgiConnection
    assert (await client.subscribe("agent.fallback"))["event"] == (
        "pusher_internal:subscription_succeeded"
    )
    await live.node.publish(APP_ID, ["agent.fallback"], "step", '{"n": 1}')
    assert (await client.expect("step"))["data"] == {"n": 1}
