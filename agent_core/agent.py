"""The agent: a configured loop plus a convenient way to start runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agent_core.events import AgentEvent, EventDispatcher, Listener
from agent_core.loop import AgentLoop
from agent_core.state import AgentState
from agent_core.tools import ToolRegistry

__all__ = ["Agent"]

E = TypeVar("E", bound=AgentEvent)


class Agent:
    """Runs executions with a loop built by :class:`~agent_core.builder.AgentBuilder`.

    One agent runs one execution at a time (its time limit tracks the running
    execution); build one agent per concurrent run, which is cheap.
    """

    def __init__(self, loop: AgentLoop, events: EventDispatcher, tools: ToolRegistry) -> None:
        self.loop = loop
        self.events = events
        self.tools = tools
        self._running = False

    def new_state(
        self,
        user_message: str | None = None,
        *,
        agent_id: str | None = None,
        parent_agent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AgentState:
        """A fresh state, optionally with a first user message."""
        state = AgentState(parent_agent_id=parent_agent_id, metadata=metadata or {})
        if agent_id is not None:
            state = AgentState(
                agent_id=agent_id, parent_agent_id=parent_agent_id, metadata=state.metadata
            )
        return state if user_message is None else state.with_user_message(user_message)

    def listen(self, listener: Listener) -> None:
        """Receive every event (sync or async listener)."""
        self.events.listen(listener)

    def on(self, event_type: type[E], listener: Callable[[E], Awaitable[None] | None]) -> None:
        """Receive events of one type."""
        self.events.on(event_type, listener)

    async def run(self, start: str | AgentState) -> AgentState:
        """Run one execution from a user message (new state) or an existing state and
        return the final state. Errors end up recorded in the state, not raised.

        Raises:
            RuntimeError: this agent is already running an execution.
        """
        final: AgentState | None = None
        async for final in self.iterate(start):  # noqa: B007 (the last one is wanted)
            pass
        assert final is not None, "iterate() always yields the final state"
        return final

    async def iterate(self, start: str | AgentState) -> AsyncIterator[AgentState]:
        """Like :meth:`run`, yielding the state after each step and the final state.

        Raises:
            RuntimeError: this agent is already running an execution.
        """
        if self._running:
            raise RuntimeError(
                "this Agent is already running an execution; build one Agent per "
                "concurrent run (AgentBuilder.build() is cheap)"
            )
        state = self.new_state(start) if isinstance(start, str) else start
        self._running = True
        try:
            async for item in self.loop.iterate(state):
                yield item
        finally:
            self._running = False
