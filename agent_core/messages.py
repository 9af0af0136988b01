"""Chat messages, tool calls and token usage: the vocabulary shared by state, tools and
model drivers. All frozen, their data too (tool-call arguments and message metadata are
read-only mappings); "changing" one returns a new object."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agent_core._frozen import freeze_mapping
from broadcaster.envelope import MAX_WIRE_INT

__all__ = ["FinishReason", "Message", "Role", "ToolCall", "Usage"]


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class FinishReason(StrEnum):
    """Why the model stopped producing output (OpenAI's vocabulary plus ``error``)."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    ERROR = "error"


ReadOnlyData = Annotated[dict[str, Any], AfterValidator(freeze_mapping)]
"""JSON-like data that cannot be changed in place (see :mod:`agent_core._frozen`)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update`` the result is validated (so changed data is
        read-only too, and invalid values are refused)."""
        if not update:
            return super().model_copy(deep=deep)
        return self.model_validate({**dict(self), **update})


class ToolCall(_Frozen):
    """A model's request to run one tool. ``id`` is the model's call id (never empty)."""

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: ReadOnlyData = Field(default_factory=dict)


Tokens = Annotated[int, Field(ge=0), AfterValidator(lambda n: min(n, MAX_WIRE_INT))]
"""A token count: a larger one (a hostile or broken model API's, a sum of them, a stored
state's) is :data:`~broadcaster.envelope.MAX_WIRE_INT`, which every envelope, stored
state and JavaScript reader holds exactly."""


class Usage(_Frozen):
    """Token usage; ``total`` is prompt + completion unless a provider says otherwise.
    Each count saturates at :data:`~broadcaster.envelope.MAX_WIRE_INT`."""

    prompt: Tokens = 0
    completion: Tokens = 0
    total: Tokens = 0

    @classmethod
    def of(cls, prompt: int = 0, completion: int = 0) -> Usage:
        return cls(prompt=prompt, completion=completion, total=prompt + completion)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt=self.prompt + other.prompt,
            completion=self.completion + other.completion,
            total=self.total + other.total,
        )


class Message(_Frozen):
    """One chat message.

    ``tool_calls`` is set on assistant messages that call tools; ``tool_call_id`` and
    ``name`` on tool-result messages.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    metadata: ReadOnlyData = Field(default_factory=dict)

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role=Role.SYSTEM, content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role=Role.USER, content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return cls(role=Role.ASSISTANT, content=content, tool_calls=tool_calls)

    @classmethod
    def tool(cls, content: str, tool_call_id: str, name: str) -> Message:
        return cls(role=Role.TOOL, content=content, tool_call_id=tool_call_id, name=name)
