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

Limits: the endpoint is not trusted with the process's memory or time. The body is read
as bytes and split into lines here; a line longer than ``max_line_bytes`` (1 MiB), a
body longer than ``max_response_bytes`` (16 MiB), text longer than ``max_text_bytes``
(4 MiB), one tool call's arguments longer than ``max_tool_arguments_bytes`` (1 MiB) or
nested deeper than ``max_tool_arguments_depth`` (64), more than ``max_tool_calls``
(128) tool calls -> ``ModelError``; a response not
finished within ``response_timeout`` (300 s, in addition to the per-read ``timeout``)
-> ``ModelTimeoutError``. Each message names the limit, its value and its setting.
Of an error body (HTTP >= 400, or not an event stream) the first 64 KiB are read.
Compressed bodies are not accepted (the driver asks for ``identity``), so that bytes
read are bytes held.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated, Any, Self

import httpx
import pydantic
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_core.drivers._sse import LineDecoder, SSEDecoder, SSELimitError
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
from broadcaster.envelope import MAX_WIRE_INT, wire_safe

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
_INT_DIGITS = len(str(MAX_WIRE_INT))


class _IntegerTooLarge(ValueError):
    pass


_CHUNK_DIGITS = 100


def _chunk_int(text: str) -> int:
    """A JSON integer of a stream chunk, exact (a tool call's index may be any number;
    a usage count is clamped by :class:`~agent_core.messages.Usage`), but refused past
    100 digits: ``int()`` raised ValueError past 4,300 and the run crashed."""
    if len(text) > _CHUNK_DIGITS:
        raise _IntegerTooLarge(f"an integer of {len(text)} digits")
    return int(text)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: half of a pair, or alone (not UTF-8 at all)."""


def _without_lone_surrogates(text: str, value: Any) -> Any:
    """``value``, parsed from JSON ``text``, with every lone surrogate (an escape like
    ``\\ud800`` without its pair: a broken or hostile API's) replaced by U+FFFD: no text
    that UTF-8, and so orjson, the wire and the stored state, cannot carry gets in."""
    return wire_safe(value)[0] if _SURROGATE_ESCAPE.search(text) else value


def _bounded_int(text: str) -> int:
    """A JSON integer of a tool call's arguments; beyond ``±MAX_WIRE_INT`` refused (a
    tool must not run with a value other than the model's)."""
    negative = text.startswith("-")
    if len(text) - negative <= _INT_DIGITS and abs(value := int(text)) <= MAX_WIRE_INT:
        return value
    raise _IntegerTooLarge(f"the integer {text[:30]}{'...' if len(text) > 30 else ''}")


_MIB = 1024 * 1024
_ERROR_BODY_BYTES = 64 * 1024  # read of an error body, which is only quoted
# orjson refuses to serialize past 255 levels, and arguments are nested a few levels
# deep in envelopes and snapshots: a higher limit would let a model break them.
_MAX_DEPTH_LIMIT = 128


def _env(name: str) -> AliasChoices:
    # The first alias found wins: the specific AGENT_OPENAI_* over the common OPENAI_*.
    return AliasChoices(f"AGENT_OPENAI_{name.upper()}", f"OPENAI_{name.upper()}")


def _over_limit(what: str, setting: str, limit: int, unit: str = "bytes") -> ModelError:
    """The error for a response that went over one of the settings' limits."""
    return ModelError(
        f"{what} is over the limit: {setting} = {limit} {unit} "
        f"(AGENT_OPENAI_{setting.upper()}); the response was not read further"
    )


def _utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


class OpenAISettings(BaseSettings):
    """Where and how to reach the chat-completions API.

    Each field is read from ``AGENT_OPENAI_<FIELD>`` or else ``OPENAI_<FIELD>`` in the
    environment (``AGENT_OPENAI_*`` wins when both are set, so the agent can use a
    different endpoint than other OpenAI tools on the same machine); arguments to the
    constructor win over both. ``api_key`` is optional because local servers rarely
    need one; without it no ``Authorization`` header is sent.

    ``timeout`` bounds connecting and each read; ``response_timeout`` bounds one whole
    response. The ``max_*`` fields bound what one response may hold (see the module
    docstring); a response over one fails with a ``ModelError`` naming it.
    """

    model_config = SettingsConfigDict(
        populate_by_name=True, extra="ignore", validate_default=True, frozen=True
    )

    base_url: Annotated[str, Field(validation_alias=_env("base_url"))] = "https://api.openai.com/v1"
    api_key: Annotated[SecretStr | None, Field(validation_alias=_env("api_key"), repr=False)] = None
    model: Annotated[str, Field(min_length=1, validation_alias=_env("model"))] = "gpt-4o-mini"
    timeout: Annotated[float, Field(gt=0, validation_alias=_env("timeout"))] = 60.0
    response_timeout: Annotated[float, Field(gt=0, validation_alias=_env("response_timeout"))] = (
        300.0
    )
    max_line_bytes: Annotated[int, Field(gt=0, validation_alias=_env("max_line_bytes"))] = _MIB
    max_response_bytes: Annotated[int, Field(gt=0, validation_alias=_env("max_response_bytes"))] = (
        16 * _MIB
    )
    max_text_bytes: Annotated[int, Field(gt=0, validation_alias=_env("max_text_bytes"))] = 4 * _MIB
    max_tool_arguments_bytes: Annotated[
        int, Field(gt=0, validation_alias=_env("max_tool_arguments_bytes"))
    ] = _MIB
    max_tool_arguments_depth: Annotated[
        int, Field(gt=0, le=_MAX_DEPTH_LIMIT, validation_alias=_env("max_tool_arguments_depth"))
    ] = 64
    max_tool_calls: Annotated[int, Field(gt=0, validation_alias=_env("max_tool_calls"))] = 128

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
        raw = _without_lone_surrogates(data, json.loads(data, parse_int=_chunk_int))
    except _IntegerTooLarge as exc:
        raise ModelError(f"malformed stream chunk: {exc}: {data[:_SNIPPET]!r}") from exc
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"malformed stream chunk: not JSON ({exc.msg} at position {exc.pos}): "
            f"{data[:_SNIPPET]!r}"
        ) from exc
    except RecursionError as exc:
        raise ModelError(f"malformed stream chunk: nested too deeply: {data[:_SNIPPET]!r}") from exc
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
    size: int = 0  # bytes of arguments so far

    def complete(self, index: int, max_depth: int) -> ToolCall:
        if not self.id or not self.name:
            missing = "id" if not self.id else "function name"
            raise ModelError(f"streamed tool call #{index} ended without its {missing}")
        text = "".join(self.arguments).strip() or "{}"
        try:
            arguments = _without_lone_surrogates(text, json.loads(text, parse_int=_bounded_int))
        except json.JSONDecodeError as exc:
            raise ModelError(
                f"the model sent invalid JSON arguments for tool {self.name!r} "
                f"(call {self.id}): {exc.msg} at position {exc.pos}: {text[:_SNIPPET]!r}"
            ) from exc
        except _IntegerTooLarge as exc:
            raise ModelError(
                f"the model sent arguments for tool {self.name!r} (call {self.id}) with "
                f"{exc}, beyond ±{MAX_WIRE_INT} (2**53 - 1, what JSON readers hold exactly)"
            ) from exc
        except RecursionError as exc:
            raise self._too_deep(max_depth) from exc
        if not isinstance(arguments, dict):
            raise ModelError(
                f"the model sent arguments for tool {self.name!r} (call {self.id}) that "
                f"are JSON but not an object: {text[:_SNIPPET]!r}"
            )
        if text.count("{") + text.count("[") > max_depth and _deeper_than(arguments, max_depth):
            raise self._too_deep(max_depth)
        return ToolCall(id=self.id, name=self.name, arguments=arguments)

    def _too_deep(self, max_depth: int) -> ModelError:
        what = f"the nesting of the arguments for tool {self.name!r} (call {self.id})"
        return _over_limit(what, "max_tool_arguments_depth", max_depth, "levels")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON containers in ``value`` nest more than ``limit`` levels (``value``
    itself is level 1); one pass per level, no recursion."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


