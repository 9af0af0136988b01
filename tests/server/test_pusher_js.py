"""End to end with the clients people use: pusher-js (in Node) subscribes to a public, a
private and a presence channel of a real server process, and the official ``pusher``
Python SDK publishes to them."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pusher
import pytest

from broadcaster.signing import channel_auth
from tests.support.live import APP_ID, KEY, SECRET, Client
from tests.support.processes import IN_CI, REPO, ServerFactory, ServerProcess, require_binary

pytestmark = pytest.mark.node

NODE_DIR = REPO / "tests" / "node"
CHANNELS = ("agent.e2e", "private-agent.e2e", "presence-agent.e2e")


class NodeClient:
    """tests/node/pusher_client.mjs as a child process, its JSON lines in a queue."""

    def __init__(
        self,
        server: ServerProcess,
        channels: tuple[str, ...],
        *,
        url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Connects to ``server``, or to ``url`` (``https://``: over wss), with ``env``
        added to the environment."""
        node = require_binary("node")
        if not (NODE_DIR / "node_modules" / "pusher-js").is_dir():
            message = "pusher-js is not installed: run scripts/install --test"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        target = urlsplit(url or server.url)
        args = [node, "pusher_client.mjs", str(target.hostname), str(target.port), KEY, SECRET]
        tls = {"PUSHER_TLS": "1"} if target.scheme == "https" else {}
        self.proc = subprocess.Popen(
            [*args, *channels],
            cwd=NODE_DIR,
            env={**os.environ, **tls, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"type": "output", "text": line})

    def wait_for(self, match: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(record)
            if match(record):
                return record
        raise TimeoutError(f"pusher-js never reported {what}; it said: {self.seen}")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def node_client(server_factory: ServerFactory) -> Iterator[tuple[ServerProcess, NodeClient]]:
    server = server_factory()
    client = NodeClient(server, CHANNELS)
    yield server, client
    client.stop()


def event_on(channel: str) -> Callable[[dict[str, Any]], bool]:
    return lambda record: record["type"] == "event" and record["channel"] == channel


def sdk(server: ServerProcess) -> pusher.Pusher:
    url = urlsplit(server.url)
    return pusher.Pusher(
        app_id=APP_ID, key=KEY, secret=SECRET, host=url.hostname, port=url.port, ssl=False
    )


def test_pusher_js_receives_events_published_with_the_python_sdk(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    client.wait_for(lambda r: r["type"] == "connected", "a connection")
    subscribed = {}
    for _ in CHANNELS:
        record = client.wait_for(lambda r: r["type"] == "subscribed", "a subscription")
        subscribed[record["channel"]] = record
    assert set(subscribed) == set(CHANNELS)
    assert subscribed["presence-agent.e2e"]["members"] == ["node-user"]

    publisher = sdk(server)
    for n, channel in enumerate(CHANNELS):
        publisher.trigger(channel, "agent.step", {"n": n})
    for n, channel in enumerate(CHANNELS):
        record = client.wait_for(event_on(channel), f"the event on {channel}")
        assert record["event"] == "agent.step"
        assert record["data"] == {"n": n}


def test_pusher_js_signs_in_and_receives_events_sent_to_its_user(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    client.wait_for(lambda r: r["type"] == "signed_in", "the sign-in")
    client.wait_for(lambda r: r["type"] == "user_channel", "the #server-to-user channel")
    sdk(server).send_to_user("node-user", "notice", {"hello": "you"})
    record = client.wait_for(lambda r: r["type"] == "user_event", "the event sent to the user")
    assert record["event"] == "notice"
    assert record["data"] == {"hello": "you"}


def test_pusher_js_sees_presence_members_come_and_go(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    channel = "presence-agent.e2e"
    client.wait_for(lambda r: r["type"] == "subscribed" and r["channel"] == channel, "presence")

    async def visit() -> None:
        visitor = await Client.connect(f"{server.ws_url}/app/{KEY}?protocol=7")
        data = json.dumps({"user_id": "visitor", "user_info": {"name": "V"}})
        auth = channel_auth(KEY, SECRET, visitor.socket_id, channel, data)
        answer = await visitor.subscribe(channel, auth=auth, channel_data=data)
        assert sorted(answer["data"]["presence"]["ids"]) == ["node-user", "visitor"]
        added = client.wait_for
        await asyncio.to_thread(
            added, lambda r: r.get("event") == "pusher:member_added", "member_added"
        )
        await visitor.close()

    asyncio.run(visit())
    removed = client.wait_for(lambda r: r.get("event") == "pusher:member_removed", "removal")
    assert removed["data"]["id"] == "visitor"
