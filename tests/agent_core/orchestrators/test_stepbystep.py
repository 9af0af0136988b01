"""The generic step-by-step base: continuing, stopping, processors and failures."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from agent_core.continuation import (
    ContinuationCriteria,
    ContinuationDecision,
    StopReason,
)
from agent_core.criteria import StepsLimit, TokenUsageLimit
from agent_core.error_policy import ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import AgentError, ErrorType, ModelError
from agent_core.messages import Role, Usage
from agent_core.orchestrators.orchestration_events import (
    ProcessCompleted,
    ProcessContinuationEvaluated,
    ProcessStepFailed,
)
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.process_serialization import SlimProcessStateSerializer
from agent_core.orchestrators.stepbystep import (
    AccumulateUsage,
    AppendStepMessages,
    StepByStep,
    StepContext,
    run_processors,
)
from agent_core.orchestrators.turns import ActorReply, TurnStep
from agent_core.state import AgentStatus
from tests.support.factories import T0, TickingClock
from tests.support.orchestration import Recorder


@dataclass(frozen=True, slots=True)
class NoteState(ProcessState[TurnStep]):
    kind = "notes"

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> TurnStep:
        return TurnStep.from_dict(data)


class Notes(StepByStep[NoteState, TurnStep]):
    """A minimal orchestrator: each step writes the next scripted note (or raises)."""

    process = "notes"

    def __init__(
        self,
        script: Iterable[str | Exception],
        criteria: ContinuationCriteria[NoteState],
        **options: Any,
    ) -> None:
        super().__init__(criteria, clock=TickingClock(), **options)
        self.script = list(script)
        self.recorder = Recorder()
        self.listen(self.recorder)

    async def make_next_step(self, state: NoteState, context: StepContext) -> TurnStep:
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        assert state.current is not None
        reply = ActorReply(item, usage=Usage.of(5, 5))
        return TurnStep.from_reply(state.current.id, "writer", Role.ASSISTANT, reply)

    def failure_step(self, state: NoteState, error: AgentError) -> TurnStep:
        assert state.current is not None
        return TurnStep.failure(state.current.id, "writer", error)


def limit(steps: int) -> ContinuationCriteria[NoteState]:
    return ContinuationCriteria(StepsLimit(steps))


async def test_runs_until_the_criteria_stop_and_stores_step_results() -> None:
    notes = Notes(["a", "b", "c", "d"], limit(3))
    state = await notes.final_step(NoteState())
    assert [r.step.content for r in state.step_results()] == ["a", "b", "c"]
    assert [r.step_number for r in state.step_results()] == [1, 2, 3]
    assert state.stop_reason() is StopReason.STEPS_LIMIT
    assert state.status is AgentStatus.COMPLETED
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "StepsLimit"
    assert [m.content for m in state.messages] == ["a", "b", "c"]
    assert state.usage.total == 30


async def test_iterator_yields_each_intermediate_state_then_the_final_one() -> None:
    notes = Notes(["a", "b"], limit(2))
    seen = [s async for s in notes.iterator(NoteState())]
    assert [s.step_count() for s in seen] == [1, 2, 2]
    assert [s.status for s in seen] == [
        AgentStatus.IN_PROGRESS,
        AgentStatus.IN_PROGRESS,
        AgentStatus.COMPLETED,
    ]


async def test_criteria_decide_before_the_first_step() -> None:
    """A forbid before any step ends the run with no step and a step-0 evaluation."""
    criteria = ContinuationCriteria[NoteState](lambda state: False)
    notes = Notes(["never"], criteria)
    state = await notes.final_step(NoteState())
    assert state.step_count() == 0
    assert state.stop_reason() is StopReason.GUARD
    assert notes.script == ["never"]
    evaluated = notes.recorder.of(ProcessContinuationEvaluated)
    assert [e.step_number for e in evaluated] == [0]


async def test_can_continue_reads_the_last_step_result_not_the_criteria() -> None:
    notes = Notes(["a"], limit(5))
    state = await notes.final_step(NoteState(), execution_id="run-1")
    running = state.start_execution(T0)
    assert notes.can_continue(running) is True  # a new execution: the criteria allow
    assert notes.can_continue(state.with_status(AgentStatus.FAILED)) is False


async def test_a_new_execution_gets_a_fresh_step_budget_and_numbers_on() -> None:
    notes = Notes(["a", "b", "c", "d", "e"], limit(2))
    first = await notes.final_step(NoteState())
    second = await notes.final_step(first)
    assert second.step_count() == 4
    assert [r.step_number for r in second.step_results()] == [1, 2, 3, 4]
    slim = SlimProcessStateSerializer(NoteState)
    restored = slim.deserialize(slim.serialize(second))
    assert restored.step_count() == 4
    third = await Notes(["e"], limit(1)).final_step(restored)
    assert [r.step_number for r in third.step_results()] == [5]
    assert second.execution.run_count == 2


async def test_a_raised_error_is_recorded_as_a_failure_step_with_its_outcome() -> None:
    notes = Notes(["a", ModelError("the model is down")], limit(5))
    state = await notes.final_step(NoteState())
    failed = state.step_results()[-1]
    assert failed.step.errors[0].error_type is ErrorType.MODEL
    assert failed.step.errors[0].message == "the model is down"
    # no criterion judges errors, so the base's policy (stop on any error) does
    assert failed.outcome.resolved_by == "ErrorPolicyCriterion"
    assert state.stop_reason() is StopReason.ERROR
    assert state.status is AgentStatus.FAILED
    (event,) = notes.recorder.of(ProcessStepFailed)
    assert (event.error_type, event.error_message) == (ErrorType.MODEL, "the model is down")
    (done,) = notes.recorder.of(ProcessCompleted)
    assert done.error_message == "the model is down"


async def test_a_retry_policy_retries_failed_steps() -> None:
    criteria = ContinuationCriteria[NoteState](
        StepsLimit(2), ErrorPolicyCriterion(ErrorPolicy.retry_all(2))
    )
    notes = Notes([ValueError("flaky"), "ok"], criteria)
    state = await notes.final_step(NoteState())
    first = state.step_results()[0]
    assert first.outcome.decision is ContinuationDecision.REQUEST
    assert "ValueError: flaky" in first.step.errors[0].message
    assert (state.status, state.stop_reason()) == (AgentStatus.COMPLETED, StopReason.STEPS_LIMIT)
    assert state.final_response() == "ok"


async def test_processors_are_optional_middleware() -> None:
    """Without AppendStepMessages the conversation is left alone; a custom processor
    sees the state before and after the rest of the chain."""
    calls: list[str] = []

    def tag(state: NoteState, next_: Callable[[NoteState], NoteState]) -> NoteState:
        calls.append("before")
        state = next_(state.with_metadata("tagged", True))
        calls.append(f"after usage={state.usage.total}")
        return state

    notes = Notes(["a"], limit(1), processors=[tag, AccumulateUsage()])
    state = await notes.final_step(NoteState())
    assert state.messages == ()
    assert state.usage.total == 10
    assert state.metadata["tagged"] is True
    assert calls == ["before", "after usage=10"]


def test_run_processors_threads_in_order() -> None:
    state = NoteState().begin_step(TickingClock()())
    step = TurnStep.from_reply("s", "w", Role.USER, ActorReply("hi", usage=Usage.of(1, 2)))
    result = run_processors(
        [AppendStepMessages(), AccumulateUsage()], state.with_pending_step(step)
    )
    assert [m.content for m in result.messages] == ["hi"]
    assert result.usage.total == 3


async def test_token_limit_stops_with_its_reason() -> None:
    criteria = ContinuationCriteria[NoteState](StepsLimit(10), TokenUsageLimit(25))
    state = await Notes(["a", "b", "c", "d"], criteria).final_step(NoteState())
    assert state.step_count() == 3
    assert state.stop_reason() is StopReason.TOKEN_LIMIT


def test_loading_another_kind_of_state_is_refused() -> None:
    data = NoteState().to_dict() | {"kind": "chat"}
    with pytest.raises(ValueError, match="serialized chat state, not a notes state"):
        NoteState.from_dict(data)
