"""A small LangGraph agent on langchain-core's fake chat model: an ``agent`` node
that asks for a tool, a ``tools`` node (langgraph's ToolNode), then an answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

ANSWER = "It is sunny in Oslo today."


@tool
def get_weather(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


class ToolCallingFakeChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, streaming the scripted messages' tool calls
    and usage too (the generic one streams only their text). Its answers are scripted,
    so binding tools (as ``create_react_agent`` does) changes nothing."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFakeChatModel:
        return self

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = next(self.messages)
        assert isinstance(message, AIMessage)
        text = message.content if isinstance(message.content, str) else ""
        for token in re.split(r"(\s)", text) if text else []:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
            if run_manager is not None:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk
        calls = [
            {"name": c["name"], "args": orjson.dumps(c["args"]).decode(), "id": c["id"], "index": i}
            for i, c in enumerate(message.tool_calls)
        ]
        last = AIMessageChunk(
            content="", id=message.id, tool_call_chunks=calls, usage_metadata=message.usage_metadata
        )
        yield ChatGenerationChunk(message=last)


def weather_model(answer: str = ANSWER) -> ToolCallingFakeChatModel:
    """Asks for ``get_weather`` in Oslo, then answers ``answer``."""
    return ToolCallingFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_w1"}],
                    usage_metadata={"input_tokens": 12, "output_tokens": 7, "total_tokens": 19},
                ),
                AIMessage(
                    content=answer,
                    usage_metadata={"input_tokens": 20, "output_tokens": 6, "total_tokens": 26},
                ),
            ]
        )
    )


def weather_graph(answer: str = ANSWER) -> Any:
    model = weather_model(answer)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([get_weather]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    builder.add_edge("agent", END)
    return builder.compile(name="weather")


@tool
def broken_tool() -> str:
    """Always fails."""
    raise RuntimeError("boom")


def broken_tool_graph(answer: str = ANSWER) -> Any:
    """The agent asks for ``broken_tool``, which raises (LangGraph's ToolNode raises it
    on by default)."""
    model = ToolCallingFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[{"name": "broken_tool", "args": {}, "id": "call_b1"}],
                    usage_metadata={"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
                ),
                AIMessage(content=answer),
            ]
        )
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([broken_tool]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(name="broken")
