"""Run outcomes through the public API (issue 14): a run that fails on its last allowed
step reports failed with its error in the envelopes and in the stored snapshot, the
snapshot explains the stop, step numbers keep counting across a session's runs, and a
stop before step 1 goes out as ``agent.continuation`` step 0."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import orjson

from agent_core.adapters.broadcasting import AdapterOptions, AgentEventAdapter
from agent_core.app.demo_tools import FAIL_MODEL, FAIL_TOOL, demo_driver
from agent_core.builder import AgentBuilder
from agent_core.state import AgentState, AgentStatus
from broadcaster.envelope import json_schema
from broadcaster.publishers import RecordingPublisher
from tests.support.live import StartServer
from tests.support.runs import Connect, Event, full_run, read_run, start_run, subscribe

VALIDATOR = jsonschema.Draft202012Validator(json_schema())


async def snapshot_of(base_url: str, state_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{base_url}{state_url}")
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def of(events: list[Event], kind: str) -> list[Any]:
    return [payload for _, k, payload in events if k == kind]


async def test_a_model_failure_on_the_last_allowed_step_is_reported_failed(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    question = f"What is the weather in Oslo? {FAIL_MODEL}"
    run, events = await full_run(live.url, client, input=question, max_steps=2, trace=True)

    final = events[-1][2]
    assert (final["status"], final["stop_reason"]) == ("failed", "error")
    assert "failed on purpose" in final["error_message"]
    (last,) = [c for c in of(events, "agent.continuation") if c["step_number"] == 2]
    assert (last["stop_reason"], last["resolved_by"]) == ("error", "ErrorPolicyCriterion")
    assert {e["criterion"] for e in last["evaluations"] if e["decision"] == "forbid"} == {
        "StepsLimit",
        "ErrorPolicyCriterion",
    }

    snapshot = await snapshot_of(live.url, run["state_url"])
    assert snapshot["status"] == "failed"
    assert snapshot["error_message"] == final["error_message"]
    assert snapshot["last_continuation"] == {
        "should_continue": False,
        "stop_reason": "error",
        "resolved_by": "ErrorPolicyCriterion",
    }


async def test_a_tool_failure_on_the_last_allowed_step_is_reported_failed(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    question = f"What is the weather in Oslo? {FAIL_TOOL}"
    _, events = await full_run(live.url, client, input=question, max_steps=2)
    final = events[-1][2]
    assert (final["status"], final["stop_reason"]) == ("failed", "error")
    assert "not an arithmetic expression" in final["error_message"]
    (failed_call,) = [t for t in of(events, "agent.tool.completed") if not t["success"]]
    assert failed_call["tool_name"] == "calculator"


async def test_the_snapshot_explains_a_completed_run_and_steps_keep_counting(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    first, _ = await full_run(live.url, client)
    await client.close()  # an unread client would stall its own close handshake
    snapshot = await snapshot_of(live.url, first["state_url"])
    assert snapshot["last_continuation"] == {
        "should_continue": False,
        "stop_reason": "completed",
        "resolved_by": "ToolCallPresenceCheck",
    }
    assert "error_message" not in snapshot

    second = await start_run(live.url, session_id=first["session_id"], input="And in Lima?")
    watcher = await clients(live.app_url())
    await subscribe(watcher, second["channel"], second["position"])
    events = await read_run(watcher)
    assert [s["step_number"] for s in of(events, "agent.step.started")] == [4, 5, 6]
    assert events[-1][2]["step_count"] == 6
    snapshot = await snapshot_of(live.url, second["state_url"])
    assert snapshot["step_count"] == 6
    assert [s["step_number"] for s in snapshot["steps"]] == [4, 5, 6]


async def test_a_stop_before_the_first_step_is_published_as_step_zero() -> None:
    publisher = RecordingPublisher()
    adapter = AgentEventAdapter(
        publisher, "s-0", "x-0", options=AdapterOptions(include_continuation_trace=True)
    )

    def broken(state: AgentState) -> bool:
        raise RuntimeError("bad criterion")

    builder = AgentBuilder().with_driver(demo_driver("Oslo")).with_criteria(broken)
    state = await adapter.install(builder).build().run("What is the weather in Oslo?")
    assert state.status is AgentStatus.FAILED
    envelopes = [orjson.loads(e.to_json()) for e in publisher.envelopes()]
    for envelope in envelopes:
        VALIDATOR.validate(envelope)
    assert [e["type"] for e in envelopes] == ["agent.status", "agent.continuation", "agent.status"]
    continuation, final = envelopes[1]["payload"], envelopes[2]["payload"]
    assert (continuation["step_number"], continuation["resolved_by"]) == (0, "broken")
    assert (final["status"], final["stop_reason"]) == ("failed", "error")
    assert final["error_message"] == "broken raised RuntimeError: bad criterion"
