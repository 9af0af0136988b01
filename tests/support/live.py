"""In-process servers on free ports and a small Pusher WebSocket client for the tests
(the fixtures that use them, ``start_server``, ``live`` and ``clients``, are in
tests/conftest.py).

``live_server`` runs the real application under uvicorn, with the same fast-path
WebSocket protocol as ``agent-broadcaster serve``, inside the test's event loop: real
sockets and real clients, without the start-up cost of a process per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection

from broadcaster.node import Node
from broadcaster.signing import channel_auth

KEY = "agent-key"
SECRET = "agent-secret"
APP_ID = "1"


@dataclass
class LiveServer:
    url: str
    node: Node
    server: uvicorn.Server
    task: asyncio.Task[None]

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def app_url(self, key: str = KEY, query: str = "protocol=7") -> str:
        return f"{self.ws_url}/app/{key}?{query}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 10)


StartServer = Callable[..., Awaitable[LiveServer]]


class QuietServer(uvicorn.Server):
    """Leaves the test process's signal handlers alone."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


async def wait_for(predicate: Callable[[], bool], what: str, within: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def write_apps(path: Path, *apps: dict[str, Any]) -> Path:
    """An apps file (JSON) listing ``apps``."""
    path.write_text(json.dumps({"apps": list(apps)}))
    return path


class Client:
    """A Pusher protocol client over a real WebSocket (the ``websockets`` library)."""

    def __init__(self, ws: ClientConnection, established: dict[str, Any]) -> None:
        self.ws = ws
        self.socket_id: str = established["socket_id"]
        self.activity_timeout: int = established["activity_timeout"]

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> Client:
        ws = await websockets.connect(url, **kwargs)
        first = json.loads(await ws.recv())
        assert first["event"] == "pusher:connection_established", first
        return cls(ws, json.loads(first["data"]))

    async def send(self, event: str, data: Any = None, channel: str | None = None) -> None:
        message: dict[str, Any] = {"event": event, "data": {} if data is None else data}
        if channel is not None:
            message["channel"] = channel
        await self.ws.send(json.dumps(message))

    async def recv(self, within: float = 5) -> dict[str, Any]:
        """The next message, with ``data`` decoded when it is JSON text."""
        message: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), within))
        data = message.get("data")
        if isinstance(data, str):
            with contextlib.suppress(ValueError):
                message["data"] = json.loads(data)
        return message

    async def expect(self, event: str, within: float = 5) -> dict[str, Any]:
        """The next message, which must be ``event``."""
        message = await self.recv(within)
        assert message["event"] == event, message
        return message

    async def subscribe(self, channel: str, **fields: Any) -> dict[str, Any]:
        """Subscribe and return the answer (succeeded or an error)."""
        await self.send("pusher:subscribe", {"channel": channel, **fields})
        return await self.recv()

    async def closed_with(self, within: float = 10) -> int | None:
        """Read until the server closes; the close code."""
        try:
            while True:
                await asyncio.wait_for(self.ws.recv(), within)
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd is not None else None

    async def close(self) -> None:
        await self.ws.close()


def presence_fields(client: Client, channel: str, user_id: str, **info: object) -> dict[str, str]:
    channel_data = json.dumps({"user_id": user_id, "user_info": info})
    auth = channel_auth(KEY, SECRET, client.socket_id, channel, channel_data)
    return {"auth": auth, "channel_data": channel_data}
