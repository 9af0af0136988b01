"""Chat: participants, selectors, defaults, stop reasons and serialization."""

from __future__ import annotations

import pytest

from agent_core.app.demo_tools import demo_tools
from agent_core.continuation import StopReason
from agent_core.criteria import (
    FinishReasonCheck,
    RetryLimit,
    StepsLimit,
    TokenUsageLimit,
)
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse, call
from agent_core.error_policy import ErrorPolicyCriterion
from agent_core.errors import ModelError
from agent_core.events import ToolCallCompleted
from agent_core.messages import FinishReason, Role, Usage
from agent_core.orchestrators.chat import (
    CallableParticipant,
    Chat,
    ChatState,
    ModelParticipant,
    ScriptedParticipant,
)
from agent_core.orchestrators.orchestration_events import ParticipantSelected, ProcessStepStarted
from agent_core.orchestrators.process_serialization import (
    FullProcessStateSerializer,
    SlimProcessStateSerializer,
)
from agent_core.orchestrators.turns import ActorReply, ModelSelector, Turn
from agent_core.state import AgentStatus
from tests.support.factories import TickingClock
from tests.support.orchestration import Recorder


def say(text: str) -> ScriptedResponse:
    return ScriptedResponse(text=text)


def chat(*participants: object, **options: object) -> tuple[Chat, Recorder]:
    recorder = Recorder()
    orchestrator = Chat(participants, clock=TickingClock(), **options)  # type: ignore[arg-type]
    orchestrator.listen(recorder)
    return orchestrator, recorder


def test_defaults_follow_the_spec() -> None:
    orchestrator = Chat([ScriptedParticipant("a", [])])
    criteria = orchestrator.criteria.criteria
    steps, tokens, retries, errors, finish = criteria
    assert isinstance(steps, StepsLimit)
    assert steps.max_steps == 16
    assert isinstance(tokens, TokenUsageLimit)
    assert tokens.max_tokens == 4096
    assert isinstance(retries, RetryLimit)
    assert retries.max_retries == 2
    assert isinstance(errors, ErrorPolicyCriterion)
    assert errors.policy.max_retries == 2
    assert isinstance(finish, FinishReasonCheck)
    assert finish.finish_reasons == {
        FinishReason.STOP,
        FinishReason.LENGTH,
        FinishReason.CONTENT_FILTER,
    }


async def test_a_human_and_a_model_take_turns_until_the_model_finishes() -> None:
    """Round robin: the scripted human speaks, the model answers with finish reason
    stop, which ends the chat; the model sees the human as a named user."""
    human = ScriptedParticipant("ann", ["What is 6 x 7?"], role=Role.USER)
    driver = ScriptedDriver([say("42.")])
    orchestrator, recorder = chat(human, ModelParticipant("bot", driver))
    state = await orchestrator.run(orchestrator.new_state())
    assert [(r.actor, r.step.content) for r in state.step_results()] == [
        ("ann", "What is 6 x 7?"),
        ("bot", "42."),
    ]
    assert state.stop_reason() is StopReason.FINISH_REASON
    assert state.status is AgentStatus.COMPLETED
    assert [(m.role, m.metadata["actor"]) for m in state.messages] == [
        (Role.USER, "ann"),
        (Role.ASSISTANT, "bot"),
    ]
    seen = driver.requests[0].messages
    assert [(m.role, m.content) for m in seen[1:]] == [(Role.USER, "ann: What is 6 x 7?")]
    assert [e.actor for e in recorder.of(ParticipantSelected)] == ["ann", "bot"]
    assert [e.actor for e in recorder.of(ProcessStepStarted)] == ["ann", "bot"]
    assert recorder.types()[:4] == [
        "process.started",
        "chat.participant.selected",
        "process.step.started",
        "process.continuation",
    ]
    assert recorder.types()[-1] == "process.completed"


async def test_external_participants_may_be_sync_or_async() -> None:
    async def oracle(turn: Turn) -> ActorReply:
        return ActorReply(f"oracle saw {len(turn.messages)}", FinishReason.STOP, Usage.of(1, 1))

    echo = CallableParticipant("echo", lambda turn: f"echo {turn.messages[-1].content}")
    orchestrator, _ = chat(echo, CallableParticipant("oracle", oracle))
    state = await orchestrator.run("hi")
    assert [r.step.content for r in state.step_results()] == ["echo hi", "oracle saw 2"]
    assert state.usage.total == 2


async def test_steps_limit_ends_an_endless_chat() -> None:
    a = ScriptedParticipant("a", ["ping"] * 5)
    b = ScriptedParticipant("b", ["pong"] * 5)
    orchestrator, _ = chat(a, b, max_steps=3)
    state = await orchestrator.run("go")
    assert [r.actor for r in state.step_results()] == ["a", "b", "a"]
    assert state.stop_reason() is StopReason.STEPS_LIMIT


async def test_token_limit_counts_the_turns_usage() -> None:
    chatty = ScriptedParticipant("a", [ActorReply("x" * 10, usage=Usage.of(30, 30))] * 5)
    orchestrator, _ = chat(chatty, max_tokens=100)
    state = await orchestrator.run("go")
    assert state.step_count() == 2
    assert state.stop_reason() is StopReason.TOKEN_LIMIT


