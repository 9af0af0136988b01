"""The servers a bench run compares: ours and the references.

Every server gets its publications through the same private Redis, each on its own
publish path: ours through the Redis backend (``publish_many_via_redis``), the plain
``websockets`` reference through ``PUBLISH`` of a ready frame, socket.io through
``@socket.io/redis-emitter``. The bare-uvicorn reference (``bench/ref_uvicorn.py``)
takes part in the ``http`` scenario only: it answers the same signed publish requests
with ``{}`` and delivers nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench._proc import REPO, Child

__all__ = ["APP", "SERVERS", "RunningServer", "ServerSpec", "start_server"]

NODE_DIR = REPO / "bench" / "node"
APP = {"id": "bench", "key": "bench-key", "secret": "bench-secret"}
_LISTENING = re.compile(r"listening on (http://\S+?)/?$")


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server and how to talk to it."""

    name: str
    label: str
    protocol: str  # what the load generator speaks: "pusher" or "socketio"
    publisher: str  # "broadcaster", "plain" or "socketio" (see bench/publisher.py)
    http_api: bool  # serves the signed Pusher HTTP publish API
    only: tuple[str, ...] = ()  # the scenarios it takes part in (empty: all)

    def takes_part(self, scenario: str) -> bool:
        """Whether this server is measured in ``scenario``."""
        if scenario == "http" and not self.http_api:
            return False
        if scenario == "agentside" and self.publisher != "broadcaster":
            return False  # our publishing side against a floor: no reference server
        return not self.only or scenario in self.only

    @property
    def subscribers(self) -> bool:
        """Whether WebSocket clients can subscribe (False: an HTTP-only reference)."""
        return self.protocol != "none"

    def argv(self, redis_url: str) -> list[str]:
        if self.name == "broadcaster":
            return [
                sys.executable,
                "-m",
                "broadcaster",
                "serve",
                "--port",
                "0",
                "--backend",
                redis_url,
                "--app-id",
                APP["id"],
                "--app-key",
                APP["key"],
                "--app-secret",
                APP["secret"],
                "--log-level",
                "warning",
                # Every load generator connects from 127.0.0.1: no per-address limit.
                "--max-connections-per-ip",
                "0",
            ]
        if self.name == "websockets":
            return [sys.executable, "-m", "bench.ref_websockets", "--redis", redis_url]
        if self.name == "uvicorn":
            return [sys.executable, "-m", "bench.ref_uvicorn"]
        return ["node", str(NODE_DIR / "socketio_server.js"), "0"]

    def ws_url(self, base: str) -> str:
        ws = base.replace("http://", "ws://", 1)
        if self.name == "broadcaster":
            return f"{ws}/app/{APP['key']}?protocol=7&client=js&version=8.4.0"
        if self.name == "socketio":
            return f"{ws}/socket.io/?EIO=4&transport=websocket"
        return f"{ws}/"

    def publisher_argv(self, config: dict[str, Any]) -> list[str]:
        text = json.dumps(config)
        if self.publisher == "socketio":
            return ["node", str(NODE_DIR / "publisher.js"), text]
        return [sys.executable, "-m", "bench.publisher", text]


SERVERS = {
    spec.name: spec
    for spec in (
        ServerSpec("broadcaster", "agent-broadcaster", "pusher", "broadcaster", True),
        ServerSpec("websockets", "plain websockets (ref)", "pusher", "plain", False),
        ServerSpec("socketio", "Node socket.io (ref)", "socketio", "socketio", False),
        # Answers any POST with {} (it ignores the signed requests): the http floor.
        ServerSpec("uvicorn", "bare uvicorn (ref)", "none", "plain", True, only=("http",)),
    )
}


@dataclass
class RunningServer:
    spec: ServerSpec
    child: Child
    url: str  # http://127.0.0.1:PORT

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def ws_url(self) -> str:
        return self.spec.ws_url(self.url)


async def start_server(
    spec: ServerSpec,
    redis_url: str,
    within: float = 30,
    *,
    wrapper: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> RunningServer:
    """Start ``spec`` against ``redis_url`` and wait until it serves; under ``wrapper``
    (e.g. ``valgrind ...``) and with ``env`` added to the environment, if given."""
    env = {"REDIS_URL": redis_url, **(env or {})}
    child = await Child(spec.name, [*wrapper, *spec.argv(redis_url)], env=env).start()
    line = await child.expect_line(lambda text: bool(_LISTENING.search(text)), within)
    match = _LISTENING.search(line)
    assert match is not None
    server = RunningServer(spec, child, match.group(1))
    if spec.name == "broadcaster":
        await _wait_ready(server, within)
    return server


async def _wait_ready(server: RunningServer, within: float) -> None:
    """Poll ``GET /ready`` (the backend is connected) with a deadline."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"GET /ready HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise server.child.failure(f"GET /ready did not answer 200 within {within}s")
