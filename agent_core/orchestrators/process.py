"""The immutable state of a step-by-step process (tool use, chat, collaboration,
capability routing).

:class:`ProcessState` is generic over the step type. It holds the conversation,
usage, status, execution timing (an :class:`~agent_core.state.ExecutionState`, so
cumulative time survives pause and resume), the recorded :class:`StepRecord`\\ s (a
:class:`~agent_core.steps.StepResult` with number, timing and execution id) and the
transient :class:`CurrentStep`. It offers what the built-in criteria read
(:mod:`agent_core.criteria`), counted over the *current execution* like the agent's.

Transient data is transient: :class:`CurrentStep` is cleared when a run ends and is
never serialized; metadata and a step's selection details are read-only.

Each orchestrator subclasses it once, naming its step class (:meth:`decode_step`) and
its ``kind`` (checked when loading, so a chat cannot be loaded as a collaboration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from agent_core._frozen import FrozenDict, freeze_mapping, thaw
from agent_core._ids import new_id
from agent_core._time import elapsed_ms, from_iso, to_iso
from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.messages import FinishReason, Message, Role, Usage
from agent_core.state import AgentStatus, ExecutionState
from agent_core.steps import ExecutionSteps, StepError, StepResult

__all__ = [
    "CurrentStep",
    "ProcessState",
    "ProcessStep",
    "StepRecord",
]


class ProcessStep(Protocol):
    """What the step-by-step base and the built-in criteria need of a step."""

    @property
    def id(self) -> str: ...

    @property
    def content(self) -> str: ...

    @property
    def finish_reason(self) -> FinishReason | None: ...

    @property
    def errors(self) -> Sequence[StepError]: ...

    @property
    def usage(self) -> Usage: ...

    @property
    def messages(self) -> tuple[Message, ...]: ...

    def has_tool_calls(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


StepT = TypeVar("StepT", bound=ProcessStep)


@dataclass(frozen=True, slots=True)
class StepRecord(StepResult[StepT]):
    """A recorded step result: the step, its outcome, its number and timing, and the
    execution (run) it belongs to."""

    step_number: int
    started_at: datetime
    completed_at: datetime
    execution_id: str | None = None
    actor: str | None = None

    @property
    def duration_ms(self) -> float:
        return elapsed_ms(self.started_at, self.completed_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_number": self.step_number,
            "execution_id": self.execution_id,
            "actor": self.actor,
            "started_at": to_iso(self.started_at),
            "completed_at": to_iso(self.completed_at),
            "step": self.step.to_dict(),
            "outcome": self.outcome.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class CurrentStep(Generic[StepT]):
    """Transient data of the step in progress.

    Attributes:
        step_number: the step's number within the execution.
        started_at: when it began.
        id: the step's id.
        actor: who acts (participant, collaborator, capability), once selected.
        selection: how the actor was chosen (plain JSON data: reason, fallback, ...).
        pending_step: the finished step while it is being judged.
    """

    step_number: int
    started_at: datetime
    id: str
    actor: str | None = None
    selection: Mapping[str, Any] = field(default_factory=FrozenDict)
    pending_step: StepT | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "selection", freeze_mapping(self.selection))

    def to_dict(self) -> dict[str, Any]:
        step = self.pending_step
        return {
            "step_number": self.step_number,
            "started_at": to_iso(self.started_at),
            "id": self.id,
            "actor": self.actor,
            "selection": thaw(self.selection),
            "pending_step": None if step is None else step.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class ProcessState(ExecutionSteps[StepT]):
    """Everything a step-by-step process knows; immutable.

    Attributes:
        id: the process's id.
        messages: the conversation.
        metadata: application data (read-only mapping).
        usage: tokens used over the process's whole life.
        status: pending, in progress, completed or failed.
        execution: timing across runs.
        results: recorded step results, oldest first.
        current: transient data of the step in progress (never serialized).
        stopped_by: why the last execution stopped (set when it ends).
        start_outcome: the outcome judged before the execution's first step, until a
            step result is recorded (so a run stopped before step 1 shows why).
        steps_not_kept: steps of earlier runs whose results this state does not hold
            (restored from a slim snapshot); step numbers continue after them.
    """

    kind: ClassVar[str] = "process"

    id: str = field(default_factory=new_id)
    messages: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    status: AgentStatus = AgentStatus.PENDING
    execution: ExecutionState = field(default_factory=ExecutionState)
    results: tuple[StepRecord[StepT], ...] = ()
    current: CurrentStep[StepT] | None = None
    stopped_by: StopReason | None = None
    start_outcome: ContinuationOutcome | None = None
    steps_not_kept: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, MappingProxyType):
            frozen = MappingProxyType(freeze_mapping(self.metadata))
            object.__setattr__(self, "metadata", frozen)
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> StepT:
        """Rebuild one step from its ``to_dict`` output (each subclass names its step)."""
        raise NotImplementedError(f"{cls.__name__} must say how to load its steps")

    # conversation and metadata ------------------------------------------------------

    def with_message(self, message: Message) -> Self:
        return replace(self, messages=(*self.messages, message))

    def with_user_message(self, content: str) -> Self:
        return self.with_message(Message.user(content))

    def with_messages(self, messages: Sequence[Message]) -> Self:
        return replace(self, messages=tuple(messages))

    def with_metadata(self, key: str, value: Any) -> Self:
        return replace(self, metadata={**self.metadata, key: value})

    def with_status(self, status: AgentStatus) -> Self:
        return replace(self, status=status)

    def with_usage(self, usage: Usage) -> Self:
        return replace(self, usage=usage)

    def final_response(self) -> str:
        """The text of the last assistant message ("" if there is none)."""
        for message in reversed(self.messages):
            if message.role is Role.ASSISTANT:
                return message.content
        return ""

    # execution -------------------------------------------------------------------------

    def start_execution(self, now: datetime, execution_id: str | None = None) -> Self:
        """A run begins: in progress, timing started, transient data reset."""
        return replace(
            self,
            status=AgentStatus.IN_PROGRESS,
            execution=self.execution.start(now, execution_id or new_id()),
            current=None,
            stopped_by=None,
            start_outcome=None,
        )

    def end_execution(self, now: datetime, status: AgentStatus, stop_reason: StopReason) -> Self:
        """The run ends with ``status`` because of ``stop_reason``."""
        return replace(
            self,
            status=status,
            execution=self.execution.end(now),
            current=None,
            stopped_by=stop_reason,
        )

    def execution_id(self) -> str | None:
        return self.execution.execution_id

    def cumulative_execution_seconds(self, now: datetime) -> float:
        return self.execution.cumulative_seconds_at(now)

    def begin_step(self, now: datetime, step_id: str | None = None) -> Self:
        """Fresh transient data for the next step of this execution (numbered after
        every step recorded so far, over all runs, like the agent's)."""
        number = self.step_count() + 1
        return replace(self, current=CurrentStep(number, now, step_id or new_id()))

    def _current(self) -> CurrentStep[StepT]:
        if self.current is None:
            raise RuntimeError("no step in progress: call begin_step() first")
        return self.current

    def with_actor(self, actor: str, selection: Mapping[str, Any] | None = None) -> Self:
        """Name who acts in the current step (and how they were chosen).

        Raises:
            RuntimeError: no step is in progress.
        """
        current = replace(self._current(), actor=actor, selection=dict(selection or {}))
        return replace(self, current=current)

    def current_actor(self) -> str | None:
        return None if self.current is None else self.current.actor

    def with_pending_step(self, step: StepT) -> Self:
        """The transition state: ``step`` pending (counted and judged by criteria)."""
        return replace(self, current=replace(self._current(), pending_step=step))

    def pending_step(self) -> StepT | None:
        return None if self.current is None else self.current.pending_step

    def record_result(self, result: StepRecord[StepT]) -> Self:
        """Store a step result (and clear the pending step)."""
        current = self.current
        return replace(
            self,
            results=(*self.results, result),
            execution=self.execution.touch(result.completed_at),
            current=None if current is None else replace(current, pending_step=None),
            start_outcome=None,
        )

    def with_start_outcome(self, outcome: ContinuationOutcome) -> Self:
        """Record the outcome judged before the execution's first step."""
        return replace(self, start_outcome=outcome)

    # reading results -----------------------------------------------------------------

    def step_results(self) -> tuple[StepRecord[StepT], ...]:
        return self.results

    def last_step_result(self) -> StepRecord[StepT] | None:
        return self.results[-1] if self.results else None

    def steps(self) -> tuple[StepT, ...]:
        return tuple(result.step for result in self.results)

    def step_count(self) -> int:
        """Steps over all runs (including those whose results are not kept)."""
        return self.steps_not_kept + len(self.results)

    def continuation_outcome(self) -> ContinuationOutcome | None:
        """The latest continuation decision: the one before the execution's first
        step while no step was recorded since, else the one after the last step."""
        if self.start_outcome is not None:
            return self.start_outcome
        last = self.last_step_result()
        return None if last is None else last.outcome

    def stop_reason(self) -> StopReason | None:
        """Why the last execution stopped; while running, the latest outcome's
        reason (``None`` while it says continue)."""
        if self.stopped_by is not None:
            return self.stopped_by
        outcome = self.continuation_outcome()
        return None if outcome is None or outcome.should_continue else outcome.stop_reason

    def error_message(self) -> str | None:
        """Why a failed execution failed: the first error of its last step, else the
        reason of the forbid that stopped it; ``None`` unless the state is failed."""
        if self.status is not AgentStatus.FAILED:
            return None
        results = self.execution_results()
        if results and results[-1].step.errors:
            return str(results[-1].step.errors[0].message)
        outcome = self.continuation_outcome()
        forbid = None if outcome is None else outcome.deciding_forbid()
        return None if forbid is None else forbid.reason

    # what criteria read (see agent_core.criteria) ---------------------------------

    def execution_results(self) -> tuple[StepRecord[StepT], ...]:
        """Step results of the current (or last) execution."""
        run = self.execution.execution_id
        return tuple(r for r in self.results if r.execution_id == run)

    def _execution_steps(self) -> list[StepT]:
        steps = [r.step for r in self.execution_results()]
        pending = self.pending_step()
        return [*steps, pending] if pending is not None else steps

    # serialization -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The state as plain JSON data (see :meth:`from_dict`); the transient current
        step is left out."""
        outcome = self.start_outcome
        return {
            "kind": self.kind,
            "id": self.id,
            "status": self.status.value,
            "messages": [m.model_dump(mode="json") for m in self.messages],
            "metadata": thaw(self.metadata),
            "usage": self.usage.model_dump(mode="json"),
            "execution": self.execution.to_dict(),
            "results": [r.to_dict() for r in self.results],
            "stopped_by": None if self.stopped_by is None else self.stopped_by.value,
            "start_outcome": None if outcome is None else outcome.to_dict(),
            "steps_not_kept": self.steps_not_kept,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a state from :meth:`to_dict` output.

        Raises:
            KeyError: a required field is missing.
            ValueError: a field has a bad value, or ``data`` is another kind of state.
        """
        kind = data.get("kind", cls.kind)
        if kind != cls.kind:
            raise ValueError(f"this is a serialized {kind} state, not a {cls.kind} state")
        return cls(**cls.fields_from_dict(data))

    @classmethod
    def fields_from_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments stored in ``data``. Subclasses with extra fields
        extend this (calling :meth:`base_fields_from_dict`, as slotted dataclasses
        cannot use ``super()``) and :meth:`to_dict`."""
        return cls.base_fields_from_dict(data)

    @classmethod
    def base_fields_from_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments of the fields every process state has (a
        ``current`` step in older data is transient and ignored)."""
        stopped, outcome = data.get("stopped_by"), data.get("start_outcome")
        return {
            "id": str(data["id"]),
            "status": AgentStatus(data.get("status", AgentStatus.PENDING)),
            "messages": tuple(Message.model_validate(m) for m in data.get("messages", ())),
            "metadata": dict(data.get("metadata") or {}),
            "usage": Usage.model_validate(data.get("usage") or {}),
            "execution": ExecutionState.from_dict(data.get("execution") or {}),
            "results": tuple(cls._decode_result(r) for r in data.get("results", ())),
            "stopped_by": None if stopped is None else StopReason(stopped),
            "start_outcome": None if outcome is None else ContinuationOutcome.from_dict(outcome),
            "steps_not_kept": int(data.get("steps_not_kept", 0)),
        }

    @classmethod
    def _decode_result(cls, data: Mapping[str, Any]) -> StepRecord[StepT]:
        return StepRecord(
            step=cls.decode_step(data["step"]),
            outcome=ContinuationOutcome.from_dict(data["outcome"]),
            step_number=int(data["step_number"]),
            started_at=from_iso(data["started_at"]),
            completed_at=from_iso(data["completed_at"]),
            execution_id=data.get("execution_id"),
            actor=data.get("actor"),
        )

    @classmethod
    def _decode_current(cls, data: Mapping[str, Any]) -> CurrentStep[StepT]:
        step = data.get("pending_step")
        return CurrentStep(
            step_number=int(data["step_number"]),
            started_at=from_iso(data["started_at"]),
            id=str(data["id"]),
            actor=data.get("actor"),
            selection=dict(data.get("selection") or {}),
            pending_step=None if step is None else cls.decode_step(step),
        )
