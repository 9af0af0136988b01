"""OpenAIChatDriver against a real local chat-completions server.

The server is a Starlette app served by uvicorn on a free port over real sockets. Each
test scripts one reply under its own URL prefix and then checks both what the driver
produced and what the server received.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agent_core.drivers._sse import ServerSentEvent, SSEDecoder
from agent_core.drivers.base import (
    ModelDriver,
    ModelRequest,
    ModelResponse,
    ResponseCompleted,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSchema,
    complete,
)
from agent_core.drivers.openai import (
    ChatStreamAccumulator,
    OpenAIChatDriver,
    OpenAISettings,
    finish_reason_of,
    request_body,
)
from agent_core.errors import ErrorType, ModelError, ModelTimeoutError, RateLimitError
from agent_core.messages import FinishReason, Message, ToolCall, Usage
from tests.support.openai_api import (
    API_KEY,
    FakeChatAPI,
    Reply,
    Script,
    chunk,
    sse,
    text,
    tool,
    usage,
)
from tests.support.processes import free_port

# --- the fake chat-completions server ----------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OPENAI_* / AGENT_OPENAI_* from the developer's shell leaks into a test."""
    for name in ("BASE_URL", "API_KEY", "MODEL", "TIMEOUT"):
        monkeypatch.delenv(f"OPENAI_{name}", raising=False)
        monkeypatch.delenv(f"AGENT_OPENAI_{name}", raising=False)


# --- reply builders ------------------------------------------------------------------------


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        [json.dumps(body).encode()],
        status=status,
        headers=headers or {},
        media_type="application/json",
    )


def settings_for(script: Script, **overrides: Any) -> OpenAISettings:
    values: dict[str, Any] = {
        "base_url": script.base_url,
        "api_key": API_KEY,
        "model": "fake-model",
    }
    return OpenAISettings(**(values | overrides))


async def run(
    api: FakeChatAPI, reply: Reply, request: ModelRequest | None = None, **settings: Any
) -> tuple[list[StreamEvent], Script]:
    """Stream ``request`` against ``reply``; the events and what the server saw."""
    script = api.script(reply)
    request = request or ModelRequest(messages=(Message.user("hi"),))
    async with OpenAIChatDriver(settings_for(script, **settings)) as driver:
        events = [event async for event in driver.stream(request)]
    return events, script


async def fail(api: FakeChatAPI, reply: Reply, **settings: Any) -> ModelError:
    """The ModelError that streaming ``reply`` raises."""
    with pytest.raises(ModelError) as caught:
        await run(api, reply, **settings)
    return caught.value


async def collect(driver: OpenAIChatDriver, seen: list[StreamEvent]) -> None:
    """Stream a one-message request into ``seen`` (which keeps what came before a failure)."""
    async for event in driver.stream(ModelRequest(messages=(Message.user("hi"),))):
        seen.append(event)


def final(events: list[StreamEvent]) -> ModelResponse:
    assert isinstance(events[-1], ResponseCompleted)
    assert sum(isinstance(e, ResponseCompleted) for e in events) == 1
    return events[-1].response


# --- streaming ----------------------------------------------------------------------------


@pytest.mark.io
async def test_streams_text_deltas_then_one_completed_response(api: FakeChatAPI) -> None:
    reply = Reply(
        [
            b": keep-alive\n\n",
            *sse(
                chunk({"role": "assistant", "content": ""}),
                text("Hel"),
                text("lo, "),
                text("world"),
                chunk(finish="stop"),
                usage(12, 3),
            ),
        ]
    )
    events, _ = await run(api, reply)
    assert events[:-1] == [TextDelta(text="Hel"), TextDelta(text="lo, "), TextDelta(text="world")]
    assert final(events) == ModelResponse(
        content="Hello, world", usage=Usage.of(12, 3), finish_reason=FinishReason.STOP
    )


