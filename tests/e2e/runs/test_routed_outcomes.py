"""Seed 002's outcomes over real HTTP (one demo server for the module): a capability
that fails is in its step's tool calls on the channel and in the stored state, the
decider sees the failure, the run cannot read as a success, the memory append is on
the channel, blank input is refused, and ``"wait": true`` answers the RunResponse."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.live import Client, StartServer
from tests.support.processes import ServerProcess
from tests.support.reliability import eventually
from tests.support.runs import Event, phases, routed, tool

Connect = Callable[..., Awaitable[Client]]


@pytest.fixture(scope="module")
def demo() -> Iterator[ServerProcess]:
    server = ServerProcess(("--demo",)).start()
    yield server
    server.stop()


async def follow(demo: ServerProcess, clients: Connect, **body: Any) -> tuple[dict, list[Event]]:
    """The routed run and its own events (a capability's inner agent, a run nested
    under its call, left out: see test_routed_runs)."""
    client = await clients(f"{demo.ws_url}/app/agent-key?protocol=7")
    run, channel = await routed(demo.url, client, mode="route", **body)
    return run, [e for e in channel if "parent_execution_id" not in e[2]]


async def state(demo: ServerProcess, url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{demo.url}{url}")
    assert response.status_code == 200, response.text
    snapshot: dict[str, Any] = response.json()
    return snapshot


def step_calls(events: list[Event]) -> list[str]:
    completed = next(p for _, k, p in events if k == "agent.step.completed")
    return [c["name"] for c in completed["tool_calls"]]


async def test_a_capability_that_reports_failure_fails_the_routed_run(
    demo: ServerProcess, clients: Connect
) -> None:
    """``[fail:tool]``: the weather agent inside the capability fails; the routed run
    ends failed with the reason, and the snapshot says so with the result's metadata."""
    run, events = await follow(demo, clients, input="What is the weather in Oslo? [fail:tool]")
    call = tool(events, "agent.tool.completed", "weather_agent")
    assert call["success"] is False
    assert "not an arithmetic expression" in call["error"]
    assert step_calls(events) == ["weather_agent"]
    decider = tool(events, "agent.tool.started", "continuation_decider")
    assert decider["arguments"]["success"] is False  # the decider was asked, and saw it
    final = events[-1][2]
    assert (final["status"], final["stop_reason"]) == ("failed", "error")
    assert final["error_message"].startswith("capability 'weather_agent' reported failure: ")
    assert final["last_response"] is None

    snapshot = await state(demo, final["state_url"])
    assert (snapshot["status"], snapshot["error_message"]) == ("failed", final["error_message"])
    assert snapshot["last_continuation"]["stop_reason"] == "error"
    assert [c["name"] for c in snapshot["steps"][0]["tool_calls"]] == ["weather_agent"]
    result = snapshot["routing"]["result"]
    assert (result["capability"], result["success"]) == ("weather_agent", False)
    assert result["metadata"]["error"] == final["error_message"]
    assert result["metadata"]["duration_ms"] > 0
    assert result["metadata"]["session_id"] == run["session_id"]
    (step_result,) = snapshot["routing"]["results"]
    assert step_result["metadata"]["step_number"] == 1
    assert "not an arithmetic expression" in step_result["metadata"]["error"]
    # The failed turn is remembered as failed, on the channel too.
    memory = tool(events, "agent.tool.started", "session_memory")
    assert memory["arguments"] == {
        "session_id": run["session_id"],
        "capability": "weather_agent",
        "success": False,
    }
    assert snapshot["routing"]["context"]["turns"][-1]["success"] is False


async def test_a_raising_capability_is_in_its_steps_tool_calls(
    demo: ServerProcess, clients: Connect
) -> None:
    """``summarize:`` with nothing to summarize: the capability raises. Its call is
    the step's tool call on the channel and in the stored state, the decider is
    consulted, and the run fails with the error."""
    _, events = await follow(demo, clients, input="summarize:   ")
    assert phases(events)[3:9] == [
        ("agent.step.started", None),
        ("agent.tool.started", "summarize"),
        ("agent.tool.completed", "summarize"),
        ("agent.tool.started", "continuation_decider"),
        ("agent.tool.completed", "continuation_decider"),
        ("agent.continuation", None),
    ]
    call = tool(events, "agent.tool.completed", "summarize")
    assert "non-empty 'text'" in call["error"]
    assert step_calls(events) == ["summarize"]
    verdict = tool(events, "agent.tool.completed", "continuation_decider")
    assert (verdict["success"], verdict["result_summary"]) == (True, "done")
    final = events[-1][2]
    assert (final["status"], final["stop_reason"]) == ("failed", "error")
    assert final["error_message"].startswith("capability 'summarize' failed: ValueError: ")
    snapshot = await state(demo, final["state_url"])
    step = snapshot["steps"][0]
    assert [c["name"] for c in step["tool_calls"]] == ["summarize"]
    assert step["errors"] == 1
    assert snapshot["routing"]["result"]["success"] is False


