"""The generic step-by-step base under the tool-use, chat, collaboration and routing
orchestrators (docs/agent_core.md).

:class:`StepByStep` runs a :class:`~agent_core.orchestrators.process.ProcessState` step by step:

- :meth:`~StepByStep.final_step` runs an execution to its end and returns the final
  state; :meth:`~StepByStep.iterator` yields the state after each step, then the
  final one;
- :meth:`~StepByStep.perform_step` begins a step, lets the orchestrator choose who acts
  (:meth:`~StepByStep.prepare_step`) and make the step
  (:meth:`~StepByStep.make_next_step`), runs the state processors on the transition
  state, judges it with the continuation criteria and records a
  :class:`~agent_core.orchestrators.process.StepRecord` (step + outcome);
- :meth:`~StepByStep.can_continue` asks the criteria before the execution's first
  step (the outcome is recorded in the state and, when it stops the run, emitted as
  step 0), then reads the last step result; a failed execution never continues;
- an exception during a step becomes a failure step
  (:meth:`~StepByStep.failure_step`) recorded with its outcome. If the criteria judge
  no errors, the base's error policy does, so an error never ends a run as completed.

The status rule (the same as the agent's): a run is ``failed`` exactly when it stops
with stop reason ``error``, and an error the policy does not tolerate wins over any
limit that forbade in the same evaluation (see
:meth:`~agent_core.continuation.ContinuationOutcome.deciding_forbid`).

State processors are middleware over the transition state (``process(state, next)``):
the defaults, :class:`AppendStepMessages` and :class:`AccumulateUsage`, put the step's
messages into the conversation and its tokens into the usage.

Only :meth:`iterator` and the step's own I/O await; events are recorded, then
delivered at each stage (see :mod:`agent_core.orchestrators.orchestration_events`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from agent_core._time import Clock, utc_now
from agent_core.continuation import ContinuationCriteria, ContinuationOutcome, StopReason
from agent_core.criteria import ErrorPresenceCheck
from agent_core.drivers.base import ModelDriver, ModelRequest, ModelResponse, ResponseCompleted
from agent_core.drivers.base import TextDelta as _TextDelta
from agent_core.error_policy import ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import AgentError, ModelError
from agent_core.events import (
    AgentEvent,
    EventDispatcher,
    Listener,
    StreamChunk,
    ToolCallCompleted,
    ToolCallStarted,
)
from agent_core.messages import ToolCall
from agent_core.orchestrators.orchestration_events import (
    ProcessCompleted,
    ProcessContinuationEvaluated,
    ProcessStarted,
    ProcessStateUpdated,
    ProcessStepCompleted,
    ProcessStepFailed,
    ProcessStepStarted,
)
from agent_core.orchestrators.process import ProcessState, ProcessStep, StepRecord
from agent_core.state import AgentStatus
from agent_core.steps import ToolExecution
from agent_core.tools import ToolRegistry

__all__ = [
    "FAILING_STOP_REASONS",
    "AccumulateUsage",
    "AppendStepMessages",
    "ProcessorLike",
    "StateProcessor",
    "StepByStep",
    "StepContext",
    "default_processors",
    "infer",
    "run_processors",
    "run_tool_calls",
    "step_tool_calls",
]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound="ProcessState[Any]")
StateT = TypeVar("StateT", bound="ProcessState[Any]")
StepT = TypeVar("StepT", bound=ProcessStep)

FAILING_STOP_REASONS = frozenset({StopReason.ERROR})
"""Stopping for one of these ends the execution as ``failed`` (only ``error``: a
``retry_limit`` stop whose errors the policy tolerated ends ``completed``; one whose
policy ran out of retries stops for ``error``, which wins)."""


# --- state processors (middleware) ---------------------------------------------------


class StateProcessor(Protocol[S]):
    """Middleware over the transition state: change it before and/or after
    ``next_`` (which runs the remaining processors)."""

    def process(self, state: S, next_: Callable[[S], S]) -> S: ...


ProcessorLike = StateProcessor[S] | Callable[[S, Callable[[S], S]], S]


class AppendStepMessages:
    """Appends the pending step's messages to the conversation."""

    def process(self, state: S, next_: Callable[[S], S]) -> S:
        step = state.pending_step()
        if step is not None and step.messages:
            state = state.with_messages((*state.messages, *step.messages))
        return next_(state)


