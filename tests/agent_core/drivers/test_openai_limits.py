"""OpenAIChatDriver's limits against a hostile local chat-completions server.

The endpoint is not trusted with the process's memory or time: a line without an end,
an endless body, endless text, huge or deeply nested tool-call arguments and a server
that drips forever each end the response with a ``ModelError`` that names the limit,
its value and its setting, after reading about as much as the limit allows. Bytes read
are counted by a wrapper around the client's transport, under the real HTTP stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agent_core.builder import AgentBuilder
from agent_core.drivers.base import ModelRequest, ResponseCompleted, StreamEvent, TextDelta
from agent_core.drivers.openai import OpenAIChatDriver, OpenAISettings
from agent_core.errors import ErrorType, ModelError, ModelTimeoutError, RateLimitError
from agent_core.messages import Message, ToolCall
from agent_core.state import AgentStatus
from tests.support.openai_api import chunk, sse, text, tool
from tests.support.threaded import served_in_thread

pytestmark = pytest.mark.timeout(30)

KIB = 1024
READ = 64 * KIB  # the most httpcore reads at once: how far past a limit a read may go

Body = Callable[[], AsyncIterator[bytes]]

# --- a hostile chat-completions server ------------------------------------------------------


@dataclass
class Script:
    body: Body
    base_url: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "text/event-stream"
    delay: float = 0.0  # seconds before the headers go out
    request_headers: list[dict[str, str]] = field(default_factory=list)


class HostileAPI:
    """Answers each URL prefix with a scripted body, streamed from an async generator."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.port = 0

    def script(self, body: Body, **options: Any) -> Script:
        token = uuid.uuid4().hex
        script = Script(body, f"http://127.0.0.1:{self.port}/{token}/v1", **options)
        self.scripts[token] = script
        return script

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/{token}/v1/chat/completions", self._chat, methods=["POST"])]
        )

    async def _chat(self, request: Request) -> Response:
        script = self.scripts[request.path_params["token"]]
        await request.body()
        script.request_headers.append(dict(request.headers))
        if script.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_disconnected(request), script.delay)
        return StreamingResponse(
            script.body(),
            status_code=script.status,
            headers=script.headers,
            media_type=script.media_type,
        )


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[HostileAPI]:
    """The hostile API, served by uvicorn in a background thread for this module."""
    fake = HostileAPI()
    with served_in_thread(fake.app(), "hostile API") as port:
        fake.port = port
        yield fake


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OPENAI_* / AGENT_OPENAI_* setting from the developer's shell leaks into a test."""
    for name in OpenAISettings.model_fields:
        monkeypatch.delenv(f"OPENAI_{name.upper()}", raising=False)
        monkeypatch.delenv(f"AGENT_OPENAI_{name.upper()}", raising=False)


def pieces(*parts: bytes) -> Body:
    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return body