@dataclass
class ChatStreamAccumulator:
    """Sans-I/O assembly of a streamed chat completion (the first choice only).

    Feed it each parsed chunk; it returns the deltas to pass on and remembers enough to
    build the final :class:`ModelResponse` in :meth:`finish`. The ``max_*`` fields are
    the limits of the same names in :class:`OpenAISettings`; going over one raises
    ``ModelError``.
    """

    max_text_bytes: int = 4 * _MIB
    max_tool_arguments_bytes: int = _MIB
    max_tool_arguments_depth: int = 64
    max_tool_calls: int = 128
    _text: list[str] = field(default_factory=list)
    _text_size: int = 0
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
            self._text_size += _utf8_length(delta.content)
            if self._text_size > self.max_text_bytes:
                raise _over_limit("the model's text", "max_text_bytes", self.max_text_bytes)
            self._text.append(delta.content)
            yield TextDelta(text=delta.content)
        for position, fragment in enumerate(delta.tool_calls or ()):
            yield self._feed_tool_call(position, fragment)

    def _feed_tool_call(self, position: int, fragment: _ToolCallFragment) -> ToolCallDelta:
        index = position if fragment.index is None else fragment.index
        partial = self._calls.get(index)
        if partial is None:
            if len(self._calls) >= self.max_tool_calls:
                raise _over_limit(
                    "the number of tool calls", "max_tool_calls", self.max_tool_calls, "calls"
                )
            partial = self._calls[index] = _PartialCall()
        function = fragment.function or _FunctionDelta()
        partial.id = partial.id or fragment.id or None
        partial.name = partial.name or function.name or None
        arguments = function.arguments or ""
        partial.size += _utf8_length(arguments)
        if partial.size > self.max_tool_arguments_bytes:
            limit = self.max_tool_arguments_bytes
            what = f"the arguments of tool call #{index} ({partial.name or 'no name yet'})"
            raise _over_limit(what, "max_tool_arguments_bytes", limit)
        partial.arguments.append(arguments)
        return ToolCallDelta(index=index, id=fragment.id, name=function.name, arguments=arguments)

    def finish(self, *, saw_done: bool) -> ModelResponse:
        """The assembled response.

        Args:
            saw_done: whether the stream ended with ``[DONE]``; without it, a stream
                that never gave a finish reason counts as cut off.

        Raises:
            ModelError: the stream was cut off, or a tool call is incomplete or has
                arguments that are not a JSON object or nest too deeply.
        """
        if not saw_done and self._finish_reason is None:
            raise ModelError(
                "the model API closed the stream before the response finished "
                "(no finish_reason and no [DONE])"
            )
        depth = self.max_tool_arguments_depth
        calls = tuple(self._calls[index].complete(index, depth) for index in sorted(self._calls))
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
        settings: endpoint, key, default model, timeouts and limits; read from the
            environment when omitted (see :class:`OpenAISettings`).
        client: an ``httpx.AsyncClient`` to reuse (its own timeout then applies; the
            settings' ``response_timeout`` and limits still do).
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
        # identity: a compressed body could expand far past what was read.
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream one completion: deltas as they arrive, then one ``ResponseCompleted``.

        Raises:
            RateLimitError: HTTP 429.
            ModelTimeoutError: connecting, sending or waiting for the next chunk took
                longer than ``timeout``, or the whole response longer than
                ``response_timeout``.
            ModelError: any other failure (HTTP error, connection, malformed stream,
                an error reported in the stream, invalid tool-call arguments, a
                response over one of the settings' limits).
        """
        body = request_body(request, self.settings.model)
        logger.debug("chat completion: %s, %d messages", body["model"], len(body["messages"]))
        settings = self.settings
        accumulator = ChatStreamAccumulator(
            max_text_bytes=settings.max_text_bytes,
            max_tool_arguments_bytes=settings.max_tool_arguments_bytes,
            max_tool_arguments_depth=settings.max_tool_arguments_depth,
            max_tool_calls=settings.max_tool_calls,
        )
        deadline = asyncio.get_running_loop().time() + settings.response_timeout
        saw_done = False
        try:
            sent = self._client.build_request("POST", self.url, json=body, headers=self._headers())
            async with asyncio.timeout_at(deadline):
                response = await self._client.send(sent, stream=True)
            try:
                await self._check_response(response, deadline)
                async for data in self._sse_data(response, deadline):
                    if data == _DONE:
                        saw_done = True
                        continue
                    for delta in accumulator.feed(_parse_chunk(data)):
                        yield delta
            finally:
                await response.aclose()
        except httpx.TimeoutException as exc:
            raise ModelTimeoutError(
                f"{self.url} did not answer within {settings.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except TimeoutError as exc:  # the deadline: asyncio.timeout_at above and below
            raise ModelTimeoutError(
                f"{self.url} did not finish its response in time: response_timeout = "
                f"{settings.response_timeout:g}s (AGENT_OPENAI_RESPONSE_TIMEOUT)"
            ) from exc
        except httpx.RequestError as exc:
            raise ModelError(f"could not talk to {self.url}: {type(exc).__name__}: {exc}") from exc
        yield ResponseCompleted(response=accumulator.finish(saw_done=saw_done))

    async def _check_response(self, response: httpx.Response, deadline: float) -> None:
        if response.status_code >= 400:
            body = await self._error_body(response, deadline)
            raise _http_error(response.status_code, response.headers, body, self.url)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            body = await self._error_body(response, deadline)
            raise ModelError(
                f"{self.url} answered a stream request with {content_type or 'no content type'!r}"
                f" instead of text/event-stream: {_provider_message(body)}",
                status_code=response.status_code,
            )
        if encoding := _content_encoding(response):
            raise ModelError(
                f"{self.url} sent a {encoding!r}-encoded stream although the driver asked for "
                "Accept-Encoding: identity; compressed responses are refused because their "
                "size could not be bounded",
                status_code=response.status_code,
            )

    async def _error_body(self, response: httpx.Response, deadline: float) -> bytes:
        """The start of a body that is only quoted in an error message."""
        if encoding := _content_encoding(response):
            return f"(a {encoding}-encoded body, not read)".encode()
        body = bytearray()
        async with contextlib.aclosing(self._body(response, deadline)) as chunks:
            async for chunk in chunks:
                body += chunk[: _ERROR_BODY_BYTES - len(body)]
                if len(body) >= _ERROR_BODY_BYTES:
                    break
        return bytes(body)

    async def _body(
        self, response: httpx.Response, deadline: float, limit: int | None = None
    ) -> AsyncGenerator[bytes]:
        """The body as read, each read within the deadline.

        Raises:
            ModelError: the body is longer than ``limit`` bytes (``max_response_bytes``).
            TimeoutError: the deadline passed.
        """
        received = 0
        chunks = response.aiter_raw()
        while True:
            async with asyncio.timeout_at(deadline):
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            received += len(chunk)
            if limit is not None and received > limit:
                raise _over_limit("the response body", "max_response_bytes", limit)
            yield chunk

    async def _sse_data(self, response: httpx.Response, deadline: float) -> AsyncIterator[str]:
        """The data of each server-sent event up to and including ``[DONE]`` (anything
        after it is not read); an ``error`` event raises ``ModelError``."""
        settings = self.settings
        lines = LineDecoder(settings.max_line_bytes)
        decoder = SSEDecoder(max_data_length=settings.max_line_bytes)
        body = self._body(response, deadline, settings.max_response_bytes)
        try:
            async with contextlib.aclosing(body) as chunks:
                async for chunk in chunks:
                    for data in _event_data(decoder, lines.feed(chunk)):
                        yield data
                        if data == _DONE:
                            return
            # A blank line after the last one dispatches an event the server left open.
            for data in _event_data(decoder, [*lines.flush(), ""]):
                yield data
        except SSELimitError as exc:
            raise _over_limit(f"{exc.what} in the stream", "max_line_bytes", exc.limit) from exc


def _event_data(decoder: SSEDecoder, lines: list[str]) -> Iterator[str]:
    """The data of each event that ``lines`` complete; an ``error`` event raises."""
    for line in lines:
        event = decoder.feed_line(line)
        if event is not None:
            yield _checked(event.event, event.data)


def _content_encoding(response: httpx.Response) -> str:
    """The body's content coding, ``""`` for none."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    return "" if encoding == "identity" else encoding


def _checked(name: str, data: str) -> str:
    if name == "error":
        raise ModelError(
            f"the model API reported an error mid-stream: {_provider_message(data.encode())}"
        )
    return data
