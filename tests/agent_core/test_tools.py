"""Tools: schemas from functions and models, validated execution, recorded failures."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from agent_core.errors import ErrorType
from agent_core.messages import ToolCall
from agent_core.tools import Tool, ToolRegistry, blocked_execution, tool
from tests.support.factories import TickingClock


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return a + b


class Search(BaseModel):
    """Search the catalogue."""

    query: str = Field(description="what to look for")
    limit: int = Field(default=3, ge=1, le=10)


def search(args: Search) -> list[str]:
    return [f"{args.query}-{i}" for i in range(args.limit)]


async def shout(text: str, style: Literal["upper", "title"] = "upper") -> str:
    """Shout asynchronously."""
    return text.upper() if style == "upper" else text.title()


def explode() -> None:
    """Always fails."""
    raise RuntimeError("kaboom")


def test_schema_from_a_typed_function() -> None:
    made = Tool.from_function(add)
    assert (made.name, made.description) == ("add", "Add two integers.")
    assert made.parameters["type"] == "object"
    assert made.parameters["required"] == ["a"]
    assert made.parameters["properties"]["a"]["type"] == "integer"
    assert made.parameters["properties"]["a"]["description"] == "the first addend."
    assert made.parameters["properties"]["b"]["default"] == 2
    assert made.parameters["additionalProperties"] is False
    assert made.schema().name == "add"


def test_schema_from_a_pydantic_model() -> None:
    made = Tool.from_model(Search, search)
    assert made.description == "Search the catalogue."
    assert made.parameters["properties"]["query"]["description"] == "what to look for"
    assert made.parameters["properties"]["limit"]["maximum"] == 10


def test_decorator_with_and_without_options() -> None:
    plain = tool(add)
    named = tool(name="adder", description="adds")(add)
    assert plain.name == "add"
    assert (named.name, named.description) == ("adder", "adds")


def test_untyped_and_variadic_parameters_are_rejected() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    def variadic(*items: int) -> int:
        return 0

    with pytest.raises(TypeError, match="parameter 'x' needs a type annotation"):
        Tool.from_function(untyped)
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        Tool.from_function(variadic)


def test_invalid_tool_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="tool name 'has space' is invalid"):
        Tool.from_function(add, name="has space")
    # A final newline is not the end of the name (``re.match`` with ``$`` allowed it).
    with pytest.raises(ValueError, match="is invalid"):
        Tool.from_function(add, name="add\n")


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolRegistry([add, Tool.from_function(add)])


async def test_execute_sync_async_and_model_tools() -> None:
    registry = ToolRegistry([add, shout, Tool.from_model(Search, search)])
    clock = TickingClock()
    result = await registry.execute(ToolCall(id="1", name="add", arguments={"a": 40}), clock)
    assert (result.output, result.success, result.duration_ms) == ("42", True, 1000.0)
    result = await registry.execute(ToolCall(id="2", name="shout", arguments={"text": "hi"}), clock)
    assert result.output == "HI"
    arguments = {"query": "x", "limit": 2}
    result = await registry.execute(ToolCall(id="3", name="search", arguments=arguments), clock)
    assert result.output == '["x-0", "x-1"]'


async def test_unknown_tool_is_a_recorded_error() -> None:
    registry = ToolRegistry([add])
    result = await registry.execute(ToolCall(id="c1", name="nope"), TickingClock())
    assert result.error is not None
    assert result.error.error_type is ErrorType.TOOL
    assert result.error.message == "unknown tool 'nope'; available tools: add"
    assert (result.error.tool_name, result.error.tool_call_id) == ("nope", "c1")
    assert result.message().content == "Error: unknown tool 'nope'; available tools: add"


async def test_invalid_arguments_are_a_recorded_validation_error() -> None:
    registry = ToolRegistry([add])
    call = ToolCall(id="c1", name="add", arguments={"a": "many", "zzz": 1})
    result = await registry.execute(call, TickingClock())
    assert result.error is not None
    assert result.error.error_type is ErrorType.VALIDATION
    assert result.error.message.startswith("invalid arguments for tool 'add': a: Input should be")
    assert "zzz: Extra inputs are not permitted" in result.error.message


async def test_raising_tool_is_a_recorded_error() -> None:
    result = await ToolRegistry([explode]).execute(ToolCall(id="c", name="explode"), TickingClock())
    assert result.error is not None
    assert result.error.message == "tool 'explode' raised RuntimeError: kaboom"
    assert result.error.tool_call_id == "c"


def test_blocked_call_is_a_recorded_error() -> None:
    result = blocked_execution(ToolCall(id="c9", name="add"), "not allowed today", TickingClock())
    assert result.blocked
    assert result.error is not None
    assert result.error.message == "tool call 'add' (c9) was blocked: not allowed today"


def test_registry_is_immutable_and_lists_tools() -> None:
    first = ToolRegistry([add])
    second = first.with_tools(shout)
    assert first.names() == ("add",)
    assert second.names() == ("add", "shout")
    assert "shout" in second
    assert len(second.schemas()) == 2
