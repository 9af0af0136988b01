"""A model driver for OpenAI-compatible chat-completions APIs, streamed.

:class:`OpenAIChatDriver` posts to ``{base_url}/chat/completions`` with
``stream: true`` and ``stream_options: {"include_usage": true}``, reads the
server-sent events until ``data: [DONE]`` and yields a :class:`TextDelta` per content
delta, a :class:`ToolCallDelta` per tool-call fragment, then one
:class:`ResponseCompleted` with the assembled text, tool calls (arguments parsed from
JSON), usage and finish reason. It works with OpenAI and with servers that speak its
API (vLLM, Ollama, llama.cpp, LiteLLM, OpenRouter, ...).

The pure parts have no I/O and are public for reuse and testing:
:func:`request_body` (a request as the API's JSON) and :class:`ChatStreamAccumulator`
(stream chunks in, events and the final response out).

Finish reasons map onto :class:`FinishReason` as follows: the OpenAI values map to
themselves (``function_call``, the legacy name, to ``tool_calls``); the names other
providers use map by meaning (``end_turn``/``eos``/``stop_sequence`` -> ``stop``,
``max_tokens``/``model_length`` -> ``length``, ``tool_use`` -> ``tool_calls``,
``safety``/``recitation`` -> ``content_filter``); any other value, or none at all,
means ``tool_calls`` when the response has tool calls and ``stop`` otherwise, because
the model did stop and what it left behind is what the agent must act on.

Errors (all :class:`agent_core.errors.ModelError`): HTTP 429 -> ``RateLimitError``
(with ``retry_after`` from the ``Retry-After`` header); any ``httpx`` timeout ->
``ModelTimeoutError``; other HTTP errors -> ``ModelError`` with ``status_code`` and the
provider's message; connection failures, malformed chunks, an ``error`` object in the
stream and tool-call arguments that are not a JSON object -> ``ModelError``.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated, Any, Self

import httpx
import pydantic
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_core.drivers._sse import SSEDecoder
from agent_core.drivers.base import (
    ModelRequest,
    ModelResponse,
    ResponseCompleted,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSchema,
)
from agent_core.errors import ModelError, ModelTimeoutError, RateLimitError
from agent_core.messages import FinishReason, Message, Role, ToolCall, Usage

__all__ = [
    "ChatStreamAccumulator",
    "OpenAIChatDriver",
    "OpenAISettings",
    "finish_reason_of",
    "request_body",
    "to_openai_message",
]

logger = logging.getLogger(__name__)

_DONE = "[DONE]"
_SNIPPET = 200  # characters of a bad payload quoted in an error message


def _env(name: str) -> AliasChoices:
    # The first alias found wins: the specific AGENT_OPENAI_* over the common OPENAI_*.
    return AliasChoices(f"AGENT_OPENAI_{name.upper()}", f"OPENAI_{name.upper()}")


class OpenAISettings(BaseSettings):
    """Where and how to reach the chat-completions API.

    Each field is read from ``AGENT_OPENAI_<FIELD>`` or else ``OPENAI_<FIELD>`` in the
    environment (``AGENT_OPENAI_*`` wins when both are set, so the agent can use a
    different endpoint than other OpenAI tools on the same machine); arguments to the
    constructor win over both. ``api_key`` is optional because local servers rarely
    need one; without it no ``Authorization`` header is sent.
    """

    model_config = SettingsConfigDict(
        populate_by_name=True, extra="ignore", validate_default=True, frozen=True
    )

    base_url: Annotated[str, Field(validation_alias=_env("base_url"))] = "https://api.openai.com/v1"
    api_key: Annotated[SecretStr | None, Field(validation_alias=_env("api_key"), repr=False)] = None
    model: Annotated[str, Field(min_length=1, validation_alias=_env("model"))] = "gpt-4o-mini"
    timeout: Annotated[float, Field(gt=0, validation_alias=_env("timeout"))] = 60.0

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https:// (got {value!r}); "
                "it is the API root, e.g. https://api.openai.com/v1"
            )
        return value.rstrip("/")


# --- request ----------------------------------------------------------------------------


def to_openai_message(message: Message) -> dict[str, Any]:
    """One message in the chat-completions format.

    Raises:
        ModelError: a tool message without ``tool_call_id`` (the API needs it to pair
            the result with the assistant's call).
    """
    if message.role is Role.TOOL:
        if not message.tool_call_id:
            raise ModelError(
                f"tool message for {message.name or 'a tool'!r} has no tool_call_id; "
                "chat-completions needs it to match the assistant's tool call"
            )
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    wire: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.name:
        wire["name"] = message.name
    if message.tool_calls:
        wire["tool_calls"] = [_tool_call_wire(call) for call in message.tool_calls]
        wire["content"] = message.content or None
    return wire


def _tool_call_wire(call: ToolCall) -> dict[str, Any]:
    arguments = json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _tool_wire(tool: ToolSchema) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": function}


def request_body(request: ModelRequest, default_model: str) -> dict[str, Any]:
    """The JSON body of a streamed chat-completions request.

    Args:
        request: what to ask; ``request.model`` overrides ``default_model``.
        default_model: the model used when the request names none.

    Raises:
        ModelError: a message cannot be expressed in the API's format.
    """
    body: dict[str, Any] = {
        "model": request.model or default_model,
        "messages": [to_openai_message(message) for message in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [_tool_wire(tool) for tool in request.tools]
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    return body


# --- stream chunks (wire format) ---------------------------------------------------------


class _Wire(BaseModel):
    # Providers add fields freely; read what we need and ignore the rest.
    model_config = ConfigDict(extra="ignore")


class _FunctionDelta(_Wire):
    name: str | None = None
    arguments: str | None = None


class _ToolCallFragment(_Wire):
    index: int | None = None  # a few servers omit it; the position in the list then
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(_Wire):
    content: str | None = None
    tool_calls: list[_ToolCallFragment] | None = None


class _Choice(_Wire):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(_Wire):
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)


class _Chunk(_Wire):
    choices: list[_Choice] = Field(default_factory=list)
    usage: _Usage | None = None
    error: Any = None


_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "end_turn": FinishReason.STOP,
    "eos": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "model_length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "tool_use": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
    "safety": FinishReason.CONTENT_FILTER,
    "recitation": FinishReason.CONTENT_FILTER,
    "error": FinishReason.ERROR,
}


def finish_reason_of(value: str | None, *, has_tool_calls: bool) -> FinishReason:
    """Map a provider's ``finish_reason`` (see the module docstring for the table)."""
    known = _FINISH_REASONS.get((value or "").lower())
    if known is not None:
        return known
    return FinishReason.TOOL_CALLS if has_tool_calls else FinishReason.STOP


def _error_text(error: Any) -> str:
    """The human message in a provider's error value (an object or a plain string)."""
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail")
        if message:
            return str(message)
        return json.dumps(error)[:_SNIPPET]
    return str(error)[:_SNIPPET]


def _parse_chunk(data: str) -> _Chunk:
    """Parse one ``data:`` payload.

    Raises:
        ModelError: the payload is not JSON, does not have the chunk's shape, or
            carries an ``error`` object.
    """
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"malformed stream chunk: not JSON ({exc.msg} at position {exc.pos}): "
            f"{data[:_SNIPPET]!r}"
        ) from exc
    if isinstance(raw, dict) and raw.get("error") is not None:
        raise ModelError(f"the model API reported an error mid-stream: {_error_text(raw['error'])}")
    try:
        return _Chunk.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'chunk'}: {err['msg']}" for err in exc.errors()
        )
        raise ModelError(f"malformed stream chunk ({problems}): {data[:_SNIPPET]!r}") from exc