@pytest.mark.io
async def test_request_body_and_auth_header_reach_the_server(api: FakeChatAPI) -> None:
    """The server sees the model, the messages, ``stream: true`` with usage and the key."""
    events, script = await run(api, Reply(sse(text("ok"), chunk(finish="stop"))))
    [received] = script.requests
    assert received.body == {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert received.headers["authorization"] == f"Bearer {API_KEY}"
    assert received.headers["accept"] == "text/event-stream"
    assert final(events).content == "ok"


@pytest.mark.io
async def test_conversation_tools_and_options_are_sent_in_openai_format(api: FakeChatAPI) -> None:
    call = ToolCall(id="call_1", name="lookup", arguments={"city": "Zürich", "days": 2})
    request = ModelRequest(
        messages=(
            Message.system("be brief"),
            Message.user("weather?"),
            Message.assistant("", (call,)),
            Message.tool('{"temp": 21}', tool_call_id="call_1", name="lookup"),
        ),
        tools=(
            ToolSchema(
                name="lookup",
                description="Weather by city",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}},
            ),
        ),
        model="other-model",
        temperature=0.2,
        max_tokens=50,
    )
    _, script = await run(api, Reply(sse(text("21°C"), chunk(finish="stop"))), request)
    body = script.requests[0].body
    assert body["model"] == "other-model"
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 50
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"city":"Zürich","days":2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Weather by city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]


@pytest.mark.io
async def test_interleaved_parallel_tool_call_deltas_are_assembled_by_index(
    api: FakeChatAPI,
) -> None:
    reply = Reply(
        sse(
            chunk({"role": "assistant", "content": None}),
            tool(0, id="call_a", name="search"),
            tool(1, id="call_b", name="fetch", args='{"u'),
            tool(0, args='{"q": "py'),
            tool(1, args='rl": "https://x"'),
            tool(0, args='thon"}'),
            tool(1, args="}"),
            chunk(finish="tool_calls"),
            usage(30, 20, 51),
        )
    )
    events, _ = await run(api, reply)
    assert events[:-1] == [
        ToolCallDelta(index=0, id="call_a", name="search"),
        ToolCallDelta(index=1, id="call_b", name="fetch", arguments='{"u'),
        ToolCallDelta(index=0, arguments='{"q": "py'),
        ToolCallDelta(index=1, arguments='rl": "https://x"'),
        ToolCallDelta(index=0, arguments='thon"}'),
        ToolCallDelta(index=1, arguments="}"),
    ]
    assert final(events) == ModelResponse(
        tool_calls=(
            ToolCall(id="call_a", name="search", arguments={"q": "python"}),
            ToolCall(id="call_b", name="fetch", arguments={"url": "https://x"}),
        ),
        usage=Usage(prompt=30, completion=20, total=51),
        finish_reason=FinishReason.TOOL_CALLS,
    )


@pytest.mark.io
async def test_text_and_a_tool_call_with_empty_arguments_in_one_response(api: FakeChatAPI) -> None:
    reply = Reply(
        sse(text("Let me check."), tool(0, id="call_1", name="now"), chunk(finish="tool_calls"))
    )
    events, _ = await run(api, reply)
    response = final(events)
    assert response.content == "Let me check."
    assert response.tool_calls == (ToolCall(id="call_1", name="now", arguments={}),)


@pytest.mark.io
async def test_stream_split_at_arbitrary_byte_boundaries(api: FakeChatAPI) -> None:
    """Events and UTF-8 characters cut across TCP writes still decode exactly."""
    whole = b"".join(sse(text("Grüße "), text("🌍!"), chunk(finish="stop"), usage(1, 2)))
    pieces = [whole[i : i + 5] for i in range(0, len(whole), 5)]
    events, _ = await run(api, Reply(pieces))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Grüße ", "🌍!"]
    assert final(events).content == "Grüße 🌍!"


@pytest.mark.io
@pytest.mark.parametrize("reason", ["stop", "length", "tool_calls", "content_filter", "error"])
async def test_each_openai_finish_reason_is_reported(api: FakeChatAPI, reason: str) -> None:
    events, _ = await run(api, Reply(sse(text("x"), chunk(finish=reason))))
    assert final(events).finish_reason == FinishReason(reason)


