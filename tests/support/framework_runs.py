"""One run per framework, published through any publisher: what the tests share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent as OpenAIAgent
from agents import function_tool, set_tracing_disabled
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.usage import RequestUsage

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations.langgraph import broadcast_langgraph
from agent_core.integrations.openai_agents import broadcast_openai_agents
from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai
from broadcaster.publishers import Publisher, StateStore
from tests.support.graphs import weather_graph
from tests.support.live import Client
from tests.support.openai_agents_model import ScriptedModel, call, text

QUESTION = "What is the weather in Oslo?"
ANSWER = "It is sunny in Oslo today."

Runner = Callable[..., Awaitable[Any]]


def weather(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


# -- pydantic-ai: FunctionModel, streamed ---------------------------------------------


def _pydantic_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        call_part = ToolCallPart("weather", {"city": "Oslo"}, tool_call_id="call_p1")
        return ModelResponse(
            parts=[call_part], usage=RequestUsage(input_tokens=12, output_tokens=7)
        )
    return ModelResponse(
        parts=[TextPart(ANSWER)], usage=RequestUsage(input_tokens=20, output_tokens=6)
    )


async def _pydantic_stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
    if len(messages) == 1:
        yield {
            0: DeltaToolCall(name="weather", json_args='{"city": "Oslo"}', tool_call_id="call_p1")
        }
        return
    for word in ANSWER.split(" "):
        yield word + " " if not word.endswith(".") else word


def pydantic_agent(fail: bool = False) -> Agent[None, str]:
    model = FunctionModel(_pydantic_reply, stream_function=_pydantic_stream)
    agent = Agent(model, name="weather-agent", tools=[weather])
    if fail:

        @agent.tool_plain
        def broken() -> str:
            """Always fails."""
            raise RuntimeError("boom")

    return agent


async def run_pydantic(publisher: Publisher, session_id: str, **kw: Any) -> Any:
    return await broadcast_pydantic_ai(pydantic_agent(), QUESTION, publisher, session_id, **kw)


# -- OpenAI Agents SDK: a scripted Model, with a handoff ----------------------------


def openai_agent() -> OpenAIAgent[Any]:
    set_tracing_disabled(True)
    billing = OpenAIAgent(name="Forecaster", model=ScriptedModel([[text(ANSWER)]]))
    script = [
        [call("weather", '{"city": "Oslo"}', "call_o1")],
        [call("transfer_to_forecaster", "{}", "call_o2")],
    ]
    return OpenAIAgent(
        name="Assistant",
        model=ScriptedModel(script),
        tools=[function_tool(weather)],
        handoffs=[billing],
    )


async def run_openai(publisher: Publisher, session_id: str, **kw: Any) -> Any:
    return await broadcast_openai_agents(openai_agent(), QUESTION, publisher, session_id, **kw)


# -- LangGraph: langchain-core's fake chat model ---------------------------------------


async def run_langgraph(publisher: Publisher, session_id: str, **kw: Any) -> Any:
    graph = weather_graph(ANSWER)
    given = {"messages": [("user", QUESTION)]}
    return await broadcast_langgraph(graph, given, publisher, session_id, **kw)


RUNS: dict[str, Runner] = {
    "pydantic-ai": run_pydantic,
    "openai-agents": run_openai,
    "langgraph": run_langgraph,
}
CALL_IDS = {"pydantic-ai": "call_p1", "openai-agents": "call_o1", "langgraph": "call_w1"}
__all__ = ["ANSWER", "CALL_IDS", "QUESTION", "RUNS", "AdapterOptions", "StateStore"]


async def envelopes_on(client: Client, within: float = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        message = await client.recv(within)
        if not message["event"].startswith("agent."):
            continue
        got.append(message["data"])
        if message["event"] == "agent.status" and message["data"]["payload"]["status"] in (
            "completed",
            "failed",
        ):
            return got
