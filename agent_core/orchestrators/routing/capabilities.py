"""Capabilities: named actions a router can execute, and their results (docs/agent_core.md).

A :class:`Capability` has a name, a description, JSON-schema parameters and an async
``execute(arguments)`` returning a :class:`CapabilityResult`. :class:`FunctionCapability`
makes one from a typed function (arguments validated like a tool's).
:class:`CapabilityRegistry` finds them by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agent_core.errors import ValidationError
from agent_core.messages import Usage
from agent_core.tools import Tool

__all__ = [
    "CAPABILITY_CALL",
    "Capability",
    "CapabilityRegistry",
    "CapabilityResult",
    "FunctionCapability",
]

CAPABILITY_CALL: ContextVar[str | None] = ContextVar("capability_call", default=None)
"""The id of the capability call being executed: the router sets it around
``execute``, so a capability that runs an agent can publish that agent as a run nested
under the call (:func:`agent_core.adapters.orchestration_broadcasting.nested_run_adapter`)."""


class CapabilityResult(BaseModel):
    """What a capability produced. ``success`` false is a result the continuation
    decider sees (the router also records it as the step's tool error, which the error
    policy judges); ``metadata["error"]`` says why, when known. ``usage``: the tokens
    producing it cost (counted in the router's step)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capability: str
    output: str
    success: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)


@runtime_checkable
class Capability(Protocol):
    """A named action."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]:
        """JSON schema of the arguments."""
        ...

    async def execute(self, arguments: Mapping[str, Any]) -> CapabilityResult: ...


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, default=str, ensure_ascii=False)


class FunctionCapability:
    """A capability from a typed function (sync or async). The function may return a
    :class:`CapabilityResult`, or any value (its text becomes the output).

    Raises (from :meth:`execute`):
        agent_core.errors.ValidationError: the arguments do not validate.
        Exception: whatever the function raises.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.tool = Tool.from_function(function, name=name, description=description)

    @property
    def name(self) -> str:
        return self.tool.name

    @property
    def description(self) -> str:
        return self.tool.description

    @property
    def parameters(self) -> Mapping[str, Any]:
        return self.tool.parameters

    async def execute(self, arguments: Mapping[str, Any]) -> CapabilityResult:
        result = await self.tool.invoke(arguments)
        if isinstance(result, CapabilityResult):
            return result
        return CapabilityResult(capability=self.name, output=_text(result))


class CapabilityRegistry:
    """Capabilities by name (immutable).

    Args:
        capabilities: capability objects, or typed functions (wrapped in
            :class:`FunctionCapability`).

    Raises:
        ValueError: two capabilities share a name.
    """

    def __init__(self, capabilities: Iterable[Capability | Callable[..., Any]] = ()) -> None:
        self._items: dict[str, Capability] = {}
        for item in capabilities:
            entry = item if isinstance(item, Capability) else FunctionCapability(item)
            if entry.name in self._items:
                raise ValueError(f"two capabilities are named {entry.name!r}: names must be unique")
            self._items[entry.name] = entry

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Capability]:
        return iter(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def get(self, name: str) -> Capability:
        """The capability called ``name``.

        Raises:
            agent_core.errors.ValidationError: no such capability (the message lists
                the registered ones).
        """
        found = self._items.get(name)
        if found is None:
            known = ", ".join(self._items) or "none"
            raise ValidationError(f"unknown capability {name!r}; registered capabilities: {known}")
        return found

    def describe(self) -> str:
        """One line per capability: name, description and parameters (for prompts)."""
        return "\n".join(
            f"- {c.name}: {c.description} parameters: {json.dumps(dict(c.parameters))}"
            for c in self._items.values()
        )