@pytest.mark.io
async def test_missing_usage_counts_as_zero(api: FakeChatAPI) -> None:
    events, _ = await run(api, Reply(sse(text("x"), chunk(finish="stop"))))
    assert final(events).usage == Usage()


@pytest.mark.io
@pytest.mark.parametrize("tokens", [str(10**20), str(2**63), "9" * 100])
async def test_a_usage_past_what_the_wire_holds_is_clamped(api: FakeChatAPI, tokens: str) -> None:
    """A broken or hostile API's token count must not become an envelope orjson cannot
    write (the run's end was lost)."""
    body = json.dumps(chunk(usage={"prompt_tokens": 0, "completion_tokens": 2}))
    huge = body.replace('"prompt_tokens": 0', f'"prompt_tokens": {tokens}')
    events, _ = await run(api, Reply(sse(text("x"), chunk(finish="stop"), huge)))
    assert final(events).usage == Usage(prompt=2**53 - 1, completion=2, total=2**53 - 1)


@pytest.mark.io
async def test_an_integer_of_thousands_of_digits_in_a_chunk_is_a_model_error(
    api: FakeChatAPI,
) -> None:
    """``int()`` refuses past 4,300 digits with ValueError: the run crashed."""
    body = json.dumps(chunk(usage={"prompt_tokens": 0, "completion_tokens": 2}))
    huge = body.replace('"prompt_tokens": 0', f'"prompt_tokens": {"9" * 5000}')
    error = await fail(api, Reply(sse(text("x"), chunk(finish="stop"), huge)))
    assert "malformed stream chunk: an integer of 5000 digits" in error.message


@pytest.mark.io
async def test_tool_arguments_with_an_integer_past_the_wire_bound_are_refused(
    api: FakeChatAPI,
) -> None:
    """Clamped, a tool would run with another value than the model's: refused, saying so."""
    reply = Reply(
        sse(tool(0, id="call_9", name="add", args='{"n": 9007199254740992}'), chunk(finish="stop"))
    )
    error = await fail(api, reply)
    assert "tool 'add' (call call_9) with the integer 9007199254740992" in error.message
    fine = Reply(sse(tool(0, id="c", name="add", args='{"n": -9007199254740991}'), chunk()))
    events, _ = await run(api, fine)
    assert final(events).tool_calls[0].arguments == {"n": -(2**53 - 1)}


@pytest.mark.io
async def test_lone_surrogates_are_replaced_where_they_enter(api: FakeChatAPI) -> None:
    """A JSON escape of half a surrogate pair is no UTF-8: the driver crashed on it
    (UnicodeEncodeError), and neither an envelope nor the state could carry it. A whole
    pair sent as two escapes is one character, kept."""
    reply = Reply(
        sse(
            text("a \ud800 b \ud83d\ude00"),
            tool(0, id="c", name="echo", args='{"s": "x\\udfff"}'),
            chunk(finish="tool_calls"),
        )
    )
    events, _ = await run(api, reply)
    response = final(events)
    assert response.content == "a \ufffd b \U0001f600"
    assert response.tool_calls[0].arguments == {"s": "x\ufffd"}


@pytest.mark.io
async def test_text_after_done_is_not_read(api: FakeChatAPI) -> None:
    reply = Reply([*sse(text("a"), chunk(finish="stop")), b"data: not json\n\n"])
    events, _ = await run(api, reply)
    assert final(events).content == "a"


@pytest.mark.io
async def test_a_stream_without_done_but_with_a_finish_reason_completes(api: FakeChatAPI) -> None:
    events, _ = await run(api, Reply(sse(text("a"), chunk(finish="length"), done=False)))
    assert final(events).finish_reason is FinishReason.LENGTH


