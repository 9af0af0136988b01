"""Real agent states and steps for tests (no mocks: built through the state's API)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_core.app.demo_tools import calculator, get_weather
from agent_core.builder import AgentBuilder
from agent_core.continuation import ContinuationOutcome
from agent_core.drivers.scripted import (
    ScriptedDriver,
    ScriptedResponse,
    ScriptedTurn,
    call,
)
from agent_core.errors import ErrorType
from agent_core.events import (
    AgentEvent,
)
from agent_core.messages import FinishReason, Message, ToolCall, Usage
from agent_core.state import AgentState
from agent_core.steps import AgentStep, StepError, StepExecution

T0 = datetime(2026, 1, 16, 10, 0, 0, tzinfo=UTC)


class TickingClock:
    """A deterministic clock: every reading is ``tick`` later than the previous one."""

    def __init__(self, start: datetime = T0, tick: timedelta = timedelta(seconds=1)) -> None:
        self.now = start - tick
        self.tick = tick

    def __call__(self) -> datetime:
        self.now += self.tick
        return self.now


class ManualClock:
    """A clock that only moves when the test says so."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Seconds:
    """A monotonic clock in seconds (``time.monotonic``'s stand-in) that only moves when
    the test sets ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ids() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"id-{n}"


def tool_step(step_id: str = "s", *, tokens: int = 10) -> AgentStep:
    call = ToolCall(id=f"call-{step_id}", name="calc", arguments={"x": 1})
    return AgentStep(
        id=step_id,
        tool_calls=(call,),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=Usage.of(tokens, 0),
        messages=(Message.assistant("", (call,)),),
    )


def final_step(step_id: str = "s", content: str = "done", *, tokens: int = 10) -> AgentStep:
    return AgentStep(
        id=step_id,
        content=content,
        finish_reason=FinishReason.STOP,
        usage=Usage.of(tokens, 0),
        messages=(Message.assistant(content),),
    )


def error_step(step_id: str = "s", error_type: ErrorType = ErrorType.TOOL) -> AgentStep:
    return AgentStep(
        id=step_id,
        errors=(StepError(error_type, f"{error_type} went wrong"),),
        finish_reason=FinishReason.ERROR,
    )


def state_after(steps: Sequence[AgentStep], *, execution_id: str = "run-1") -> AgentState:
    """A running state whose current execution recorded ``steps`` (outcomes: continue)."""
    state = AgentState(agent_id="agent-1").start_execution(T0, execution_id)
    for number, step in enumerate(steps, start=1):
        state = state.begin_step(T0, step.id).record_step(step)
        result = StepExecution(
            step=step,
            outcome=ContinuationOutcome(should_continue=True),
            step_number=number,
            started_at=T0,
            completed_at=T0,
            id=step.id,
            execution_id=execution_id,
        )
        state = state.record_step_execution(result)
    return state


def judged(previous: Sequence[AgentStep], pending: AgentStep) -> AgentState:
    """The transition state criteria see: ``previous`` recorded, ``pending`` pending."""
    return state_after(previous).begin_step(T0, pending.id).record_step(pending)


MATH = call("calculator", "call_m", expression="6 * 7")


def calls(*tool_calls: object) -> ScriptedResponse:
    return ScriptedResponse(tool_calls=tuple(tool_calls))  # type: ignore[arg-type]


def say(text: str) -> ScriptedResponse:
    return ScriptedResponse(text=text)


class Run:
    """An agent with the two demo tools on a scripted driver, recording its events."""

    def __init__(self, turns: Sequence[ScriptedTurn], builder: AgentBuilder | None = None):
        self.events: list[AgentEvent] = []
        self.tool_runs: list[str] = []
        self.driver = ScriptedDriver(turns)
        base = builder or AgentBuilder()
        self.agent = (
            base.with_driver(self.driver)
            .with_tools(self._counted(get_weather), self._counted(calculator))
            .with_clock(TickingClock())
            .with_listener(self.events.append)
            .build()
        )

    def _counted(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """The tool function, recording each real run."""

        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.tool_runs.append(function.__name__)
            return function(*args, **kwargs)

        return counted

    async def __call__(
        self, start: str | AgentState = "What is the weather in Oslo?"
    ) -> AgentState:
        return await self.agent.run(start)

    def types(self) -> list[str]:
        """Event types, with runs of stream chunks collapsed to one entry."""
        collapsed: list[str] = []
        for event in self.events:
            if event.type == "agent.stream.chunk" and collapsed[-1:] == ["agent.stream.chunk"]:
                continue
            collapsed.append(event.type)
        return collapsed

    def of(self, kind: type[AgentEvent]) -> list[AgentEvent]:
        return [e for e in self.events if isinstance(e, kind)]