class AccumulateUsage:
    """Adds the pending step's token usage to the state's usage."""

    def process(self, state: S, next_: Callable[[S], S]) -> S:
        step = state.pending_step()
        if step is not None:
            state = state.with_usage(state.usage + step.usage)
        return next_(state)


def default_processors() -> tuple[AppendStepMessages, AccumulateUsage]:
    """The processors every orchestrator uses unless told otherwise."""
    return AppendStepMessages(), AccumulateUsage()


def run_processors(processors: Sequence[ProcessorLike[S]], state: S) -> S:
    """Thread ``state`` through ``processors`` as a middleware chain."""

    def call(index: int, current: S) -> S:
        if index == len(processors):
            return current
        processor = processors[index]
        after: Callable[[S], S] = lambda s: call(index + 1, s)  # noqa: E731
        if hasattr(processor, "process"):
            return processor.process(current, after)
        return processor(current, after)

    return call(0, state)


# --- what a step sees ----------------------------------------------------------------


@dataclass(frozen=True)
class StepContext:
    """A step's link to the event stream: who emits, which run, which step.

    Steps (and participants, collaborators, capabilities) report streamed text and
    tool calls through it, so they reach the same listeners as the process's events.
    """

    process: str
    process_id: str
    execution_id: str | None
    step_number: int
    events: EventDispatcher
    clock: Clock

    def meta(self) -> dict[str, Any]:
        """The fields every agent event carries, plus the step number."""
        return {
            "agent_id": self.process_id,
            "execution_id": self.execution_id,
            "occurred_at": self.clock(),
            "step_number": self.step_number,
        }

    async def emit(self, event: AgentEvent) -> None:
        """Record and deliver ``event`` now."""
        self.events.emit(event)
        await self.events.flush()

    async def text(self, delta: str, index: int, complete: bool) -> None:
        await self.emit(
            StreamChunk(**self.meta(), text_delta=delta, chunk_index=index, is_complete=complete)
        )

    async def tool_started(self, call: ToolCall) -> None:
        await self.emit(
            ToolCallStarted(
                **self.meta(), tool_call_id=call.id, tool_name=call.name, args=call.arguments
            )
        )

    async def tool_completed(self, call: ToolCall, execution: ToolExecution) -> None:
        error = None if execution.error is None else execution.error.message
        await self.tool_result(
            call, execution.success, error, execution.duration_ms, execution.output
        )

    async def tool_result(
        self, call: ToolCall, success: bool, error: str | None, duration_ms: float, result: str
    ) -> None:
        """Report how a tool-like call ended."""
        await self.emit(
            ToolCallCompleted(
                **self.meta(),
                tool_call_id=call.id,
                tool_name=call.name,
                args=call.arguments,
                success=success,
                error=error,
                duration_ms=duration_ms,
                result=result,
            )
        )


async def infer(driver: ModelDriver, request: ModelRequest, context: StepContext) -> ModelResponse:
    """Stream one model response, reporting its text through ``context``.

    Raises:
        agent_core.errors.ModelError: the driver failed or ended without a response.
    """
    index = 0
    async for event in driver.stream(request):
        if isinstance(event, _TextDelta):
            await context.text(event.text, index, False)
            index += 1
        elif isinstance(event, ResponseCompleted):
            if index:
                await context.text("", index, True)
            return event.response
    raise ModelError("the model driver's stream ended without a ResponseCompleted event")


async def run_tool_calls(
    tools: ToolRegistry, calls: Iterable[ToolCall], context: StepContext
) -> list[ToolExecution]:
    """Run ``calls`` in order with validation; failures are recorded on the
    executions, never raised."""
    executions = []
    for call in calls:
        await context.tool_started(call)
        execution = await tools.execute(call, context.clock)
        await context.tool_completed(call, execution)
        executions.append(execution)
    return executions


# --- the base ------------------------------------------------------------------------