@pytest.mark.io
async def test_complete_returns_the_assembled_response(api: FakeChatAPI) -> None:
    script = api.script(Reply(sse(text("4"), chunk(finish="stop"), usage(5, 1))))
    async with OpenAIChatDriver(settings_for(script)) as driver:
        assert isinstance(driver, ModelDriver)
        response = await complete(driver, ModelRequest(messages=(Message.user("2+2?"),)))
    assert response == ModelResponse(content="4", usage=Usage.of(5, 1))
    assert response.message() == Message.assistant("4")


# --- errors -------------------------------------------------------------------------------


@pytest.mark.io
async def test_http_429_is_a_rate_limit_error_with_retry_after(api: FakeChatAPI) -> None:
    body = {"error": {"message": "Rate limit reached for requests", "type": "requests"}}
    error = await fail(api, json_reply(429, body, {"Retry-After": "7"}))
    assert isinstance(error, RateLimitError)
    assert error.error_type is ErrorType.RATE_LIMIT
    assert error.status_code == 429
    assert error.retry_after == 7.0
    assert "Rate limit reached for requests" in error.message
    assert "retry after 7s" in error.message


@pytest.mark.io
async def test_http_429_without_retry_after(api: FakeChatAPI) -> None:
    error = await fail(api, json_reply(429, {"error": {"message": "slow down"}}))
    assert isinstance(error, RateLimitError)
    assert error.retry_after is None


@pytest.mark.io
async def test_http_500_is_a_model_error_with_the_provider_message(api: FakeChatAPI) -> None:
    error = await fail(api, json_reply(500, {"error": {"message": "The server had an error"}}))
    assert type(error) is ModelError
    assert error.error_type is ErrorType.MODEL
    assert error.status_code == 500
    assert "HTTP 500: The server had an error" in error.message


@pytest.mark.io
async def test_http_401_names_the_api_key_settings_but_not_the_key(api: FakeChatAPI) -> None:
    error = await fail(api, json_reply(401, {"error": {"message": "Incorrect API key provided"}}))
    assert type(error) is ModelError
    assert error.status_code == 401
    assert "Incorrect API key provided" in error.message
    assert "OPENAI_API_KEY" in error.message
    assert API_KEY not in error.message


@pytest.mark.io
async def test_http_error_with_a_non_json_body_quotes_the_body(api: FakeChatAPI) -> None:
    reply = Reply([b"upstream connect error"], status=502, media_type="text/plain")
    error = await fail(api, reply)
    assert error.status_code == 502
    assert "upstream connect error" in error.message


@pytest.mark.io
async def test_a_server_that_stalls_mid_stream_is_a_timeout(api: FakeChatAPI) -> None:
    script = api.script(Reply(sse(text("partial"), done=False), stall=True))
    seen: list[StreamEvent] = []
    async with OpenAIChatDriver(settings_for(script, timeout=0.3)) as driver:
        with pytest.raises(ModelTimeoutError) as caught:
            await collect(driver, seen)
    assert seen == [TextDelta(text="partial")]
    assert caught.value.error_type is ErrorType.TIMEOUT
    assert "did not answer within 0.3s" in caught.value.message


@pytest.mark.io
async def test_a_server_that_never_answers_is_a_timeout(api: FakeChatAPI) -> None:
    error = await fail(api, Reply(stall_before_headers=True), timeout=0.3)
    assert isinstance(error, ModelTimeoutError)
    assert error.error_type is ErrorType.TIMEOUT


@pytest.mark.io
async def test_connection_refused_is_a_model_error() -> None:
    settings = OpenAISettings(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key=API_KEY)
    async with OpenAIChatDriver(settings) as driver:
        with pytest.raises(ModelError) as caught:
            await complete(driver, ModelRequest(messages=(Message.user("hi"),)))
    assert type(caught.value) is ModelError
    assert "could not talk to" in caught.value.message
    assert "ConnectError" in caught.value.message


