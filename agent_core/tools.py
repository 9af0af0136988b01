"""Tools: typed Python functions (or pydantic models) the model may call.

A :class:`Tool` has a name, a description and JSON-schema parameters generated from
the function's signature or from a pydantic model. A :class:`ToolRegistry` runs calls
with validation; every failure (unknown tool, invalid arguments, a blocked call, a
raising tool) becomes a :class:`~agent_core.steps.ToolExecution` carrying a clear error
message, never an exception that escapes.

Sync tools run inline on the event loop: make tools that do I/O ``async``.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints, overload

import pydantic
from pydantic import BaseModel, ConfigDict

from agent_core._frozen import thaw
from agent_core._time import Clock
from agent_core.drivers.base import ToolSchema
from agent_core.errors import AgentError, ToolError, ValidationError
from agent_core.messages import ToolCall
from agent_core.steps import StepError, ToolExecution

__all__ = ["Tool", "ToolRegistry", "blocked_execution", "tool"]

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ARG_LINE = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?:\s*(.+)$")


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"tool name {name!r} is invalid: use 1-64 letters, digits, '_' or '-' "
            "(the limit model providers enforce)"
        )
    return name


def _summary(doc: str | None) -> str:
    """The docstring's first paragraph, on one line."""
    text = inspect.cleandoc(doc or "")
    return " ".join(text.split("\n\n", 1)[0].split())


def _arg_descriptions(doc: str | None) -> dict[str, str]:
    """Descriptions from a Google-style ``Args:`` section."""
    descriptions: dict[str, str] = {}
    in_args = False
    for line in (doc or "").splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
        elif in_args and (match := _ARG_LINE.match(line)):
            descriptions[match.group(1)] = match.group(2).strip()
        elif in_args and line.strip() and not line.startswith((" ", "\t")):
            break
    return descriptions


def _arguments_model(function: Callable[..., Any], tool_name: str) -> type[BaseModel]:
    hints = get_type_hints(function)
    docs = _arg_descriptions(function.__doc__)
    fields: dict[str, Any] = {}
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
        if param.name not in hints:
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            hints[param.name],
            pydantic.Field(default, description=docs.get(param.name)),
        )
    config = ConfigDict(extra="forbid")
    model: type[BaseModel] = pydantic.create_model(
        f"{tool_name}_arguments", __config__=config, **fields
    )
    return model


def _parameters(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable the model may use.

    Build one with :meth:`from_function`, :meth:`from_model` or the :func:`tool`
    decorator rather than directly.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    arguments_model: type[BaseModel]
    function: Callable[..., Any]
    takes_model: bool = False

    @classmethod
    def from_function(
        cls,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Tool:
        """A tool from a typed function: parameters from its annotations and defaults,
        description from its docstring (and ``Args:`` section).

        Raises:
            TypeError: a parameter lacks an annotation, or is ``*args``/``**kwargs``.
            ValueError: the name is not a valid tool name.
        """
        tool_name = _check_name(name or function.__name__)
        model = _arguments_model(function, tool_name)
        summary = description if description is not None else _summary(function.__doc__)
        return cls(tool_name, summary, _parameters(model), model, function)

    @classmethod
    def from_model(
        cls,
        model: type[M],
        function: Callable[[M], Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Tool:
        """A tool whose arguments are a pydantic model; ``function`` receives the
        validated model instance.

        Raises:
            ValueError: the name is not a valid tool name.
        """
        tool_name = _check_name(name or function.__name__)
        summary = description if description is not None else _summary(model.__doc__)
        return cls(tool_name, summary, _parameters(model), model, function, takes_model=True)

    def schema(self) -> ToolSchema:
        """The tool as the model sees it."""
        return ToolSchema(
            name=self.name, description=self.description, parameters=dict(self.parameters)
        )

    def validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Validate call arguments.

        Raises:
            agent_core.errors.ValidationError: names every invalid or missing argument.
        """
        try:
            return self.arguments_model.model_validate(thaw(arguments))
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValidationError(f"invalid arguments for tool '{self.name}': {problems}") from exc

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Validate ``arguments`` and call the function (awaiting it if async).

        Raises:
            agent_core.errors.ValidationError: the arguments do not validate.
            Exception: whatever the function raises.
        """
        validated = self.validate(arguments)
        if self.takes_model:
            result = self.function(validated)
        else:
            result = self.function(
                **{k: getattr(validated, k) for k in type(validated).model_fields}
            )
        if inspect.isawaitable(result):
            result = await result
        return result


@overload
def tool(function: F, /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator: ``@tool`` or ``@tool(name=..., description=...)`` turns a typed
    function into a :class:`Tool`."""
    if function is not None:
        return Tool.from_function(function)

    def decorate(fn: Callable[..., Any]) -> Tool:
        return Tool.from_function(fn, name=name, description=description)

    return decorate


def _output_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return json.dumps(result, default=str, ensure_ascii=False)


def blocked_execution(call: ToolCall, reason: str, now: Clock) -> ToolExecution:
    """The recorded result of a call that hooks blocked."""
    moment = now()
    error = ToolError(
        f"tool call '{call.name}' ({call.id}) was blocked: {reason}",
        tool_name=call.name,
        tool_call_id=call.id,
    )
    return ToolExecution(call, "", moment, moment, StepError.from_error(error), blocked=True)


class ToolRegistry:
    """The tools an agent may use, by name; immutable."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            entry = item if isinstance(item, Tool) else Tool.from_function(item)
            if entry.name in self._tools:
                raise ValueError(f"two tools are named {entry.name!r}: tool names must be unique")
            self._tools[entry.name] = entry

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def with_tools(self, *tools: Tool | Callable[..., Any]) -> ToolRegistry:
        """A new registry with ``tools`` added."""
        return ToolRegistry((*self._tools.values(), *tools))

    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def schemas(self) -> tuple[ToolSchema, ...]:
        return tuple(t.schema() for t in self._tools.values())

    def get(self, name: str) -> Tool:
        """The tool called ``name``.

        Raises:
            agent_core.errors.ToolError: there is no such tool (the message lists the
                available ones).
        """
        found = self._tools.get(name)
        if found is None:
            available = ", ".join(self._tools) or "none"
            raise ToolError(f"unknown tool '{name}'; available tools: {available}", tool_name=name)
        return found

    async def execute(self, call: ToolCall, clock: Clock) -> ToolExecution:
        """Run one call; any failure is recorded on the returned execution."""
        started = clock()
        try:
            output, error = _output_text(await self.get(call.name).invoke(call.arguments)), None
        except AgentError as exc:
            output, error = "", exc
        except Exception as exc:
            output, error = "", ToolError(f"tool '{call.name}' raised {type(exc).__name__}: {exc}")
        record = None if error is None else StepError.from_error(error)
        if record is not None:
            record = StepError(record.error_type, record.message, call.name, call.id)
        return ToolExecution(call, output, started, clock(), record)
