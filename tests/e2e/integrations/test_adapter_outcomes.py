"""Every framework adapter keeps agent_core's rule (docs/agent_core.md): a run is
``failed`` exactly when its stop reason is ``error``, and the final status, the last
``agent.continuation`` (and each step's summary) and the stored snapshot agree. Per
adapter and per case: a normal run, a tool that raises, the framework's own limit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from agents import Agent as OpenAIAgent
from agents import function_tool
from agents.exceptions import MaxTurnsExceeded
from langgraph.errors import GraphRecursionError
from pydantic_ai import Agent
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations.langgraph import broadcast_langgraph
from agent_core.integrations.openai_agents import broadcast_openai_agents
from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai
from agent_core.slim import SlimSerializationConfig
from broadcaster.envelope import Envelope
from broadcaster.publishers import RecordingPublisher
from tests.support.framework_runs import ANSWER, QUESTION, RUNS, openai_agent, pydantic_agent
from tests.support.graphs import broken_tool_graph, weather_graph
from tests.support.openai_agents_model import ScriptedModel, call, text

TRACE = AdapterOptions(include_continuation_trace=True)
SEED_004_TYPES = {"tool_execution", "final", "error"}


@dataclass
class Outcome:
    envelopes: list[Envelope]
    snapshot: dict[str, Any]
    raised: BaseException | None

    def of(self, kind: str) -> list[Any]:
        return [e.payload for e in self.envelopes if e.type == kind]


class KeptState:
    """A state store that keeps what it is given (the snapshot the server would get)."""

    def __init__(self) -> None:
        self.saved: list[bytes] = []

    async def save(self, channel: str, snapshot: bytes) -> None:
        self.saved.append(snapshot)


async def outcome(run: Callable[..., Awaitable[Any]]) -> Outcome:
    publisher, store = RecordingPublisher(), KeptState()
    raised: BaseException | None = None
    try:
        await run(publisher, "out-1", options=TRACE, state_store=store)
    except Exception as exc:
        raised = exc
    assert len(store.saved) == 1
    return Outcome(publisher.envelopes(), orjson.loads(store.saved[0]), raised)


def assert_agent_cores_rule(result: Outcome, status: str, stop_reason: str) -> None:
    final = result.envelopes[-1].payload
    assert result.envelopes[-1].type == "agent.status"
    assert (final.status, final.stop_reason) == (status, stop_reason)  # type: ignore[union-attr]
    assert (final.status == "failed") == (stop_reason == "error")  # type: ignore[union-attr]
    last = result.of("agent.continuation")[-1]
    assert (last.should_continue, last.stop_reason) == (False, stop_reason)
    steps = result.of("agent.step.completed")
    assert (steps[-1].continuation.should_continue, steps[-1].continuation.stop_reason) == (
        False,
        stop_reason,
    )
    for step in steps[:-1]:  # the framework went on after every other step
        assert step.continuation.should_continue is True
    snapshot = result.snapshot
    assert snapshot["status"] == status
    assert snapshot["last_continuation"]["stop_reason"] == stop_reason
    assert snapshot["last_continuation"]["should_continue"] is False
    assert snapshot["step_count"] == len(steps) == final.step_count  # type: ignore[union-attr]
    started = {p.tool_call_id for p in result.of("agent.tool.started")}
    assert started == {p.tool_call_id for p in result.of("agent.tool.completed")}
    for step, summary in zip(snapshot["steps"], steps, strict=True):
        assert step["type"] in SEED_004_TYPES
        assert step["has_tool_calls"] == bool(step["tool_calls"]) == summary.has_tool_calls
        if step["finish_reason"] == "tool_calls":
            assert step["has_tool_calls"], step
        assert [c["id"] for c in step["tool_calls"]] == [c.id for c in summary.tool_calls]


def assert_tool_failed(result: Outcome, call_id: str) -> None:
    done = next(p for p in result.of("agent.tool.completed") if p.tool_call_id == call_id)
    assert done.success is False
    assert "boom" in (done.error or "")
    step = next(
        s for s in result.snapshot["steps"] if call_id in [c["id"] for c in s["tool_calls"]]
    )
    assert (step["type"], step["errors"]) == ("error", 1)


# -- normal runs ----------------------------------------------------------------------


@pytest.mark.parametrize("framework", sorted(RUNS))
async def test_a_normal_run_completes_and_its_snapshot_uses_seed_004s_step_types(
    framework: str,
) -> None:
    result = await outcome(RUNS[framework])
    assert result.raised is None
    assert_agent_cores_rule(result, "completed", "completed")
    types = [s["type"] for s in result.snapshot["steps"]]
    handoff = ["tool_execution"] if framework == "openai-agents" else []
    assert types == ["tool_execution", *handoff, "final"]
    assert result.snapshot["messages"][0]["content"] == QUESTION


# -- a tool that raises ---------------------------------------------------------------


def _asks_for_broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("broken", {}, tool_call_id="call_pb")])
    return ModelResponse(parts=[TextPart(ANSWER)])


async def test_pydantic_ai_a_raising_tool_completes_unsuccessfully_and_fails_the_run() -> None:
    agent = Agent(FunctionModel(_asks_for_broken), name="broken")

    @agent.tool_plain
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("boom")

    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        return await broadcast_pydantic_ai(agent, QUESTION, publisher, session, stream=False, **kw)

    result = await outcome(run)
    assert isinstance(result.raised, RuntimeError)
    assert_agent_cores_rule(result, "failed", "error")
    assert_tool_failed(result, "call_pb")
    assert "RuntimeError: boom" in result.snapshot["error_message"]


async def test_openai_agents_a_raising_tool_is_unsuccessful_and_the_run_goes_on() -> None:
    @function_tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("boom")

    script = [[call("broken", "{}", "call_ob")], [text(ANSWER)]]
    agent = OpenAIAgent(name="Assistant", model=ScriptedModel(script), tools=[broken])

    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        return await broadcast_openai_agents(agent, QUESTION, publisher, session, **kw)

    result = await outcome(run)
    assert result.raised is None
    assert_agent_cores_rule(result, "completed", "completed")
    assert_tool_failed(result, "call_ob")
    # The model was told, as the SDK does by default.
    assert "error occurred" in result.of("agent.tool.completed")[0].result_summary


async def test_openai_agents_a_tool_error_formatter_of_ones_own_still_decides_the_text() -> None:
    from agents import RunConfig

    @function_tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("boom")

    script = [[call("broken", "{}", "call_ob")], [text(ANSWER)]]
    agent = OpenAIAgent(name="Assistant", model=ScriptedModel(script), tools=[broken])
    config = RunConfig(tool_error_formatter=lambda args: f"custom: {args.tool_name}")
    publisher = RecordingPublisher()
    await broadcast_openai_agents(agent, QUESTION, publisher, "out-1", run_config=config)
    done = next(e.payload for e in publisher.envelopes() if e.type == "agent.tool.completed")
    assert (done.success, done.result_summary) == (False, "custom: broken")  # type: ignore[union-attr]


async def test_langgraph_a_raising_tool_completes_unsuccessfully_and_fails_the_run() -> None:
    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        given = {"messages": [("user", QUESTION)]}
        return await broadcast_langgraph(broken_tool_graph(), given, publisher, session, **kw)

    result = await outcome(run)
    assert isinstance(result.raised, RuntimeError)
    assert_agent_cores_rule(result, "failed", "error")
    assert_tool_failed(result, "call_b1")


# -- the framework's own limit: agent_core's steps_limit (status completed) -----------


async def test_pydantic_ai_a_request_limit_ends_as_agent_cores_steps_limit() -> None:
    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        limits = UsageLimits(request_limit=1)
        return await RUNS["pydantic-ai"](publisher, session, usage_limits=limits, **kw)

    result = await outcome(run)
    assert isinstance(result.raised, UsageLimitExceeded)
    assert_agent_cores_rule(result, "completed", "steps_limit")
    assert [s["type"] for s in result.snapshot["steps"]] == ["tool_execution"]


async def test_openai_agents_max_turns_ends_as_agent_cores_steps_limit() -> None:
    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        agent = openai_agent()
        return await broadcast_openai_agents(agent, QUESTION, publisher, session, max_turns=1, **kw)

    result = await outcome(run)
    assert isinstance(result.raised, MaxTurnsExceeded)
    assert_agent_cores_rule(result, "completed", "steps_limit")
    assert [s["type"] for s in result.snapshot["steps"]] == ["tool_execution"]


async def test_langgraph_its_recursion_limit_ends_as_agent_cores_steps_limit() -> None:
    async def run(publisher: Any, session: str, **kw: Any) -> Any:
        given = {"messages": [("user", QUESTION)]}
        config = {"recursion_limit": 2}
        return await broadcast_langgraph(
            weather_graph(), given, publisher, session, config=config, **kw
        )

    result = await outcome(run)
    assert isinstance(result.raised, GraphRecursionError)
    assert_agent_cores_rule(result, "completed", "steps_limit")
    assert [s["type"] for s in result.snapshot["steps"]] == ["tool_execution"]
    first = result.snapshot["steps"][0]
    assert (first["finish_reason"], first["tool_calls"]) == (
        "tool_calls",
        [{"id": "call_w1", "name": "get_weather"}],
    )


# -- the slim preset -----------------------------------------------------------------


async def test_a_snapshot_keeps_the_slim_presets_limits() -> None:
    long_question = "Oslo? " * 1000
    publisher, store = RecordingPublisher(), KeptState()
    await broadcast_pydantic_ai(
        pydantic_agent(), long_question, publisher, "out-1", state_store=store
    )
    snapshot = orjson.loads(store.saved[0])
    limit = SlimSerializationConfig.standard().max_content_length
    assert snapshot["messages"][0]["content"] == long_question[:limit] + "..."
    assert snapshot["last_continuation"] is not None  # the preset agent_core runs store
