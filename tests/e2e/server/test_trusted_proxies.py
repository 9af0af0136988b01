"""The per-address connection limit behind a trusted proxy (issue 29, point 4), in
process: a trusted peer's requests count as the clients it forwards for, a refused
WebSocket upgrade is not upgraded after its 429, and an untrusted peer's forwarding
headers change nothing. Through a real nginx with TLS: tests/e2e/server/test_nginx.py."""

from __future__ import annotations

import asyncio
import json

import websockets

from tests.support.live import KEY, LiveServer, StartServer

UPGRADE = (
    "GET /app/{key}?protocol=7 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\nX-Forwarded-For: {client}\r\n\r\n"
)


async def established(live: LiveServer, client: str) -> websockets.ClientConnection:
    ws = await websockets.connect(live.app_url(), additional_headers={"X-Forwarded-For": client})
    first = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert first["event"] == "pusher:connection_established", first
    return ws


async def raw_upgrade(live: LiveServer, client: str, local: str = "127.0.0.1") -> bytes:
    """Everything the server sends to an upgrade request forwarded for ``client``,
    until it closes (or 5 s of silence: a WebSocket that opened)."""
    port = int(live.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    writer.write(UPGRADE.format(key=KEY, client=client).encode())
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            received += chunk
    except TimeoutError:
        pass
    writer.close()
    return received


async def test_a_trusted_proxys_clients_are_counted_one_by_one(start_server: StartServer) -> None:
    live = await start_server(trusted_proxies="127.0.0.1", max_connections_per_ip=1)
    first = await established(live, "198.51.100.7")
    try:
        refused = await raw_upgrade(live, "198.51.100.7")
        assert refused.startswith(b"HTTP/1.1 429"), refused
        assert b"too many connections from 198.51.100.7" in refused
        assert b"101 Switching Protocols" not in refused, "refused, then upgraded anyway"
        other = await established(live, "198.51.100.8")  # another client of the proxy
        await other.close()
    finally:
        await first.close()


async def test_an_untrusted_peers_forwarding_headers_are_ignored(
    start_server: StartServer,
) -> None:
    live = await start_server(trusted_proxies="127.0.0.1", max_connections_per_ip=1)
    port = int(live.url.rsplit(":", 1)[1])
    held = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
    try:  # 127.0.0.2 has its one connection: another, whoever it claims to be, is refused
        refused = await raw_upgrade(live, "198.51.100.9", local="127.0.0.2")
        assert refused.startswith(b"HTTP/1.1 429"), refused
        assert b"too many connections from 127.0.0.2" in refused
    finally:
        held[1].close()