def repeated(part: bytes, total: int, then: tuple[bytes, ...] = ()) -> Body:
    """``part`` again and again until ``total`` bytes were sent, then ``then``."""

    async def body() -> AsyncIterator[bytes]:
        for _ in range(total // len(part)):
            yield part
        for last in then:
            yield last

    return body


def dripping(part: bytes, times: int, every: float, then: tuple[bytes, ...] = ()) -> Body:
    """``part`` once every ``every`` seconds, ``times`` times, then ``then``."""

    async def body() -> AsyncIterator[bytes]:
        for _ in range(times):
            yield part
            await asyncio.sleep(every)
        for last in then:
            yield last

    return body


def event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


FINISH = (event(chunk(finish="stop")), b"data: [DONE]\n\n")


# --- a client that counts what it reads -----------------------------------------------------


class _CountedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, counter: CountingTransport) -> None:
        self.inner = inner
        self.counter = counter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.inner:
            self.counter.received += len(part)
            yield part

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """The real HTTP transport, counting the response body bytes read through it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.received = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedStream(response.stream, self),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Outcome:
    events: list[StreamEvent]
    error: ModelError | None
    received: int
    script: Script


async def stream(api: HostileAPI, body: Body, /, **settings: Any) -> Outcome:
    """Stream a one-message request against ``body``: what came, how it ended, bytes read."""
    options = {
        key: settings.pop(key)
        for key in ("status", "headers", "media_type", "delay")
        if key in settings
    }
    script = api.script(body, **options)
    transport = CountingTransport()
    events: list[StreamEvent] = []
    error: ModelError | None = None
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        config = OpenAISettings(base_url=script.base_url, model="fake-model", **settings)
        async with OpenAIChatDriver(config, client=client) as driver:
            try:
                async for item in driver.stream(ModelRequest(messages=(Message.user("hi"),))):
                    events.append(item)
            except ModelError as exc:
                error = exc
    return Outcome(events, error, transport.received, script)


def failed(outcome: Outcome) -> ModelError:
    assert outcome.error is not None, f"the response was accepted: {outcome.events[-1:]}"
    return outcome.error


# --- lines and the whole body ---------------------------------------------------------------


@pytest.mark.io
async def test_a_line_without_an_end_stops_at_max_line_bytes(api: HostileAPI) -> None:
    """8 MiB without a newline: the driver reads about 256 KiB and names the limit."""
    outcome = await stream(
        api, repeated(b"data: " + b"z" * (64 * KIB), 8 * 1024 * KIB), max_line_bytes=256 * KIB
    )
    error = failed(outcome)
    assert type(error) is ModelError
    assert error.error_type is ErrorType.MODEL
    assert "a line in the stream is over the limit" in error.message
    assert "max_line_bytes = 262144 bytes (AGENT_OPENAI_MAX_LINE_BYTES)" in error.message
    assert outcome.received <= 256 * KIB + 2 * READ


@pytest.mark.io
async def test_the_default_line_limit_is_one_mib(api: HostileAPI) -> None:
    outcome = await stream(api, repeated(b"z" * (64 * KIB), 8 * 1024 * KIB))
    assert "max_line_bytes = 1048576 bytes" in failed(outcome).message
    assert outcome.received <= 1024 * KIB + 2 * READ


@pytest.mark.io
async def test_data_lines_of_one_endless_event_stop_at_max_line_bytes(api: HostileAPI) -> None:
    """Short ``data:`` lines that never reach a blank line add up to one event's data."""
    line = b"data: " + b"d" * 1000 + b"\n"
    outcome = await stream(api, repeated(line * 64, 8 * 1024 * KIB), max_line_bytes=256 * KIB)
    error = failed(outcome)
    assert "an event's data in the stream is over the limit" in error.message
    assert "max_line_bytes = 262144 bytes" in error.message
    assert outcome.received <= 256 * KIB + 2 * READ


@pytest.mark.io
async def test_a_body_past_max_response_bytes_is_refused(api: HostileAPI) -> None:
    """Well-formed text chunks, 8 MiB of them: the body limit ends the response."""
    piece = event(text("x" * 1000)) * 32
    outcome = await stream(
        api, repeated(piece, 8 * 1024 * KIB, FINISH), max_response_bytes=512 * KIB
    )
    error = failed(outcome)
    assert "the response body is over the limit" in error.message
    assert "max_response_bytes = 524288 bytes (AGENT_OPENAI_MAX_RESPONSE_BYTES)" in error.message
    assert outcome.received <= 512 * KIB + READ
    assert not any(isinstance(e, ResponseCompleted) for e in outcome.events)


@pytest.mark.io
async def test_an_error_body_is_read_only_in_part(api: HostileAPI) -> None:
    """A 500 with an 8 MiB body is still an HTTP error; its first 64 KiB are read."""
    outcome = await stream(
        api, repeated(b"e" * (64 * KIB), 8 * 1024 * KIB), status=500, media_type="text/plain"
    )
    error = failed(outcome)
    assert error.status_code == 500
    assert "HTTP 500: eeee" in error.message
    assert outcome.received <= 64 * KIB + READ


@pytest.mark.io
async def test_a_large_error_body_keeps_its_status_under_a_small_body_limit(
    api: HostileAPI,
) -> None:
    body = repeated(b"r" * (64 * KIB), 1024 * KIB)
    outcome = await stream(api, body, status=429, max_response_bytes=1000)
    error = failed(outcome)
    assert isinstance(error, RateLimitError)
    assert "HTTP 429: rrrr" in error.message


@pytest.mark.io
async def test_a_non_stream_answer_is_read_only_in_part(api: HostileAPI) -> None:
    outcome = await stream(
        api, repeated(b"j" * (64 * KIB), 8 * 1024 * KIB), media_type="application/json"
    )
    assert "instead of text/event-stream" in failed(outcome).message
    assert outcome.received <= 64 * KIB + READ


