"""A model's hostile numbers (and text) never hide a run's end.

The OpenAI driver read any non-negative usage; orjson cannot write an integer past 64
bits, so with ``prompt_tokens`` of 10**20 the final ``agent.status`` and the state were
never published (followers waited for ever, ``wait`` timed out, ``/state`` answered 404
while the index said completed), and 2**63 (written, then summed with the next run's)
poisoned the session's next run the same way. Now every count is bounded where it
enters (:data:`broadcaster.envelope.MAX_WIRE_INT`, 2**53 - 1, which JavaScript reads
exactly), and a run's end is published whatever its data: a final status or state that
JSON cannot carry (a lone surrogate in the model's text) is published and stored
``failed``, saying why."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest

from tests.support.live import Client, LiveServer, StartServer
from tests.support.openai_api import API_KEY, FakeChatAPI, Reply, Script, chunk, sse, text, usage

Connect = Callable[..., Awaitable[Client]]

pytestmark = pytest.mark.timeout(90)


async def final_status(client: Client, channel: str) -> dict[str, object]:
    """The payload of the next final ``agent.status`` on ``channel``."""
    while True:
        message = await client.recv(within=20)
        if message.get("channel") != channel or message["event"] != "agent.status":
            continue
        payload = message["data"]["payload"]
        if payload["status"] in ("completed", "failed"):
            return payload  # type: ignore[no-any-return]


async def demo_on(
    api: FakeChatAPI, reply: Reply, start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[LiveServer, Script]:
    """A demo server whose agent's model is a local OpenAI-compatible API answering
    ``reply`` (the script's ``reply`` may be changed between runs)."""
    script = api.script(reply)
    for name, value in {
        "AGENT_DEMO_DRIVER": "openai",
        "AGENT_OPENAI_BASE_URL": script.base_url,
        "AGENT_OPENAI_API_KEY": API_KEY,
        "AGENT_OPENAI_MODEL": "fake-model",
    }.items():
        monkeypatch.setenv(name, value)
    return await start_server(demo=True), script


@pytest.mark.parametrize("tokens", [10**20, 2**63], ids=["10^20", "2^63"])
async def test_a_huge_token_count_neither_hides_the_end_nor_poisons_the_next_run(
    tokens: int,
    api: FakeChatAPI,
    start_server: StartServer,
    clients: Connect,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reply = sse(text("Hello."), chunk(finish="stop"), usage(tokens, 3, tokens + 3))
    live, _ = await demo_on(api, Reply(reply), start_server, monkeypatch)
    session = f"huge-{tokens.bit_length()}"
    channel = f"agent.{session}"
    follower = await clients(live.app_url())
    await follower.subscribe(channel)
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        for turn in range(2):  # the second run must not be poisoned by the first
            body = {"input": f"Say hello ({turn}).", "session_id": session, "wait": True}
            body["wait_seconds"] = 15
            answer = await http.post("/run", json=body)
            assert answer.status_code == 200, answer.text  # wait returned: the end is out
            assert answer.json()["waited"] is True
            seen = await final_status(follower, channel)
            assert seen["status"] == answer.json()["status"]
            assert seen["usage"]["prompt"] <= 2**53 - 1  # type: ignore[index]
            state = await http.get(f"/api/sessions/{session}/state")
            assert state.status_code == 200, state.text
            assert state.json()["usage"]["prompt"] <= 2**53 - 1
            runs = (await http.get(f"/api/sessions/{session}/runs")).json()["runs"]
            assert [run["status"] for run in runs][-1] == seen["status"]


async def test_a_models_lone_surrogate_is_replaced_where_it_enters(
    api: FakeChatAPI,
    start_server: StartServer,
    clients: Connect,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone surrogate in the model's answer (a valid JSON escape, not UTF-8): the
    driver crashed on it (UnicodeEncodeError) and orjson could write neither the final
    status nor the state. The driver now replaces it with U+FFFD: the run completes,
    and the followers, the state and the next run see the same text."""
    hostile = sse(text("Hello \ud800."), chunk(finish="stop"), usage(5, 3))
    live, _ = await demo_on(api, Reply(hostile), start_server, monkeypatch)
    follower = await clients(live.app_url())
    await follower.subscribe("agent.bad-text")
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        body = {"input": "Say hello.", "session_id": "bad-text", "wait": True, "wait_seconds": 15}
        for _ in range(2):
            answer = await http.post("/run", json=body)
            assert answer.status_code == 200, answer.text
            seen = await final_status(follower, "agent.bad-text")
            assert seen["status"] == "completed", seen
            assert seen["last_response"] == "Hello \ufffd."
        state = await http.get("/api/sessions/bad-text/state")
        assert state.json()["messages"][-1]["content"] == "Hello \ufffd."