class StepByStep(ABC, Generic[StateT, StepT]):
    """Runs a process state step by step (see the module docstring).

    Args:
        criteria: the continuation criteria.
        processors: state middleware (default :func:`default_processors`).
        error_policy: judges errors when the criteria judge none
            (default: stop on any error).
        events: the dispatcher (a new one by default).
        clock: the time source.
    """

    process: ClassVar[str] = "process"

    def __init__(
        self,
        criteria: ContinuationCriteria[StateT],
        *,
        processors: Iterable[ProcessorLike[StateT]] | None = None,
        error_policy: ErrorPolicy | None = None,
        events: EventDispatcher | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.criteria = criteria
        self.processors: tuple[ProcessorLike[StateT], ...] = (
            default_processors() if processors is None else tuple(processors)
        )
        self.events = events or EventDispatcher()
        self.clock = clock
        self._policy = ErrorPolicyCriterion(error_policy)
        self._judges_errors = criteria.contains(ErrorPolicyCriterion) or criteria.contains(
            ErrorPresenceCheck
        )

    # -- what each orchestrator provides -------------------------------------------------

    @abstractmethod
    async def make_next_step(self, state: StateT, context: StepContext) -> StepT:
        """Make the step of ``state.current`` (raising is recorded as a failure)."""

    @abstractmethod
    def failure_step(self, state: StateT, error: AgentError) -> StepT:
        """The step recording ``error`` raised during ``state``'s current step."""

    async def prepare_step(self, state: StateT, context: StepContext) -> StateT:
        """Choose who acts in the step just begun (``state.with_actor``); the base
        chooses nobody."""
        return state

    async def before_finish(self, state: StateT) -> StateT:
        """Last changes before the execution ends (e.g. session memory). If it
        raises, the error is logged and the execution ends all the same."""
        return state

    def actors(self) -> tuple[str, ...]:
        """Who may act (reported when an execution starts)."""
        return ()

    def available_tools(self, state: StateT) -> tuple[str, ...]:
        """Tools reported when a step starts."""
        return ()

    # -- listening -----------------------------------------------------------------------

    def listen(self, listener: Listener) -> None:
        """Receive every event (sync or async listener)."""
        self.events.listen(listener)

    # -- running -------------------------------------------------------------------------

    async def final_step(self, state: StateT, *, execution_id: str | None = None) -> StateT:
        """Run one execution to its end and return the final state. Errors end up
        recorded in the state, not raised."""
        final = state
        async for final in self.iterator(state, execution_id=execution_id):  # noqa: B007
            pass
        return final

    async def iterator(
        self, state: StateT, *, execution_id: str | None = None
    ) -> AsyncIterator[StateT]:
        """Run one execution, yielding the state after each step and the final state."""
        state = self._judge_start(self._start(state, execution_id))
        await self.events.flush()
        while self.can_continue(state):
            state = await self.perform_step(state)
            yield state
        state = await self._finish(state)
        await self.events.flush()
        yield state

    def can_continue(self, state: StateT) -> bool:
        """Before the execution's first step the criteria decide; after it, the last
        step result. A failed execution never continues."""
        if state.status is AgentStatus.FAILED:
            return False
        if state.start_outcome is not None:
            return state.start_outcome.should_continue
        results = state.execution_results()
        if not results:
            return self.criteria.evaluate_all(state).should_continue
        return results[-1].should_continue()

    async def perform_step(self, state: StateT) -> StateT:
        """Take one step and record its result (a raised error becomes a failure
        step)."""
        state = state.begin_step(self.clock())
        context = self._context(state)
        started = False
        try:
            state = await self.prepare_step(state, context)
            started = await self._step_started(state, context)
            step = await self.make_next_step(state, context)
        except Exception as exc:
            error = AgentError.from_exception(exc)
            logger.info("%s step failed: %s", self.process, error.message)
            if not started:
                await self._step_started(state, context)
            return await self._record(state, self.failure_step(state, error), error)
        return await self._record(state, step, None)

    # -- internals -----------------------------------------------------------------------

    def _meta(self, state: StateT) -> dict[str, Any]:
        return {
            "agent_id": state.id,
            "execution_id": state.execution_id(),
            "occurred_at": self.clock(),
            "process": self.process,
        }

    def _context(self, state: StateT) -> StepContext:
        current = state.current
        number = 0 if current is None else current.step_number
        return StepContext(
            self.process, state.id, state.execution_id(), number, self.events, self.clock
        )

    def _start(self, state: StateT, execution_id: str | None) -> StateT:
        now = self.clock()
        state = state.start_execution(now, execution_id)
        self.criteria.execution_started(now)
        self.events.emit(
            ProcessStarted(
                **self._meta(state), message_count=len(state.messages), actors=self.actors()
            )
        )
        return state

    async def _step_started(self, state: StateT, context: StepContext) -> bool:
        await context.emit(
            ProcessStepStarted(
                **self._meta(state),
                step_number=context.step_number,
                actor=state.current_actor(),
                message_count=len(state.messages),
                available_tools=self.available_tools(state),
            )
        )
        return True

    def _judge(self, transition: StateT, step: StepT) -> ContinuationOutcome:
        outcome = self.criteria.evaluate_all(transition)
        if step.errors and not self._judges_errors:
            outcome = outcome.with_evaluation(self._policy.evaluate(transition))
        return outcome

    async def _record(self, state: StateT, step: StepT, error: AgentError | None) -> StateT:
        transition = run_processors(self.processors, state.with_pending_step(step))
        outcome = self._judge(transition, step)
        current = transition.current
        assert current is not None, "a step is in progress"
        result = StepRecord(
            step=step,
            outcome=outcome,
            step_number=current.step_number,
            started_at=current.started_at,
            completed_at=self.clock(),
            execution_id=transition.execution_id(),
            actor=current.actor,
        )
        failed = not outcome.should_continue and outcome.stop_reason in FAILING_STOP_REASONS
        status = AgentStatus.FAILED if failed else transition.status
        recorded = transition.with_status(status).record_result(result)
        self._emit_recorded(recorded, result, error)
        await self.events.flush()
        return recorded

    def _emit_recorded(
        self, state: StateT, result: StepRecord[StepT], error: AgentError | None
    ) -> None:
        meta, step = self._meta(state), result.step
        self.events.emit(
            ProcessContinuationEvaluated(
                **meta, step_number=result.step_number, outcome=result.outcome
            )
        )
        self.events.emit(ProcessStateUpdated(**meta, state=state))
        fields: dict[str, Any] = {
            **meta,
            "step_number": result.step_number,
            "step_id": step.id,
            "actor": result.actor,
            "content": step.content,
            "tool_calls": step_tool_calls(step),
            "errors": len(step.errors),
            "error_messages": tuple(e.message for e in step.errors),
            "finish_reason": step.finish_reason,
            "usage": step.usage,
            "duration_ms": result.duration_ms,
            "outcome": result.outcome,
        }
        if error is None:
            self.events.emit(ProcessStepCompleted(**fields))
        else:
            self.events.emit(
                ProcessStepFailed(
                    **fields, error_type=error.error_type, error_message=error.message
                )
            )

    def _judge_start(self, state: StateT) -> StateT:
        """Ask the criteria before the first step; a stop there is recorded, emitted
        as step 0 and, when an error decided it, fails the run."""
        outcome = self.criteria.evaluate_all(state)
        state = state.with_start_outcome(outcome)
        if outcome.should_continue:
            return state
        self.events.emit(
            ProcessContinuationEvaluated(**self._meta(state), step_number=0, outcome=outcome)
        )
        if outcome.stop_reason in FAILING_STOP_REASONS:
            return state.with_status(AgentStatus.FAILED)
        return state

    def _stop_reason(self, state: StateT) -> StopReason:
        if state.status is AgentStatus.FAILED:
            return StopReason.ERROR
        outcome = state.continuation_outcome()
        return StopReason.GUARD if outcome is None else outcome.stop_reason

    async def _finish(self, state: StateT) -> StateT:
        stop = self._stop_reason(state)
        failed = state.status is AgentStatus.FAILED or stop in FAILING_STOP_REASONS
        if failed:
            stop = StopReason.ERROR
        try:
            state = await self.before_finish(state)
        except Exception:
            # The run's result is already decided; losing a side effect (e.g. session
            # memory) must not lose the result.
            logger.exception("%s: before_finish failed; the run ends regardless", self.process)
        status = AgentStatus.FAILED if failed else AgentStatus.COMPLETED
        state = state.end_execution(self.clock(), status, stop)
        self.events.emit(
            ProcessCompleted(
                **self._meta(state),
                status=status,
                stop_reason=stop,
                step_count=len(state.execution_results()),
                usage=state.usage,
                final_response=state.final_response(),
                error_message=state.error_message(),
            )
        )
        return state


def step_tool_calls(step: ProcessStep) -> tuple[ToolCall, ...]:
    calls = getattr(step, "tool_calls", None)
    if isinstance(calls, tuple):
        return tuple(c for c in calls if isinstance(c, ToolCall))
    executions = getattr(step, "tool_executions", ())
    return tuple(e.tool_call for e in executions if isinstance(e, ToolExecution))
