"""The model driver contract: an async interface with streaming.

A driver turns a :class:`ModelRequest` into a stream of :class:`StreamEvent`\\ s that
ends with exactly one :class:`ResponseCompleted` carrying the whole
:class:`ModelResponse`. Failures raise :class:`agent_core.errors.ModelError` (or its
``RateLimitError`` / ``ModelTimeoutError`` subclasses).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agent_core.messages import FinishReason, Message, ToolCall, Usage

__all__ = [
    "ModelDriver",
    "ModelRequest",
    "ModelResponse",
    "ResponseCompleted",
    "StreamEvent",
    "TextDelta",
    "ToolCallDelta",
    "ToolSchema",
    "complete",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolSchema(_Frozen):
    """A tool as the model sees it: name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ModelRequest(_Frozen):
    messages: tuple[Message, ...]
    tools: tuple[ToolSchema, ...] = ()
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None


class ModelResponse(_Frozen):
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    finish_reason: FinishReason = FinishReason.STOP

    def message(self) -> Message:
        """The assistant message this response adds to the conversation."""
        return Message.assistant(self.content, self.tool_calls)


class TextDelta(_Frozen):
    """A piece of streamed assistant text."""

    text: str


class ToolCallDelta(_Frozen):
    """A piece of a streamed tool call (``index`` identifies the call in the response;
    ``id``/``name`` arrive first, ``arguments`` is a JSON text fragment)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ResponseCompleted(_Frozen):
    response: ModelResponse


StreamEvent = TextDelta | ToolCallDelta | ResponseCompleted


@runtime_checkable
class ModelDriver(Protocol):
    """Anything that can stream a model response."""

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Yield deltas, then exactly one ``ResponseCompleted``.

        Raises:
            agent_core.errors.ModelError: the model could not answer.
        """
        ...


async def complete(driver: ModelDriver, request: ModelRequest) -> ModelResponse:
    """Drain ``driver.stream(request)`` and return the final response."""
    async for event in driver.stream(request):
        if isinstance(event, ResponseCompleted):
            return event.response
    from agent_core.errors import ModelError

    raise ModelError("driver stream ended without a ResponseCompleted event")