@pytest.mark.io
async def test_a_compressed_stream_is_refused_and_identity_is_asked_for(api: HostileAPI) -> None:
    """A compressed body could expand far past what was read, so it is not decoded."""
    whole = gzip.compress(b"".join(sse(text("hi"), chunk(finish="stop"))))
    outcome = await stream(api, pieces(whole), headers={"content-encoding": "gzip"})
    error = failed(outcome)
    assert "'gzip'-encoded stream" in error.message
    assert "Accept-Encoding: identity" in error.message
    assert outcome.script.request_headers[0]["accept-encoding"] == "identity"


# --- what the response holds ----------------------------------------------------------------


@pytest.mark.io
async def test_text_past_max_text_bytes_is_refused(api: HostileAPI) -> None:
    body = pieces(*sse(*[text("é" * 50) for _ in range(30)], chunk(finish="stop")))
    outcome = await stream(api, body, max_text_bytes=1000)
    error = failed(outcome)
    assert "the model's text is over the limit" in error.message
    assert "max_text_bytes = 1000 bytes (AGENT_OPENAI_MAX_TEXT_BYTES)" in error.message
    passed = "".join(e.text for e in outcome.events if isinstance(e, TextDelta))
    assert len(passed.encode()) <= 1000  # "é" is two bytes: 10 deltas of 100 bytes


@pytest.mark.io
async def test_tool_arguments_past_max_tool_arguments_bytes_are_refused(api: HostileAPI) -> None:
    fragments = [tool(0, id="call_1", name="lookup", args='{"pad": "')]
    fragments += [tool(0, args="p" * 1000) for _ in range(100)]
    body = pieces(*sse(*fragments, tool(0, args='"}'), chunk(finish="tool_calls")))
    outcome = await stream(api, body, max_tool_arguments_bytes=20 * KIB)
    error = failed(outcome)
    assert "the arguments of tool call #0 (lookup) is over the limit" in error.message
    assert "max_tool_arguments_bytes = 20480 bytes" in error.message
    assert "AGENT_OPENAI_MAX_TOOL_ARGUMENTS_BYTES" in error.message


@pytest.mark.io
async def test_more_tool_calls_than_max_tool_calls_are_refused(api: HostileAPI) -> None:
    """Each new index is a partial call kept until the end: 200,000 of them held about
    100 MB. Indices far apart count as calls like any other."""
    fragments = [tool(i * 10**30, id=f"c{i}", name="calc", args="{}") for i in range(6)]
    outcome = await stream(
        api, pieces(*sse(*fragments, chunk(finish="tool_calls"))), max_tool_calls=5
    )
    error = failed(outcome)
    assert "the number of tool calls is over the limit: max_tool_calls = 5 calls" in error.message
    assert "AGENT_OPENAI_MAX_TOOL_CALLS" in error.message


def nested(depth: int) -> str:
    """Tool arguments whose containers nest ``depth`` levels (the object is level 1)."""
    inner = depth - 1
    return '{"expression": "1", "d": ' + "[" * inner + "]" * inner + "}"


def calling(arguments: str) -> Body:
    return pieces(*sse(tool(0, id="call_1", name="calc", args=arguments), chunk(finish="stop")))


@pytest.mark.io
@pytest.mark.parametrize("depth", [65, 300, 5000])
async def test_tool_arguments_nested_deeper_than_the_limit_are_refused(
    api: HostileAPI, depth: int
) -> None:
    """Past about 255 levels orjson cannot serialize the envelope or the snapshot; past
    about 1000, json cannot parse them: either way the driver refuses them first."""
    error = failed(await stream(api, calling(nested(depth))))
    assert "the nesting of the arguments for tool 'calc' (call call_1)" in error.message
    assert "max_tool_arguments_depth = 64 levels" in error.message
    assert "AGENT_OPENAI_MAX_TOOL_ARGUMENTS_DEPTH" in error.message


@pytest.mark.io
async def test_tool_arguments_nested_as_deep_as_the_limit_are_accepted(api: HostileAPI) -> None:
    outcome = await stream(api, calling(nested(64)))
    assert outcome.error is None
    completed = outcome.events[-1]
    assert isinstance(completed, ResponseCompleted)
    [call] = completed.response.tool_calls
    assert call.name == "calc"


@pytest.mark.io
async def test_a_deeply_nested_chunk_is_a_malformed_chunk(api: HostileAPI) -> None:
    error = failed(await stream(api, pieces(b"data: " + b"[" * 100_000 + b"\n\n")))
    assert "malformed stream chunk: nested too deeply" in error.message


# --- time ---------------------------------------------------------------------------------


