"""SSE ``?since=0`` (from the start of the kept history) and ``?until=final`` (the
stream ends after the run's final ``agent.status``, so ``curl -N`` returns)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.live import LiveServer, StartServer
from tests.support.sse import SseEvent, is_final, sse


def parse(text: str) -> list[SseEvent]:
    """A whole SSE body as events and comments."""
    found: list[SseEvent] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, list[str]] = {}
        comment = None
        for line in block.split("\n"):
            if line.startswith(":"):
                comment = line[1:].strip()
                continue
            name, _, value = line.partition(": ")
            fields.setdefault(name, []).append(value)
        found.append(
            SseEvent(
                id=(fields.get("id") or [None])[0],
                event=(fields.get("event") or [""])[0],
                data="\n".join(fields.get("data", [])),
                comment=comment if not fields else None,
            )
        )
    return found


async def run_to_end(live: LiveServer, **body: object) -> dict[str, object]:
    body.setdefault("input", "What is 6 * 7?")
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{live.url}/run", json={**body, "wait": True})
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


async def test_until_final_ends_the_stream_after_the_runs_final_status(
    start_server: StartServer,
) -> None:
    """A plain GET returns: the body ends after the final status, with a comment."""
    live = await start_server(demo=True)
    run = await run_to_end(live)
    session, position = run["session_id"], run["position"]
    urls = [
        f"/api/sessions/{session}/events?since={position}&until=final",
        f"/api/channels/agent.{session}/events?until=final&since={position}",
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            response = await http.get(f"{live.url}{url}")
            assert response.status_code == 200, response.text
            events = parse(response.text)
            envelopes = [e for e in events if e.event.startswith("agent.")]
            assert envelopes[0].json["payload"]["status"] == "in_progress"
            assert is_final(envelopes[-1])
            assert envelopes[-1].json["execution_id"] == run["execution_id"]
            assert events[-1].comment == "ended: the run's final agent.status (until=final)"


async def test_until_final_ends_a_live_follow_when_the_run_ends(
    start_server: StartServer,
) -> None:
    """Opened before the run ends, the stream ends with it."""
    live = await start_server(demo=True)
    async with httpx.AsyncClient(timeout=30) as http:
        start = await http.post(f"{live.url}/run", json={"input": "hi", "pace_ms": 50})
    run = start.json()
    url = f"{live.url}/api/sessions/{run['session_id']}/events?since={run['position']}"
    async with sse(url + "&until=final") as reader:
        seen = []
        while True:
            event = await reader.next()
            seen.append(event)
            if event.comment and event.comment.startswith("ended:"):
                break
        with pytest.raises(EOFError):
            await reader.next()
    assert is_final([e for e in seen if e.event.startswith("agent.")][-1])


async def test_since_zero_streams_from_the_start_of_the_kept_history(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True, history_size=4)
    for n in range(6):
        await live.node.publish("1", ["kept"], "e", json.dumps({"n": n}))
    async with sse(f"{live.url}/api/channels/kept/events?since=0") as reader:
        events = [await reader.events() for _ in range(5)]
    assert [json.loads(e.data)["n"] for e in events[:4]] == [2, 3, 4, 5]  # the last 4 kept
    assert events[4].event == "broadcaster:resume"
    assert json.loads(events[4].data)["recovered"] is True

    # A channel that keeps nothing: live from now on (no history to start from).
    async with sse(f"{live.url}/api/channels/empty/events?since=0") as reader:
        assert (await reader.next()).comment == "empty"
        await live.node.publish("1", ["empty"], "e", "{}")
        assert (await reader.events()).event == "e"


async def test_since_zero_on_a_session_starts_at_its_first_run(
    start_server: StartServer,
) -> None:
    """Two runs kept: since=0 starts at the first one's first event, and until=final
    ends after the first run's final status."""
    live = await start_server(demo=True)
    first = await run_to_end(live)
    await run_to_end(live, session_id=first["session_id"], input="Hello")
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(
            f"{live.url}/api/sessions/{first['session_id']}/events?since=0&until=final"
        )
    assert response.status_code == 200, response.text
    envelopes = [e for e in parse(response.text) if e.event.startswith("agent.")]
    assert envelopes[0].id is not None
    assert envelopes[0].id.endswith(":1")
    assert envelopes[0].json["payload"]["status"] == "in_progress"
    assert {e.json["execution_id"] for e in envelopes} == {first["execution_id"]}
    assert is_final(envelopes[-1])


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/api/channels/c/events?until=never", "until: expected 'final'"),
        ("/api/channels/c/events?until=", "until: expected 'final'"),
        ("/api/sessions/s/events?until=FINAL", "until: expected 'final'"),
        ("/api/channels/c/events?since=00", "expected '<epoch>:<offset>'"),
    ],
)
async def test_bad_until_and_since_values_get_400_with_a_message(
    live: LiveServer, path: str, says: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{live.url}{path}")
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]


async def test_since_zero_elsewhere_says_where_it_is_served(start_server: StartServer) -> None:
    """The Vercel AI stream resumes from positions only: since=0 gets a 400 naming the
    endpoints that serve it."""
    live = await start_server(demo=True)
    run = await run_to_end(live)
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{live.url}/vercel-ai/{run['session_id']}/stream?since=0")
    assert response.status_code == 400, response.text
    assert "/api/sessions/{id}/events" in response.json()["error"]
