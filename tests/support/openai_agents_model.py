"""A scripted ``agents.Model`` for the OpenAI Agents SDK (the SDK ships none): each
turn is a list of output items (assistant text, function calls), streamed as the
Responses API would stream them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

Item = ResponseOutputMessage | ResponseFunctionToolCall


def text(content: str, item_id: str = "msg-1") -> ResponseOutputMessage:
    part = ResponseOutputText(annotations=[], text=content, type="output_text")
    return ResponseOutputMessage(
        id=item_id, content=[part], role="assistant", status="completed", type="message"
    )


def call(name: str, arguments: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        arguments=arguments, call_id=call_id, name=name, type="function_call", id=f"fc-{call_id}"
    )


def _response(output: list[Item], usage: tuple[int, int] | None) -> Response:
    spent = None
    if usage is not None:
        spent = ResponseUsage(
            input_tokens=usage[0],
            input_tokens_details=InputTokensDetails(cache_write_tokens=0, cached_tokens=0),
            output_tokens=usage[1],
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            total_tokens=sum(usage),
        )
    return Response(
        id="resp-fake",
        created_at=time.time(),
        model="fake",
        object="response",
        output=list(output),
        tool_choice="auto",
        tools=[],
        parallel_tool_calls=False,
        usage=spent,
    )


class ScriptedModel(Model):
    """Answers each model call with the next turn; ``usage`` per turn (input, output);
    text is streamed in pieces of ``delta`` characters."""

    def __init__(self, turns: list[list[Item]], usage: tuple[int, int] = (10, 5), delta: int = 4):
        self.turns = list(turns)
        self.usage = usage
        self.delta = delta
        self.inputs: list[Any] = []

    def _next(self, input: Any) -> list[Item]:
        self.inputs.append(input)
        if not self.turns:
            raise AssertionError("the model was called more often than scripted")
        return self.turns.pop(0)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        output = self._next(args[1] if len(args) > 1 else kwargs.get("input"))
        spent = Usage(requests=1, input_tokens=self.usage[0], output_tokens=self.usage[1])
        return ModelResponse(output=list(output), usage=spent, response_id="resp-fake")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        output = self._next(args[1] if len(args) > 1 else kwargs.get("input"))
        seq = 0
        yield ResponseCreatedEvent(
            response=_response([], None), sequence_number=seq, type="response.created"
        )
        for index, item in enumerate(output):
            if isinstance(item, ResponseOutputMessage):
                whole = "".join(p.text for p in item.content if isinstance(p, ResponseOutputText))
                for start in range(0, len(whole), self.delta):
                    seq += 1
                    yield ResponseTextDeltaEvent(
                        content_index=0,
                        delta=whole[start : start + self.delta],
                        item_id=item.id,
                        logprobs=[],
                        output_index=index,
                        sequence_number=seq,
                        type="response.output_text.delta",
                    )
        yield ResponseCompletedEvent(
            response=_response(output, self.usage),
            sequence_number=seq + 1,
            type="response.completed",
        )
