"""A deterministic scripted model driver for offline demos and tests.

:class:`ScriptedDriver` plays a script, one turn per model call: a
:class:`ScriptedResponse` (text streamed as ``TextDelta`` chunks, tool calls streamed as
``ToolCallDelta`` pieces, then ``ResponseCompleted``), a :class:`ScriptedFailure`
(optionally some text, then a raised ``ModelError``/``RateLimitError``/
``ModelTimeoutError``), or a function of the request returning either (to answer from
tool results). Token usage is computed from text lengths, so it is deterministic too.
It is not a model: nothing is inferred.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent_core.drivers.base import (
    ModelRequest,
    ModelResponse,
    ResponseCompleted,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from agent_core.errors import ModelError
from agent_core.messages import FinishReason, ToolCall, Usage

__all__ = [
    "ScriptedDriver",
    "ScriptedFailure",
    "ScriptedResponse",
    "ScriptedTurn",
    "call",
    "word_chunks",
]


def word_chunks(text: str) -> tuple[str, ...]:
    """Split text into word-sized chunks that join back to ``text``."""
    chunks: list[str] = []
    for index, word in enumerate(text.split(" ")):
        chunks.append(word if index == 0 else f" {word}")
    return tuple(c for c in chunks if c)


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def call(name: str, call_id: str, **arguments: Any) -> ToolCall:
    """Shorthand for a scripted :class:`ToolCall`."""
    return ToolCall(id=call_id, name=name, arguments=arguments)


@dataclass(frozen=True, slots=True)
class ScriptedResponse:
    """One scripted model answer.

    Attributes:
        text: the assistant text.
        tool_calls: the tool calls to make.
        chunks: how to stream ``text`` (default: word by word); must join to ``text``.
        finish_reason: default ``tool_calls`` when calling tools, else ``stop``.
        usage: default computed from the request and answer lengths.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    chunks: tuple[str, ...] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None

    def __post_init__(self) -> None:
        if self.chunks is not None and "".join(self.chunks) != self.text:
            raise ValueError("ScriptedResponse chunks must join to exactly its text")

    def stream_chunks(self) -> tuple[str, ...]:
        return word_chunks(self.text) if self.chunks is None else self.chunks

    def response(self, request: ModelRequest) -> ModelResponse:
        """The complete response this turn gives to ``request``."""
        finish = self.finish_reason or (
            FinishReason.TOOL_CALLS if self.tool_calls else FinishReason.STOP
        )
        return ModelResponse(
            content=self.text,
            tool_calls=self.tool_calls,
            usage=self.usage or self._usage(request),
            finish_reason=finish,
        )

    def _usage(self, request: ModelRequest) -> Usage:
        prompt = sum(_tokens(m.content) + 4 for m in request.messages)
        calls = sum(_tokens(json.dumps(c.arguments)) + 8 for c in self.tool_calls)
        return Usage.of(prompt, _tokens(self.text) + calls)


@dataclass(frozen=True, slots=True)
class ScriptedFailure:
    """A scripted model failure: stream ``chunks_before``, then raise ``error``."""

    error: ModelError
    chunks_before: tuple[str, ...] = field(default=())


ScriptedTurn = (
    ScriptedResponse
    | ScriptedFailure
    | Callable[[ModelRequest], ScriptedResponse | ScriptedFailure]
)


class ScriptedDriver:
    """A :class:`~agent_core.drivers.base.ModelDriver` that plays ``turns`` in order.

    Attributes:
        requests: every request received, in order (for inspection).
    """

    def __init__(self, turns: Iterable[ScriptedTurn]) -> None:
        self._turns = tuple(turns)
        self._next = 0
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Turns not played yet."""
        return len(self._turns) - self._next

    def _turn(self, request: ModelRequest) -> ScriptedResponse | ScriptedFailure:
        if self._next >= len(self._turns):
            raise ModelError(
                f"ScriptedDriver script exhausted: all {len(self._turns)} turns were played; "
                "add turns for further model calls"
            )
        turn = self._turns[self._next]
        self._next += 1
        return turn if isinstance(turn, ScriptedResponse | ScriptedFailure) else turn(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Play the next turn.

        Raises:
            agent_core.errors.ModelError: the turn is a failure, or the script is over.
        """
        self.requests.append(request)
        turn = self._turn(request)
        if isinstance(turn, ScriptedFailure):
            for chunk in turn.chunks_before:
                yield TextDelta(text=chunk)
            raise turn.error
        for chunk in turn.stream_chunks():
            yield TextDelta(text=chunk)
        for index, tool_call in enumerate(turn.tool_calls):
            yield ToolCallDelta(index=index, id=tool_call.id, name=tool_call.name)
            yield ToolCallDelta(index=index, arguments=json.dumps(tool_call.arguments))
        yield ResponseCompleted(response=turn.response(request))
