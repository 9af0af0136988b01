"""One large model answer, end to end: the demo server (a real process) runs the OpenAI
driver against a chat-completions server on loopback that streams deltas of hundreds of
thousands of characters. Every viewer, live and resumed from the run's start, over
WebSocket and SSE, gets every chunk up to the final status, and the chunks join to
exactly the text the model sent (once, two such deltas became one publication over
1 MiB, and every viewer was cut or left hanging)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.live import Client
from tests.support.openai_api import API_KEY, FakeChatAPI, Reply, chunk, sse, text, usage
from tests.support.processes import ServerFactory
from tests.support.sse import SseReader
from tests.support.sse import sse as open_sse

Connect = Callable[..., Awaitable[Client]]

pytestmark = pytest.mark.timeout(120)

# Multibyte characters (two, three and four bytes), quotes and line breaks to escape.
UNIT = 'The model says "hello" — grüße, 😀 done.\n'


def answer(deltas: int, length: int) -> list[str]:
    """``deltas`` different texts of ``length`` characters each."""
    whole = (UNIT * (deltas * length // len(UNIT) + 1))[: deltas * length]
    return [whole[n * length : (n + 1) * length] for n in range(deltas)]


@dataclass
class View:
    """What one viewer saw of the run: the chunks (index, text) and event types."""

    chunks: list[tuple[int, str]] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    resume: dict[str, Any] | None = None

    def see(self, kind: str, envelope: dict[str, Any]) -> bool:
        """Note one envelope; True at the final status."""
        self.types.append(kind)
        payload = envelope["payload"]
        if kind == "agent.stream.chunk":
            self.chunks.append((payload["chunk_index"], payload["chunk"]))
        return kind == "agent.status" and payload["status"] in ("completed", "failed")


async def watch_ws(client: Client, channel: str, resumed: bool) -> View:
    view = View()
    done = False
    while not (done and (view.resume is not None or not resumed)):
        message = await client.recv(within=30)
        if message.get("channel") != channel:
            continue
        if message["event"] == "broadcaster:resume":
            view.resume = message["data"]
        elif message["event"].startswith("agent."):
            done = view.see(message["event"], message["data"]) or done
    return view


async def watch_sse(reader: SseReader, resumed: bool) -> View:
    view = View()
    done = False
    while not (done and (view.resume is not None or not resumed)):
        event = await reader.next(within=30)
        assert event.comment is None or not event.comment.startswith("ended"), event
        if event.comment is not None:
            continue
        if event.event == "broadcaster:resume":
            view.resume = event.json
        elif event.event.startswith("agent."):
            done = view.see(event.event, event.json) or done
    return view


@pytest.mark.parametrize(
    ("deltas", "length"),
    [pytest.param(2, 600_000, id="2x600k"), pytest.param(12, 200_000, id="12x200k")],
)
async def test_every_viewer_gets_every_chunk_of_a_large_answer(
    deltas: int,
    length: int,
    api: FakeChatAPI,
    server_factory: ServerFactory,
    clients: Connect,
) -> None:
    parts = answer(deltas, length)
    reply = sse(*(text(part) for part in parts), chunk(finish="stop"), usage(10, deltas))
    assert max(len(piece) for piece in reply) < 1 << 20  # within the driver's max_line_bytes
    script = api.script(Reply(reply))
    server = server_factory(
        "--demo",
        env={
            "AGENT_DEMO_DRIVER": "openai",
            "AGENT_OPENAI_BASE_URL": script.base_url,
            "AGENT_OPENAI_API_KEY": API_KEY,
            "AGENT_OPENAI_MODEL": "fake-model",
        },
    )
    session = f"large-{secrets.token_hex(4)}"
    channel = f"agent.{session}"
    app_url = f"{server.ws_url}/app/agent-key?protocol=7"

    watcher = await clients(app_url)
    assert (await watcher.subscribe(channel))["event"] == "pusher_internal:subscription_succeeded"
    async with open_sse(f"{server.url}/api/channels/{channel}/events") as follower:
        assert (await follower.next()).comment == channel  # subscribed
        async with httpx.AsyncClient() as http:
            started = await http.post(
                f"{server.url}/run", json={"input": "Say a lot.", "session_id": session}
            )
        assert started.status_code == 202, started.text
        position = started.json()["position"]
        live = await asyncio.gather(watch_ws(watcher, channel, False), watch_sse(follower, False))

    resumer = await clients(app_url)
    answer_ = await resumer.subscribe(channel, position=position)
    assert answer_["event"] == "pusher_internal:subscription_succeeded"
    async with open_sse(f"{server.url}/api/channels/{channel}/events?since={position}") as reader:
        resumed = await asyncio.gather(watch_ws(resumer, channel, True), watch_sse(reader, True))

    sent = "".join(parts)
    for view in (*live, *resumed):
        assert view.types[0] == "agent.status"  # in_progress: from the run's start
        assert view.types[-1] == "agent.status"
        assert [index for index, _ in view.chunks] == list(range(len(view.chunks)))
        assert "".join(piece for _, piece in view.chunks) == sent
    assert all(view.resume is not None and view.resume["recovered"] for view in resumed)
    assert len(live[0].chunks) >= len(sent.encode()) // 8192  # chunks within the bound
