"""The scripted driver: streamed text and tool calls, failures, exhaustion."""

from __future__ import annotations

import pytest

from agent_core.drivers.base import (
    ModelRequest,
    ResponseCompleted,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    complete,
)
from agent_core.drivers.scripted import (
    ScriptedDriver,
    ScriptedFailure,
    ScriptedResponse,
    call,
    word_chunks,
)
from agent_core.errors import ModelError, ModelTimeoutError, RateLimitError
from agent_core.messages import FinishReason, Message

REQUEST = ModelRequest(messages=(Message.user("hello there"),))


async def events(driver: ScriptedDriver) -> list[StreamEvent]:
    return [event async for event in driver.stream(REQUEST)]


async def test_streams_text_chunks_then_the_complete_response() -> None:
    driver = ScriptedDriver([ScriptedResponse(text="Hello big world")])
    got = await events(driver)
    assert got[:3] == [TextDelta(text="Hello"), TextDelta(text=" big"), TextDelta(text=" world")]
    assert isinstance(got[-1], ResponseCompleted)
    response = got[-1].response
    assert (response.content, response.finish_reason) == ("Hello big world", FinishReason.STOP)
    assert response.usage.total == response.usage.prompt + response.usage.completion > 0
    assert driver.requests == [REQUEST]


async def test_streams_tool_calls() -> None:
    weather = call("get_weather", "call_1", city="Oslo")
    driver = ScriptedDriver([ScriptedResponse(tool_calls=(weather,))])
    got = await events(driver)
    assert got[0] == ToolCallDelta(index=0, id="call_1", name="get_weather")
    assert got[1] == ToolCallDelta(index=0, arguments='{"city": "Oslo"}')
    response = await complete(ScriptedDriver([ScriptedResponse(tool_calls=(weather,))]), REQUEST)
    assert response.tool_calls == (weather,)
    assert response.finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("error", [ModelError("x"), RateLimitError("y"), ModelTimeoutError("z")])
async def test_scripted_failures_raise_after_their_chunks(error: ModelError) -> None:
    driver = ScriptedDriver([ScriptedFailure(error, chunks_before=("par", "tial"))])
    seen: list[StreamEvent] = []

    async def drain() -> None:
        async for event in driver.stream(REQUEST):
            seen.append(event)

    with pytest.raises(type(error)):
        await drain()
    assert seen == [TextDelta(text="par"), TextDelta(text="tial")]


async def test_turn_may_be_a_function_of_the_request() -> None:
    driver = ScriptedDriver([lambda request: ScriptedResponse(text=request.messages[-1].content)])
    assert (await complete(driver, REQUEST)).content == "hello there"


async def test_exhausted_script_raises_a_model_error() -> None:
    driver = ScriptedDriver([ScriptedResponse(text="one")])
    await complete(driver, REQUEST)
    assert driver.remaining == 0
    with pytest.raises(ModelError, match="script exhausted: all 1 turns were played"):
        await complete(driver, REQUEST)


def test_chunks_must_join_to_the_text() -> None:
    assert "".join(word_chunks(" a  b ")) == " a  b "
    with pytest.raises(ValueError, match="chunks must join to exactly its text"):
        ScriptedResponse(text="abc", chunks=("ab",))