async def test_a_failing_participant_is_retried_twice_then_the_chat_fails() -> None:
    driver = ScriptedDriver([ScriptedFailure(ModelError("down"))] * 3)
    orchestrator, recorder = chat(ModelParticipant("bot", driver), ScriptedParticipant("x", []))
    state = await orchestrator.run("hello?")
    assert [r.actor for r in state.step_results()] == ["bot", "bot", "bot"]
    # RetryLimit and the error policy both forbid the third failure: the error wins
    assert state.stop_reason() is StopReason.ERROR
    assert state.status is AgentStatus.FAILED
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "ErrorPolicyCriterion"
    assert [e.stop_reason for e in outcome.evaluations if e.decision == "forbid"] == [
        StopReason.RETRY_LIMIT,
        StopReason.ERROR,
    ]
    reasons = [e.reason for e in recorder.of(ParticipantSelected)]
    assert reasons[1:] == ["retrying bot after a failed turn"] * 2


async def test_a_retry_that_succeeds_keeps_the_chat_going() -> None:
    driver = ScriptedDriver([ScriptedFailure(ModelError("blip")), say("back")])
    orchestrator, _ = chat(ModelParticipant("bot", driver))
    state = await orchestrator.run("hello?")
    assert [bool(r.step.errors) for r in state.step_results()] == [True, False]
    assert state.status is AgentStatus.COMPLETED
    assert state.final_response() == "back"


async def test_a_model_participant_with_tools_runs_them_inside_its_turn() -> None:
    driver = ScriptedDriver(
        [
            ScriptedResponse(tool_calls=(call("calculator", "c1", expression="6*7"),)),
            say("It is 42."),
        ]
    )
    mathy = ModelParticipant("mathy", driver, tools=demo_tools())
    orchestrator, recorder = chat(mathy)
    state = await orchestrator.run("6 x 7?")
    (result,) = state.step_results()
    assert result.step.content == "It is 42."
    assert [e.output for e in result.step.tool_executions] == ["42"]
    assert [m.content for m in state.messages] == ["6 x 7?", "It is 42."]
    (completed,) = recorder.of(ToolCallCompleted)
    assert (completed.tool_name, completed.step_number, completed.success) == (
        "calculator",
        1,
        True,
    )
    assert result.step.usage.total > 0
    assert driver.requests[1].messages[-1].role is Role.TOOL


async def test_the_model_selector_chooses_and_falls_back_to_the_first() -> None:
    """An unknown name falls back to the first participant, and the fallback is
    recorded in the event and the step's selection."""
    selector = ModelSelector(ScriptedDriver([say("Bob."), say("nobody")]))
    alice = ScriptedParticipant("alice", ["a1"], description="asks")
    bob = ScriptedParticipant("bob", ["b1"])
    orchestrator, recorder = chat(alice, bob, selector=selector, max_steps=2)
    state = await orchestrator.run("start")
    assert [r.actor for r in state.step_results()] == ["bob", "alice"]
    chosen, fallback = recorder.of(ParticipantSelected)
    assert (chosen.fallback, chosen.reason) == (False, "chosen by the model")
    assert fallback.fallback is True
    assert "'nobody'" in fallback.reason
    assert "fell back to 'alice'" in fallback.reason
    prompt = selector.driver.requests[0].messages[0].content  # type: ignore[attr-defined]
    assert "- alice: asks" in prompt
    assert "- bob" in prompt
    assert state.step_results()[0].step.usage.total > 0  # choosing cost tokens


async def test_a_failing_selector_model_falls_back_too() -> None:
    selector = ModelSelector(ScriptedDriver([ScriptedFailure(ModelError("no"))]))
    orchestrator, recorder = chat(
        ScriptedParticipant("a", ["x"], role=Role.USER), selector=selector, max_steps=1
    )
    await orchestrator.run("go")
    (event,) = recorder.of(ParticipantSelected)
    assert event.fallback
    assert "selector model failed" in event.reason


async def test_round_robin_continues_after_a_resume() -> None:
    a, b = ScriptedParticipant("a", ["a1", "a2"]), ScriptedParticipant("b", ["b1"])
    orchestrator, _ = chat(a, b, max_steps=1)
    first = await orchestrator.run("go")
    second = await orchestrator.run(first)
    third = await orchestrator.run(second)
    assert [r.actor for r in third.step_results()] == ["a", "b", "a"]


async def test_serialization_round_trips_full_and_slim() -> None:
    orchestrator, _ = chat(
        ScriptedParticipant("ann", ["hi"], role=Role.USER),
        ModelParticipant("bot", ScriptedDriver([say("hello ann")])),
    )
    state = await orchestrator.run(orchestrator.new_state(metadata={"topic": "greetings"}))
    full = FullProcessStateSerializer(ChatState)
    assert full.loads(full.dumps(state)) == state
    slim = SlimProcessStateSerializer(ChatState)
    data = slim.serialize(state)
    assert [s["actor"] for s in data["steps"]] == ["ann", "bot"]
    assert data["messages"][1] == {
        "role": "assistant",
        "content": "hello ann",
        "metadata": {"actor": "bot"},
    }
    restored = slim.deserialize(data)
    assert (restored.messages, restored.metadata) == (state.messages, state.metadata)


def test_participants_need_unique_names() -> None:
    with pytest.raises(ValueError, match="two participants are named 'a'"):
        Chat([ScriptedParticipant("a", []), ScriptedParticipant("a", [])])
    with pytest.raises(ValueError, match="needs at least one participant"):
        Chat([])


async def test_a_scripted_participant_out_of_replies_is_a_failed_turn() -> None:
    orchestrator, _ = chat(ScriptedParticipant("a", []), max_retries=0)
    state = await orchestrator.run("go")
    assert "no replies left" in state.steps()[0].errors[0].message
    assert state.status is AgentStatus.FAILED