@pytest.mark.io
async def test_a_chunk_that_is_not_json_is_a_model_error(api: FakeChatAPI) -> None:
    error = await fail(api, Reply(sse(text("a"), '{"choices": [')))
    assert "malformed stream chunk: not JSON" in error.message
    assert '{"choices": [' in error.message


@pytest.mark.io
async def test_a_chunk_of_the_wrong_shape_names_the_bad_field(api: FakeChatAPI) -> None:
    error = await fail(api, Reply(sse({"choices": [{"index": 0, "delta": {"content": 5}}]})))
    assert "malformed stream chunk" in error.message
    assert "choices.0.delta.content" in error.message


@pytest.mark.io
async def test_an_error_object_mid_stream_is_a_model_error(api: FakeChatAPI) -> None:
    script = api.script(Reply(sse(text("par"), {"error": {"message": "overloaded", "code": 503}})))
    seen: list[StreamEvent] = []
    async with OpenAIChatDriver(settings_for(script)) as driver:
        with pytest.raises(ModelError, match="error mid-stream: overloaded"):
            await collect(driver, seen)
    assert seen == [TextDelta(text="par")]


@pytest.mark.io
async def test_an_sse_error_event_is_a_model_error(api: FakeChatAPI) -> None:
    reply = Reply([b'event: error\ndata: {"error": {"message": "context too long"}}\n\n'])
    error = await fail(api, reply)
    assert "error mid-stream: context too long" in error.message


@pytest.mark.io
async def test_invalid_tool_arguments_name_the_tool(api: FakeChatAPI) -> None:
    reply = Reply(
        sse(tool(0, id="call_9", name="search", args='{"q": '), chunk(finish="tool_calls"))
    )
    error = await fail(api, reply)
    assert "invalid JSON arguments for tool 'search' (call call_9)" in error.message


@pytest.mark.io
async def test_tool_arguments_that_are_not_an_object_are_rejected(api: FakeChatAPI) -> None:
    reply = Reply(
        sse(tool(0, id="call_9", name="search", args="[1, 2]"), chunk(finish="tool_calls"))
    )
    error = await fail(api, reply)
    assert "not an object" in error.message


@pytest.mark.io
async def test_a_stream_cut_off_before_it_finished_is_a_model_error(api: FakeChatAPI) -> None:
    error = await fail(api, Reply(sse(text("half"), done=False)))
    assert "closed the stream before the response finished" in error.message


@pytest.mark.io
async def test_a_json_answer_to_a_stream_request_is_a_model_error(api: FakeChatAPI) -> None:
    error = await fail(api, json_reply(200, {"choices": []}))
    assert "instead of text/event-stream" in error.message
    assert "application/json" in error.message


@pytest.mark.io
async def test_a_tool_message_without_call_id_is_refused_before_sending(api: FakeChatAPI) -> None:
    request = ModelRequest(messages=(Message(role="tool", content="x", name="search"),))
    with pytest.raises(ModelError, match="has no tool_call_id"):
        await run(api, Reply(sse(chunk(finish="stop"))), request)


# --- settings and client ------------------------------------------------------------------


def test_settings_defaults() -> None:
    settings = OpenAISettings()
    assert settings.base_url == "https://api.openai.com/v1"
    assert settings.api_key is None
    assert settings.model == "gpt-4o-mini"
    assert settings.timeout == 60.0


def test_settings_from_openai_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_MODEL", "llama3.2")
    settings = OpenAISettings()
    assert settings.base_url == "http://localhost:11434/v1"
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == API_KEY
    assert settings.model == "llama3.2"


def test_agent_prefixed_environment_wins_and_arguments_win_over_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_MODEL", "plain")
    monkeypatch.setenv("AGENT_OPENAI_MODEL", "agent")
    monkeypatch.setenv("AGENT_OPENAI_TIMEOUT", "5")
    assert OpenAISettings().model == "agent"
    assert OpenAISettings().timeout == 5.0
    assert OpenAISettings(model="explicit").model == "explicit"