# --- assembling a response ----------------------------------------------------------------


@dataclass
class _PartialCall:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)

    def complete(self, index: int) -> ToolCall:
        if not self.id or not self.name:
            missing = "id" if not self.id else "function name"
            raise ModelError(f"streamed tool call #{index} ended without its {missing}")
        text = "".join(self.arguments).strip() or "{}"
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelError(
                f"the model sent invalid JSON arguments for tool {self.name!r} "
                f"(call {self.id}): {exc.msg} at position {exc.pos}: {text[:_SNIPPET]!r}"
            ) from exc
        if not isinstance(arguments, dict):
            raise ModelError(
                f"the model sent arguments for tool {self.name!r} (call {self.id}) that "
                f"are JSON but not an object: {text[:_SNIPPET]!r}"
            )
        return ToolCall(id=self.id, name=self.name, arguments=arguments)


@dataclass
class ChatStreamAccumulator:
    """Sans-I/O assembly of a streamed chat completion (the first choice only).

    Feed it each parsed chunk; it returns the deltas to pass on and remembers enough to
    build the final :class:`ModelResponse` in :meth:`finish`.
    """

    _text: list[str] = field(default_factory=list)
    _calls: dict[int, _PartialCall] = field(default_factory=dict)
    _usage: Usage | None = None
    _finish_reason: str | None = None

    def feed(self, chunk: _Chunk) -> Iterator[TextDelta | ToolCallDelta]:
        """The deltas in ``chunk``, in order, recording them for the final response."""
        if chunk.usage is not None:
            self._usage = _usage_of(chunk.usage)
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
            if choice.delta is not None:
                yield from self._feed_delta(choice.delta)

    def _feed_delta(self, delta: _Delta) -> Iterator[TextDelta | ToolCallDelta]:
        if delta.content:
            self._text.append(delta.content)
            yield TextDelta(text=delta.content)
        for position, fragment in enumerate(delta.tool_calls or ()):
            yield self._feed_tool_call(position, fragment)

    def _feed_tool_call(self, position: int, fragment: _ToolCallFragment) -> ToolCallDelta:
        index = position if fragment.index is None else fragment.index
        partial = self._calls.setdefault(index, _PartialCall())
        function = fragment.function or _FunctionDelta()
        partial.id = partial.id or fragment.id or None
        partial.name = partial.name or function.name or None
        partial.arguments.append(function.arguments or "")
        return ToolCallDelta(
            index=index, id=fragment.id, name=function.name, arguments=function.arguments or ""
        )

    def finish(self, *, saw_done: bool) -> ModelResponse:
        """The assembled response.

        Args:
            saw_done: whether the stream ended with ``[DONE]``; without it, a stream
                that never gave a finish reason counts as cut off.

        Raises:
            ModelError: the stream was cut off, or a tool call is incomplete or has
                arguments that are not a JSON object.
        """
        if not saw_done and self._finish_reason is None:
            raise ModelError(
                "the model API closed the stream before the response finished "
                "(no finish_reason and no [DONE])"
            )
        calls = tuple(self._calls[index].complete(index) for index in sorted(self._calls))
        return ModelResponse(
            content="".join(self._text),
            tool_calls=calls,
            usage=self._usage or Usage(),
            finish_reason=finish_reason_of(self._finish_reason, has_tool_calls=bool(calls)),
        )