@pytest.mark.io
async def test_a_server_that_drips_is_stopped_at_response_timeout(api: HostileAPI) -> None:
    """Each chunk comes well within the read timeout, the whole would take 10 s."""
    body = dripping(event(text(".")), 100, 0.1, FINISH)
    outcome = await stream(api, body, response_timeout=0.3)
    error = failed(outcome)
    assert isinstance(error, ModelTimeoutError)
    assert error.error_type is ErrorType.TIMEOUT
    assert "did not finish its response in time" in error.message
    assert "response_timeout = 0.3s (AGENT_OPENAI_RESPONSE_TIMEOUT)" in error.message
    assert outcome.events  # the deltas before the deadline were passed on


@pytest.mark.io
async def test_response_timeout_also_bounds_waiting_for_the_headers(api: HostileAPI) -> None:
    body = pieces(*sse(text("late"), chunk(finish="stop")))
    outcome = await stream(api, body, delay=5, response_timeout=0.3)
    error = failed(outcome)
    assert isinstance(error, ModelTimeoutError)
    assert "response_timeout = 0.3s" in error.message


# --- what still works -----------------------------------------------------------------------


@pytest.mark.io
async def test_a_normal_stream_within_the_limits_completes(api: HostileAPI) -> None:
    body = pieces(
        b": keep-alive\r\n\r\n",
        *sse(text("Hel"), text("lo"), tool(0, id="call_1", name="lookup", args='{"q": 1}')),
    )
    outcome = await stream(
        api,
        body,
        max_line_bytes=4 * KIB,
        max_response_bytes=8 * KIB,
        max_text_bytes=5,
        max_tool_arguments_bytes=8,
        response_timeout=5,
    )
    assert outcome.error is None
    assert outcome.events[:2] == [TextDelta(text="Hel"), TextDelta(text="lo")]
    completed = outcome.events[-1]
    assert isinstance(completed, ResponseCompleted)
    assert completed.response.content == "Hello"
    assert completed.response.tool_calls == (
        ToolCall(id="call_1", name="lookup", arguments={"q": 1}),
    )


@pytest.mark.io
async def test_a_long_stream_in_small_reads_completes(api: HostileAPI) -> None:
    """Many events cut at odd byte boundaries, with CRLF and CR line endings."""
    whole = b"".join(sse(*[text(f"{n} ") for n in range(500)], chunk(finish="stop")))
    whole = whole.replace(b"\n\n", b"\r\n\r\n", 1000).replace(b"\n\n", b"\r\r", 500)
    outcome = await stream(api, pieces(*[whole[i : i + 7] for i in range(0, len(whole), 7)]))
    assert outcome.error is None
    completed = outcome.events[-1]
    assert isinstance(completed, ResponseCompleted)
    assert completed.response.content == "".join(f"{n} " for n in range(500))


@pytest.mark.io
async def test_a_run_over_a_limit_ends_failed_with_the_message(api: HostileAPI) -> None:
    script = api.script(repeated(b"data: " + b"z" * (64 * KIB), 4 * 1024 * KIB))
    config = OpenAISettings(base_url=script.base_url, model="m", max_line_bytes=128 * KIB)
    async with OpenAIChatDriver(config) as driver:
        state = await AgentBuilder().with_driver(driver).build().run("hi")
    assert state.status is AgentStatus.FAILED
    message = state.error_message()
    assert message is not None
    assert "max_line_bytes = 131072 bytes (AGENT_OPENAI_MAX_LINE_BYTES)" in message


# --- settings -----------------------------------------------------------------------------


def test_limit_defaults() -> None:
    settings = OpenAISettings()
    assert settings.response_timeout == 300.0
    assert settings.max_line_bytes == 1024 * KIB
    assert settings.max_response_bytes == 16 * 1024 * KIB
    assert settings.max_text_bytes == 4 * 1024 * KIB
    assert settings.max_tool_arguments_bytes == 1024 * KIB
    assert settings.max_tool_arguments_depth == 64
    assert settings.max_tool_calls == 128


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_OPENAI_MAX_LINE_BYTES", "4096")
    monkeypatch.setenv("OPENAI_RESPONSE_TIMEOUT", "12.5")
    settings = OpenAISettings()
    assert settings.max_line_bytes == 4096
    assert settings.response_timeout == 12.5


def test_a_depth_limit_that_orjson_could_not_serialize_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tool_arguments_depth"):
        OpenAISettings(max_tool_arguments_depth=300)
    with pytest.raises(ValueError, match="max_line_bytes"):
        OpenAISettings(max_line_bytes=0)