def test_the_api_key_is_hidden_from_repr_and_str() -> None:
    settings = OpenAISettings(api_key=API_KEY)
    driver = OpenAIChatDriver(settings)
    for text_ in (repr(settings), str(settings), repr(driver)):
        assert API_KEY not in text_


def test_a_bad_base_url_is_refused_with_an_example() -> None:
    with pytest.raises(ValueError, match=r"must start with http:// or https://.*api\.openai\.com"):
        OpenAISettings(base_url="api.openai.com/v1")


@pytest.mark.io
async def test_no_api_key_means_no_authorization_header(api: FakeChatAPI) -> None:
    _, script = await run(api, Reply(sse(chunk(finish="stop"))), api_key=None)
    assert "authorization" not in script.requests[0].headers


@pytest.mark.io
async def test_an_injected_client_is_reused_and_left_open(api: FakeChatAPI) -> None:
    script = api.script(Reply(sse(text("a"), chunk(finish="stop"))))
    request = ModelRequest(messages=(Message.user("hi"),))
    async with httpx.AsyncClient() as client:
        async with OpenAIChatDriver(settings_for(script), client=client) as driver:
            await complete(driver, request)
            await complete(driver, request)
        assert not client.is_closed
    assert len(script.requests) == 2


async def test_the_driver_closes_the_client_it_created() -> None:
    driver = OpenAIChatDriver(OpenAISettings())
    await driver.aclose()
    assert driver._client.is_closed


# --- the sans-I/O parts -------------------------------------------------------------------


def test_sse_decoder_joins_data_lines_and_skips_comments() -> None:
    decoder = SSEDecoder()
    lines = [": ping", "event: update", "id: 4", "data: one", "data:two", "retry: 10", "x: y", ""]
    results = [decoder.feed_line(line) for line in lines]
    assert results[:-1] == [None] * 7
    assert results[-1] == ServerSentEvent(data="one\ntwo", event="update", id="4", retry=10)


def test_sse_decoder_ignores_blank_lines_without_data_and_flushes_at_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed_line("") is None
    assert decoder.feed_line("event: lonely") is None
    assert decoder.feed_line("") is None  # no data: nothing dispatched, name reset
    assert decoder.feed_line("data: last") is None
    assert decoder.flush() == ServerSentEvent(data="last")
    assert decoder.flush() is None


@pytest.mark.parametrize(
    ("value", "has_tool_calls", "expected"),
    [
        ("function_call", True, FinishReason.TOOL_CALLS),
        ("tool_use", True, FinishReason.TOOL_CALLS),
        ("end_turn", False, FinishReason.STOP),
        ("EOS", False, FinishReason.STOP),
        ("max_tokens", False, FinishReason.LENGTH),
        ("model_length", False, FinishReason.LENGTH),
        ("safety", False, FinishReason.CONTENT_FILTER),
        ("something_new", False, FinishReason.STOP),
        ("something_new", True, FinishReason.TOOL_CALLS),
        (None, False, FinishReason.STOP),
        (None, True, FinishReason.TOOL_CALLS),
    ],
)
def test_finish_reason_mapping(
    value: str | None, has_tool_calls: bool, expected: FinishReason
) -> None:
    assert finish_reason_of(value, has_tool_calls=has_tool_calls) is expected


def test_request_body_omits_unset_options() -> None:
    body = request_body(ModelRequest(messages=(Message.user("hi"),)), "m")
    assert set(body) == {"model", "messages", "stream", "stream_options"}


def test_accumulator_rejects_a_tool_call_that_never_got_its_name() -> None:
    accumulator = ChatStreamAccumulator()
    from agent_core.drivers.openai import _parse_chunk

    fragment = {"index": 0, "id": "call_1", "function": {"arguments": "{}"}}
    list(accumulator.feed(_parse_chunk(json.dumps(chunk({"tool_calls": [fragment]})))))
    with pytest.raises(ModelError, match="tool call #0 ended without its function name"):
        accumulator.finish(saw_done=True)