def _usage_of(usage: _Usage) -> Usage:
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    total = usage.total_tokens if usage.total_tokens is not None else prompt + completion
    return Usage(prompt=prompt, completion=completion, total=total)


# --- HTTP errors -------------------------------------------------------------------------


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or a date)."""
    if (millis := headers.get("retry-after-ms")) is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _provider_message(body: bytes) -> str:
    """The error message in an error response body, else a snippet of the body."""
    text = body.decode("utf-8", "replace").strip()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return text[:_SNIPPET] or "(empty body)"
    if isinstance(raw, dict):
        for key in ("error", "message", "detail"):
            if raw.get(key):
                return _error_text(raw[key])
    return text[:_SNIPPET]


def _http_error(status: int, headers: httpx.Headers, body: bytes, url: str) -> ModelError:
    """The engine error for an HTTP error response (429 -> ``RateLimitError``)."""
    message = f"{url} answered HTTP {status}: {_provider_message(body)}"
    if status == 429:
        retry_after = _retry_after(headers)
        if retry_after is not None:
            message += f" (retry after {retry_after:g}s)"
        return RateLimitError(message, status_code=status, retry_after=retry_after)
    if status in (401, 403):
        message += " (check the API key: AGENT_OPENAI_API_KEY or OPENAI_API_KEY)"
    return ModelError(message, status_code=status)


# --- the driver --------------------------------------------------------------------------


class OpenAIChatDriver:
    """A :class:`~agent_core.drivers.base.ModelDriver` for chat-completions APIs.

    Use it as an async context manager, or call :meth:`aclose` when done. An injected
    ``client`` is shared, not owned: the driver does not close it.

    Args:
        settings: endpoint, key, default model and timeout; read from the environment
            when omitted (see :class:`OpenAISettings`).
        client: an ``httpx.AsyncClient`` to reuse (its own timeout then applies).
    """

    def __init__(
        self, settings: OpenAISettings | None = None, *, client: httpx.AsyncClient | None = None
    ) -> None:
        self.settings = settings if settings is not None else OpenAISettings()
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(self.settings.timeout))
        self.url = f"{self.settings.base_url}/chat/completions"

    def __repr__(self) -> str:
        return f"OpenAIChatDriver(url={self.url!r}, model={self.settings.model!r})"

    async def aclose(self) -> None:
        """Close the HTTP client if the driver created it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream one completion: deltas as they arrive, then one ``ResponseCompleted``.

        Raises:
            RateLimitError: HTTP 429.
            ModelTimeoutError: connecting, sending or waiting for the next chunk took
                longer than the timeout.
            ModelError: any other failure (HTTP error, connection, malformed stream,
                an error reported in the stream, invalid tool-call arguments).
        """
        body = request_body(request, self.settings.model)
        logger.debug("chat completion: %s, %d messages", body["model"], len(body["messages"]))
        accumulator = ChatStreamAccumulator()
        saw_done = False
        try:
            async with self._client.stream(
                "POST", self.url, json=body, headers=self._headers()
            ) as response:
                await self._check_response(response)
                async for data in _sse_data(response):
                    if data == _DONE:
                        saw_done = True
                        continue
                    for delta in accumulator.feed(_parse_chunk(data)):
                        yield delta
        except httpx.TimeoutException as exc:
            raise ModelTimeoutError(
                f"{self.url} did not answer within {self.settings.timeout:g}s "
                f"({type(exc).__name__})"
            ) from exc
        except httpx.RequestError as exc:
            raise ModelError(f"could not talk to {self.url}: {type(exc).__name__}: {exc}") from exc
        yield ResponseCompleted(response=accumulator.finish(saw_done=saw_done))

    async def _check_response(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            body = await response.aread()
            raise _http_error(response.status_code, response.headers, body, self.url)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            body = await response.aread()
            raise ModelError(
                f"{self.url} answered a stream request with {content_type or 'no content type'!r}"
                f" instead of text/event-stream: {_provider_message(body)}",
                status_code=response.status_code,
            )


async def _sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The data of each server-sent event up to and including ``[DONE]`` (anything after
    it is not read); an ``error`` event raises ``ModelError``."""
    decoder = SSEDecoder()
    async for line in response.aiter_lines():
        event = decoder.feed_line(line)
        if event is not None:
            yield _checked(event.event, event.data)
            if event.data == _DONE:
                return
    if (event := decoder.flush()) is not None:
        yield _checked(event.event, event.data)


def _checked(name: str, data: str) -> str:
    if name == "error":
        raise ModelError(
            f"the model API reported an error mid-stream: {_provider_message(data.encode())}"
        )
    return data
