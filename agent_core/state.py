"""The agent's immutable state.

:class:`AgentState` holds the conversation, usage, status, execution timing and the
recorded step results; :class:`CurrentExecution` holds the transient data of the step
in progress (pending step, pending tool call and execution, error, stop reason and the
hooks' :class:`ExecutionDecision`). Every ``with_*``/``record_*`` method returns a new
state; nothing is modified in place, and the state's data (metadata, message metadata,
tool-call arguments, evaluation contexts) is read-only all the way down.

Transient data is transient: the current execution is cleared when a run ends and is
never serialized. Step numbers count over all runs of a state (a resumed conversation's
first step continues the numbering), while limits count the current run's steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from agent_core._frozen import freeze_mapping, thaw
from agent_core._ids import new_id
from agent_core._time import elapsed_seconds, from_iso, to_iso
from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.errors import AgentError
from agent_core.messages import Message, Role, ToolCall, Usage
from agent_core.steps import AgentStep, ExecutionSteps, StepError, StepExecution, ToolExecution

__all__ = [
    "AgentState",
    "AgentStatus",
    "CurrentExecution",
    "ExecutionDecision",
    "ExecutionState",
]


class AgentStatus(StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class ExecutionDecision(StrEnum):
    """What hooks decided at the current lifecycle point."""

    PROCEED = "proceed"
    """Go on (before a stop: the stop is prevented)."""
    BLOCK = "block"
    """Do not run the pending tool call."""
    STOP = "stop"
    """The loop is about to stop (see ``CurrentExecution.stop_reason``)."""


def _opt_iso(moment: datetime | None) -> str | None:
    return None if moment is None else to_iso(moment)


def _opt_from_iso(text: str | None) -> datetime | None:
    return None if text is None else from_iso(text)


@dataclass(frozen=True, slots=True)
class ExecutionState:
    """Timing across runs: a paused agent (between runs) accrues no time.

    Attributes:
        execution_id: id of the current (or last) run.
        started_at: when the first run started.
        updated_at: last time anything was recorded.
        run_started_at: when the current run started; ``None`` between runs.
        cumulative_seconds: summed duration of finished runs.
        run_count: how many runs started.
    """

    execution_id: str | None = None
    started_at: datetime | None = None
    updated_at: datetime | None = None
    run_started_at: datetime | None = None
    cumulative_seconds: float = 0.0
    run_count: int = 0

    @property
    def is_running(self) -> bool:
        return self.run_started_at is not None

    def start(self, now: datetime, execution_id: str) -> ExecutionState:
        """A new run begins at ``now``."""
        return replace(
            self,
            execution_id=execution_id,
            started_at=self.started_at or now,
            updated_at=now,
            run_started_at=now,
            run_count=self.run_count + 1,
        )

    def end(self, now: datetime) -> ExecutionState:
        """The current run ends at ``now``; its duration joins the cumulative time."""
        return replace(
            self,
            updated_at=now,
            run_started_at=None,
            cumulative_seconds=self.cumulative_seconds_at(now),
        )

    def touch(self, now: datetime) -> ExecutionState:
        return replace(self, updated_at=now)

    def cumulative_seconds_at(self, now: datetime) -> float:
        """Time over all runs as of ``now`` (the current run counts up to ``now``)."""
        running = 0.0 if self.run_started_at is None else elapsed_seconds(self.run_started_at, now)
        return self.cumulative_seconds + running

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "started_at": _opt_iso(self.started_at),
            "updated_at": _opt_iso(self.updated_at),
            "run_started_at": _opt_iso(self.run_started_at),
            "cumulative_seconds": self.cumulative_seconds,
            "run_count": self.run_count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecutionState:
        return cls(
            execution_id=data.get("execution_id"),
            started_at=_opt_from_iso(data.get("started_at")),
            updated_at=_opt_from_iso(data.get("updated_at")),
            run_started_at=_opt_from_iso(data.get("run_started_at")),
            cumulative_seconds=float(data.get("cumulative_seconds", 0.0)),
            run_count=int(data.get("run_count", 0)),
        )


@dataclass(frozen=True, slots=True)
class CurrentExecution:
    """Transient data of the step in progress (or of the stop being decided).

    ``error`` is an exception and does not take part in equality; it serializes as its
    type and message.
    """

    step_number: int
    started_at: datetime
    id: str
    pending_step: AgentStep | None = None
    pending_tool_call: ToolCall | None = None
    pending_execution: ToolExecution | None = None
    error: AgentError | None = field(default=None, compare=False)
    stop_reason: StopReason | None = None
    decision: ExecutionDecision | None = None
    decision_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        call, execution, step = self.pending_tool_call, self.pending_execution, self.pending_step
        return {
            "step_number": self.step_number,
            "started_at": to_iso(self.started_at),
            "id": self.id,
            "pending_step": None if step is None else step.to_dict(),
            "pending_tool_call": None if call is None else call.model_dump(mode="json"),
            "pending_execution": None if execution is None else execution.to_dict(),
            "error": None if self.error is None else StepError.from_error(self.error).to_dict(),
            "stop_reason": None if self.stop_reason is None else self.stop_reason.value,
            "decision": None if self.decision is None else self.decision.value,
            "decision_reason": self.decision_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CurrentExecution:
        step, call = data.get("pending_step"), data.get("pending_tool_call")
        execution, error = data.get("pending_execution"), data.get("error")
        stop_reason, decision = data.get("stop_reason"), data.get("decision")
        return cls(
            step_number=int(data["step_number"]),
            started_at=from_iso(data["started_at"]),
            id=str(data["id"]),
            pending_step=None if step is None else AgentStep.from_dict(step),
            pending_tool_call=None if call is None else ToolCall.model_validate(call),
            pending_execution=None if execution is None else ToolExecution.from_dict(execution),
            error=None if error is None else StepError.from_dict(error).to_error(),
            stop_reason=None if stop_reason is None else StopReason(stop_reason),
            decision=None if decision is None else ExecutionDecision(decision),
            decision_reason=data.get("decision_reason"),
        )


@dataclass(frozen=True, slots=True)
class AgentState(ExecutionSteps[AgentStep]):
    """Everything an agent knows; immutable.

    Attributes:
        agent_id: this agent's id.
        parent_agent_id: the agent that spawned this one, if any.
        messages: the conversation.
        metadata: application data (read-only mapping).
        usage: tokens used over the agent's whole life.
        status: pending, in progress, completed or failed.
        execution: timing across runs.
        step_executions: recorded step results, oldest first.
        current_execution: transient data of the step in progress (``None`` between
            runs; never serialized).
        start_outcome: the outcome judged before the current run's first step, until
            a step result is recorded (so a run stopped before step 1 shows why).
        stopped_by: why the last run stopped (set when it ends).
        steps_not_kept: steps of earlier runs whose results this state does not hold
            (a state restored from a slim snapshot); step numbers continue after them.
    """

    agent_id: str = field(default_factory=new_id)
    parent_agent_id: str | None = None
    messages: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    status: AgentStatus = AgentStatus.PENDING
    execution: ExecutionState = field(default_factory=ExecutionState)
    step_executions: tuple[StepExecution, ...] = ()
    current_execution: CurrentExecution | None = None
    start_outcome: ContinuationOutcome | None = None
    stopped_by: StopReason | None = None
    steps_not_kept: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, MappingProxyType):
            frozen = MappingProxyType(freeze_mapping(self.metadata))
            object.__setattr__(self, "metadata", frozen)
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))

    # conversation and metadata ------------------------------------------------------

    def with_message(self, message: Message) -> AgentState:
        return replace(self, messages=(*self.messages, message))

    def with_user_message(self, content: str) -> AgentState:
        return self.with_message(Message.user(content))

    def with_messages(self, messages: tuple[Message, ...]) -> AgentState:
        return replace(self, messages=tuple(messages))

    def with_metadata(self, key: str, value: Any) -> AgentState:
        return replace(self, metadata={**self.metadata, key: value})

    def with_status(self, status: AgentStatus) -> AgentState:
        return replace(self, status=status)

    def final_response(self) -> str:
        """The text of the last assistant message ("" if there is none)."""
        for message in reversed(self.messages):
            if message.role is Role.ASSISTANT:
                return message.content
        return ""

    # execution -------------------------------------------------------------------------

    def start_execution(self, now: datetime, execution_id: str | None = None) -> AgentState:
        """A run begins: in progress, timing started, transient data reset."""
        execution = self.execution.start(now, execution_id or new_id())
        current = CurrentExecution(step_number=self.step_count() + 1, started_at=now, id=new_id())
        return replace(
            self,
            status=AgentStatus.IN_PROGRESS,
            execution=execution,
            current_execution=current,
            start_outcome=None,
            stopped_by=None,
        )

    def end_execution(
        self, now: datetime, status: AgentStatus, stop_reason: StopReason | None = None
    ) -> AgentState:
        """The run ends with ``status`` (because of ``stop_reason``, default: the one
        decided so far); its time joins the cumulative total and its transient data is
        cleared."""
        return replace(
            self,
            status=status,
            execution=self.execution.end(now),
            current_execution=None,
            stopped_by=stop_reason or self.stop_reason(),
        )

    def execution_id(self) -> str | None:
        return self.execution.execution_id

    def cumulative_execution_seconds(self, now: datetime) -> float:
        return self.execution.cumulative_seconds_at(now)

    def begin_step(self, now: datetime, step_id: str | None = None) -> AgentState:
        """Fresh transient data for the next step of this execution (numbered after
        every step recorded so far, over all runs)."""
        number = self.step_count() + 1
        current = CurrentExecution(step_number=number, started_at=now, id=step_id or new_id())
        return replace(self, current_execution=current)

    def _current(self) -> CurrentExecution:
        if self.current_execution is None:
            raise RuntimeError(
                "no execution in progress: call start_execution() or begin_step() first"
            )
        return self.current_execution

    def with_current_execution(self, **changes: Any) -> AgentState:
        """Change fields of the current execution.

        Raises:
            RuntimeError: no execution is in progress.
        """
        return replace(self, current_execution=replace(self._current(), **changes))

    # transient step data (seeds 001/003) ------------------------------------------

    def with_pending_step(self, step: AgentStep) -> AgentState:
        return self.with_current_execution(pending_step=step)

    def pending_step(self) -> AgentStep | None:
        return None if self.current_execution is None else self.current_execution.pending_step

    def with_pending_tool_call(self, tool_call: ToolCall) -> AgentState:
        """Set the tool call about to run (clearing any earlier decision)."""
        return self.with_current_execution(
            pending_tool_call=tool_call, pending_execution=None, decision=None, decision_reason=None
        )

    def pending_tool_call(self) -> ToolCall | None:
        return None if self.current_execution is None else self.current_execution.pending_tool_call

    def with_tool_call_blocked(self, reason: str) -> AgentState:
        """Hooks: do not run the pending tool call."""
        return self.with_current_execution(decision=ExecutionDecision.BLOCK, decision_reason=reason)

    def is_tool_call_blocked(self) -> bool:
        return self.decision() is ExecutionDecision.BLOCK

    def with_pending_execution(self, execution: ToolExecution) -> AgentState:
        return self.with_current_execution(pending_execution=execution)

    def pending_execution(self) -> ToolExecution | None:
        return None if self.current_execution is None else self.current_execution.pending_execution

    def with_error(self, error: AgentError) -> AgentState:
        return self.with_current_execution(error=error)

    def current_error(self) -> AgentError | None:
        return None if self.current_execution is None else self.current_execution.error

    def with_stop_requested(self, reason: StopReason) -> AgentState:
        """The loop is about to stop for ``reason`` (hooks may still prevent it)."""
        return self.with_current_execution(
            stop_reason=reason, decision=ExecutionDecision.STOP, decision_reason=None
        )

    def with_stop_prevented(self, reason: str) -> AgentState:
        """Hooks: take another step instead of stopping (ignored for a failed run)."""
        return self.with_current_execution(
            decision=ExecutionDecision.PROCEED, decision_reason=reason
        )

    def is_stop_prevented(self) -> bool:
        return self.decision() is ExecutionDecision.PROCEED

    def decision(self) -> ExecutionDecision | None:
        return None if self.current_execution is None else self.current_execution.decision

    def decision_reason(self) -> str | None:
        return None if self.current_execution is None else self.current_execution.decision_reason

    # recording -----------------------------------------------------------------------

    def record_step(self, step: AgentStep) -> AgentState:
        """The transition state: the step's messages and usage applied, the step pending
        (counted by :meth:`execution_step_count`) until its result is recorded."""
        return replace(
            self,
            messages=(*self.messages, *step.messages),
            usage=self.usage + step.usage,
            current_execution=replace(self._current(), pending_step=step),
        )

    def record_step_execution(self, result: StepExecution) -> AgentState:
        """Store a step result (and clear the pending step)."""
        current = self.current_execution
        return replace(
            self,
            step_executions=(*self.step_executions, result),
            execution=self.execution.touch(result.completed_at),
            current_execution=None if current is None else replace(current, pending_step=None),
            start_outcome=None,
        )

    def with_start_outcome(self, outcome: ContinuationOutcome) -> AgentState:
        """Record the outcome judged before the run's first step."""
        return replace(self, start_outcome=outcome)

    # reading results -----------------------------------------------------------------

    def step_results(self) -> tuple[StepExecution, ...]:
        return self.step_executions

    def last_step_result(self) -> StepExecution | None:
        return self.step_executions[-1] if self.step_executions else None

    def steps(self) -> tuple[AgentStep, ...]:
        return tuple(result.step for result in self.step_executions)

    def step_count(self) -> int:
        """Steps over all runs (including those whose results are not kept)."""
        return self.steps_not_kept + len(self.step_executions)

    def continuation_outcome(self) -> ContinuationOutcome | None:
        """The latest continuation decision: the one before the run's first step
        while no step was recorded since, else the one after the last recorded step."""
        if self.start_outcome is not None:
            return self.start_outcome
        last = self.last_step_result()
        return None if last is None else last.outcome

    def stop_reason(self) -> StopReason | None:
        """Why the run stops or stopped: the reason the loop decided on, else the one
        the ended run recorded, else the latest outcome's (``None`` while it says
        continue)."""
        current = self.current_execution
        if current is not None and current.stop_reason is not None:
            return current.stop_reason
        if self.stopped_by is not None:
            return self.stopped_by
        outcome = self.continuation_outcome()
        return None if outcome is None or outcome.should_continue else outcome.stop_reason

    def error_message(self) -> str | None:
        """Why a failed run failed: the first error of its last step, else the reason
        of the forbid that stopped it (e.g. a criterion that raised); ``None`` unless
        the state is failed."""
        if self.status is not AgentStatus.FAILED:
            return None
        results = self._execution_results()
        if results and results[-1].step.errors:
            return results[-1].step.errors[0].message
        outcome = self.continuation_outcome()
        forbid = None if outcome is None else outcome.deciding_forbid()
        return None if forbid is None else forbid.reason

    # what criteria read (see agent_core.criteria) ---------------------------------

    def _execution_results(self) -> list[StepExecution]:
        run = self.execution.execution_id
        return [r for r in self.step_executions if r.execution_id == run]

    def _execution_steps(self) -> list[AgentStep]:
        steps = [r.step for r in self._execution_results()]
        pending = self.pending_step()
        return [*steps, pending] if pending is not None else steps

    # serialization -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The state as plain JSON data (see :meth:`from_dict`); the transient current
        execution is left out."""
        outcome, stopped = self.start_outcome, self.stopped_by
        return {
            "agent_id": self.agent_id,
            "parent_agent_id": self.parent_agent_id,
            "status": self.status.value,
            "messages": [m.model_dump(mode="json") for m in self.messages],
            "metadata": thaw(self.metadata),
            "usage": self.usage.model_dump(mode="json"),
            "execution": self.execution.to_dict(),
            "step_executions": [r.to_dict() for r in self.step_executions],
            "start_outcome": None if outcome is None else outcome.to_dict(),
            "stopped_by": None if stopped is None else stopped.value,
            "steps_not_kept": self.steps_not_kept,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentState:
        """Rebuild a state from :meth:`to_dict` output (a ``current_execution`` in
        older data is transient and ignored).

        Raises:
            KeyError: a required field is missing.
            ValueError: a field has a bad value (pydantic's ``ValidationError`` is one).
        """
        outcome, stopped = data.get("start_outcome"), data.get("stopped_by")
        return cls(
            agent_id=str(data["agent_id"]),
            parent_agent_id=data.get("parent_agent_id"),
            status=AgentStatus(data.get("status", AgentStatus.PENDING)),
            messages=tuple(Message.model_validate(m) for m in data.get("messages", ())),
            metadata=dict(data.get("metadata") or {}),
            usage=Usage.model_validate(data.get("usage") or {}),
            execution=ExecutionState.from_dict(data.get("execution") or {}),
            step_executions=tuple(
                StepExecution.from_dict(r) for r in data.get("step_executions", ())
            ),
            start_outcome=None if outcome is None else ContinuationOutcome.from_dict(outcome),
            stopped_by=None if stopped is None else StopReason(stopped),
            steps_not_kept=int(data.get("steps_not_kept", 0)),
        )