async def test_the_memory_append_is_on_the_channel(demo: ServerProcess, clients: Connect) -> None:
    run, events = await follow(demo, clients, input="Hello there")
    assert phases(events)[-3:] == [
        ("agent.tool.started", "session_memory"),
        ("agent.tool.completed", "session_memory"),
        ("agent.status", None),
    ]
    remembered = tool(events, "agent.tool.completed", "session_memory")
    assert (remembered["success"], remembered["result_summary"]) == (
        True,
        "turn remembered · 1 kept",
    )
    assert remembered["step_number"] == 1
    _, again = await follow(demo, clients, input="Hello again", session_id=run["session_id"])
    remembered = tool(again, "agent.tool.completed", "session_memory")
    assert remembered["result_summary"] == "turn remembered · 2 kept"


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
async def test_blank_input_is_refused_with_422(demo: ServerProcess, text: str) -> None:
    async with httpx.AsyncClient() as http:
        for mode in ("route", "agent"):
            response = await http.post(f"{demo.url}/run", json={"input": text, "mode": mode})
            assert response.status_code == 422, response.text
            assert "input" in response.json()["error"]
    if text.strip() == "" and text:
        assert "blank" in response.json()["error"]


async def test_wait_answers_the_run_response_when_the_run_ends(demo: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{demo.url}/run",
            json={"input": "What is the weather in Oslo?", "mode": "route", "wait": True},
        )
        assert response.status_code == 200, response.text
        answer = response.json()
        assert (answer["status"], answer["stop_reason"], answer["waited"]) == (
            "completed",
            "completed",
            True,
        )
        assert answer["output"].startswith("In Oslo it is")
        assert answer["error"] is None
        result = answer["result"]
        assert (result["capability"], result["success"]) == ("weather_agent", True)
        assert result["output"] == answer["output"]
        assert result["metadata"]["duration_ms"] > 0
        assert result["metadata"]["capabilities"] == ["weather_agent"]
        metadata = answer["metadata"]
        assert (metadata["mode"], metadata["steps"]) == ("route", 1)
        assert metadata["duration_ms"] >= result["metadata"]["duration_ms"]
        assert metadata["usage"]["total"] > 0
        assert answer["state_url"] == f"/api/sessions/{answer['session_id']}/state"

        failed = await http.post(
            f"{demo.url}/run",
            json={"input": "Weather in Oslo? [fail:tool]", "mode": "route", "wait": True},
        )
        assert failed.status_code == 200, failed.text
        body = failed.json()
        assert (body["status"], body["output"]) == ("failed", None)
        assert body["error"].startswith("capability 'weather_agent' reported failure")
        assert body["result"]["success"] is False

        agent = await http.post(
            f"{demo.url}/run", json={"input": "What is 6 * 7?", "mode": "agent", "wait": True}
        )
        assert agent.status_code == 200, agent.text
        body = agent.json()
        assert (body["status"], body["result"], body["metadata"]["mode"]) == (
            "completed",
            None,
            "agent",
        )
        assert body["output"] == "6 * 7 = 42."

        routed_math = await http.post(
            f"{demo.url}/run", json={"input": "What is 6 * 7?", "mode": "route", "wait": True}
        )
        body = routed_math.json()
        assert (body["output"], body["result"]["capability"]) == ("6 * 7 = 42.", "weather_agent")


async def test_a_wait_that_runs_out_answers_202_with_a_note(demo: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{demo.url}/run",
            json={"input": "Weather in Oslo?", "wait": True, "wait_seconds": 0.2, "pace_ms": 400},
        )
        assert response.status_code == 202, response.text
        answer = response.json()
        assert answer["waited"] is False
        assert "did not end within 0.2 s (wait_seconds)" in answer["note"]
        assert f"/api/sessions/{answer['session_id']}/events?until=final" in answer["note"]
        assert "status" not in answer
        for bad in (0, -1, 301, "soon"):
            refused = await http.post(
                f"{demo.url}/run", json={"input": "hi", "wait": True, "wait_seconds": bad}
            )
            assert refused.status_code == 422, refused.text
            assert "wait_seconds" in refused.json()["error"]


@pytest.mark.parametrize(("asked", "limit"), [(2, 2), (20, 5), (None, 5)])
async def test_a_routed_runs_step_limit_is_the_requests_up_to_five(
    demo: ServerProcess, clients: Connect, asked: int | None, limit: int
) -> None:
    body: dict[str, Any] = {"input": "Hello", "trace": True}
    if asked is not None:
        body["max_steps"] = asked
    _, events = await follow(demo, clients, **body)
    trace = next(p for _, k, p in events if k == "agent.continuation")
    steps = next(e for e in trace["evaluations"] if e["criterion"] == "StepsLimit")
    assert steps["reason"].endswith(f"step 1 of {limit}")


async def test_a_wait_whose_feed_ends_answers_202_saying_why(start_server: StartServer) -> None:
    """The server closing its streams (shutdown) ends a wait at once: the usual 202,
    with a note that says why, not a timeout."""
    live = await start_server(demo=True)
    async with httpx.AsyncClient(timeout=30) as http:
        waiting = asyncio.create_task(
            http.post(
                f"{live.url}/run",
                json={
                    "input": "Weather in Oslo?",
                    "wait": True,
                    "wait_seconds": 60,
                    "pace_ms": 400,
                },
            )
        )
        await eventually(lambda: live.node.streams, "the wait's feed to subscribe")
        live.node.close_streams()
        response = await waiting
    assert response.status_code == 202, response.text
    note = response.json()["note"]
    assert note.startswith("the run cannot be followed here now (")
    assert "until=final" in note
