"""Capability routing: resolve, classify, execute, decide, loop, remember."""

from __future__ import annotations

import json

import pytest

from agent_core.app.demo_tools import calculator, get_weather
from agent_core.continuation import ContinuationDecision, StopReason
from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse
from agent_core.error_policy import ErrorPolicy
from agent_core.errors import ErrorType, ValidationError
from agent_core.events import ToolCallCompleted, ToolCallStarted
from agent_core.orchestrators.orchestration_events import (
    CapabilitySelected,
    ContinuationDecided,
    IntentClassified,
    ReferencesResolved,
    SessionMemoryAppended,
)
from agent_core.orchestrators.process_serialization import (
    FullProcessStateSerializer,
    SlimProcessStateSerializer,
)
from agent_core.orchestrators.routing.capabilities import (
    CapabilityRegistry,
    CapabilityResult,
    FunctionCapability,
)
from agent_core.orchestrators.routing.classifier import (
    ModelIntentClassifier,
    Rule,
    RuleBasedClassifier,
)
from agent_core.orchestrators.routing.decider import ContinuationResult, ModelContinuationDecider
from agent_core.orchestrators.routing.memory import (
    InMemorySessionMemory,
    ModelReferenceResolver,
    SessionContext,
    SessionTurn,
)
from agent_core.orchestrators.routing.router import CapabilityRouter, RoutingState
from agent_core.state import AgentStatus
from tests.support.factories import TickingClock
from tests.support.orchestration import Recorder

WEATHER = Rule("get_weather", r"weather (?:in|for) (?P<city>[A-Z]\w+)")
MATH = Rule("calculator", r"(?:compute|calculate) (?P<expression>.+)")


def say(text: str) -> ScriptedResponse:
    return ScriptedResponse(text=text)


def decide(**answer: object) -> ScriptedResponse:
    return say(json.dumps(answer))


def router(**options: object) -> tuple[CapabilityRouter, Recorder]:
    recorder = Recorder()
    options.setdefault("classifier", RuleBasedClassifier([WEATHER, MATH]))
    orchestrator = CapabilityRouter(
        [get_weather, calculator],
        clock=TickingClock(),
        **options,  # type: ignore[arg-type]
    )
    orchestrator.listen(recorder)
    return orchestrator, recorder


async def test_one_request_runs_one_capability_with_the_noop_decider() -> None:
    orchestrator, recorder = router()
    state = await orchestrator.handle("What is the weather in Oslo?", "s1")
    assert state.status is AgentStatus.COMPLETED
    assert state.stop_reason() is StopReason.COMPLETED
    (result,) = state.step_results()
    assert result.step.capability == "get_weather"
    assert result.step.arguments == {"city": "Oslo"}
    assert json.loads(result.step.content)["city"] == "Oslo"
    assert result.step.decision == ContinuationResult(done=True)
    evaluation = next(e for e in result.outcome.evaluations if e.criterion == "ContinuationDecider")
    assert evaluation.decision is ContinuationDecision.STOP
    answer = state.result()
    assert answer is not None
    assert (answer.capability, answer.success) == ("get_weather", True)
    assert answer.metadata["session_id"] == "s1"
    assert answer.output == result.step.content
    started, completed = recorder.of(ToolCallStarted)[0], recorder.of(ToolCallCompleted)[0]
    assert started.tool_call_id == completed.tool_call_id == result.step.call_id
    assert started.tool_call_id.startswith("cap_")
    assert recorder.types() == [
        "process.started",
        "routing.intent.classified",
        "routing.capability.selected",
        "process.step.started",
        "agent.tool.started",
        "agent.tool.completed",
        "routing.continuation.decided",
        "process.continuation",
        "process.state.updated",
        "process.step.completed",
        "routing.memory.appended",
        "process.completed",
    ]


async def test_the_model_decider_chains_capabilities_and_writes_the_answer() -> None:
    """The routing loop: while the decider is not done, the capability it names runs next."""
    driver = ScriptedDriver(
        [
            decide(done=False, next_capability="calculator", arguments={"expression": "10*9/5+32"}),
            decide(done=True, final_output="Oslo: 50 °F"),
        ]
    )
    orchestrator, recorder = router(decider=ModelContinuationDecider(driver))
    state = await orchestrator.handle("weather in Oslo in fahrenheit")
    assert [s.capability for s in state.steps()] == ["get_weather", "calculator"]
    assert state.steps()[1].content == "50.0"
    assert state.final_response() == "Oslo: 50 °F"
    assert state.stop_reason() is StopReason.COMPLETED
    selected = recorder.of(CapabilitySelected)
    assert [(e.actor, e.selector) for e in selected] == [
        ("get_weather", "rules"),
        ("calculator", "model"),
    ]
    assert state.step_results()[0].outcome.resolved_by == "ContinuationDecider"
    assert "calculator (ok): 50.0" in driver.requests[1].messages[1].content
    assert state.usage.total > 0


async def test_the_loop_is_bounded_by_max_steps() -> None:
    again = decide(done=False, next_capability="calculator", arguments={"expression": "1+1"})
    orchestrator, _ = router(
        decider=ModelContinuationDecider(ScriptedDriver([again] * 5)), max_steps=3
    )
    state = await orchestrator.handle("compute 1+1")
    assert state.step_count() == 3
    assert state.stop_reason() is StopReason.STEPS_LIMIT
    assert state.status is AgentStatus.COMPLETED


async def test_a_decider_naming_an_unknown_capability_fails_the_next_step() -> None:
    orchestrator, _ = router(
        decider=ModelContinuationDecider(ScriptedDriver([decide(done=False, next_capability="x")]))
    )
    state = await orchestrator.handle("compute 2*3")
    assert state.status is AgentStatus.FAILED
    error = state.steps()[-1].errors[0]
    assert error.error_type is ErrorType.VALIDATION
    assert error.message == (
        "unknown capability 'x'; registered capabilities: get_weather, calculator"
    )


async def test_a_raising_capability_is_a_failed_tool_like_call() -> None:
    """Its call is in the step's tool_calls, the decider sees the failed result, and
    the request fails with the error (seed 002: the decider gets the full result)."""
    decider = RecordingDecider(ContinuationResult(done=True))
    orchestrator, recorder = router(decider=decider)
    state = await orchestrator.handle("compute 2 +")
    assert state.status is AgentStatus.FAILED
    assert state.stop_reason() is StopReason.ERROR
    (completed,) = recorder.of(ToolCallCompleted)
    assert completed.success is False
    assert completed.error is not None
    assert "not an arithmetic expression" in completed.error
    step = state.steps()[0]
    assert [(c.id, c.name) for c in step.tool_calls] == [(completed.tool_call_id, "calculator")]
    assert step.errors[0].tool_call_id == completed.tool_call_id
    (seen,) = decider.seen
    assert seen.success is False
    assert "not an arithmetic expression" in seen.metadata["error"]
    assert step.result == seen
    (decided,) = recorder.of(ContinuationDecided)
    assert decided.success is False
    assert state.error_message() == f"capability 'calculator' failed: {seen.metadata['error']}"
    answer = state.result()
    assert answer is not None
    assert answer.success is False
    assert answer.metadata["error"] == state.error_message()
    slim = SlimProcessStateSerializer(RoutingState).serialize(state)
    assert slim["steps"][0]["tool_calls"] == [{"id": completed.tool_call_id, "name": "calculator"}]


async def test_an_unsuccessful_result_fails_the_request_after_the_decider_saw_it() -> None:
    """A reported failure is the capability's result (the decider sees it) and the
    step's tool error: with the default policy the request fails, saying why."""

    def lookup(key: str) -> CapabilityResult:
        """Look a key up."""
        return CapabilityResult(capability="lookup", output="not found", success=False)

    decider = RecordingDecider(ContinuationResult(done=True))
    classifier = RuleBasedClassifier([Rule("lookup", r"lookup (?P<key>\w+)")])
    orchestrator = CapabilityRouter([lookup], classifier, decider=decider)
    state = await orchestrator.handle("lookup k")
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    assert state.error_message() == "capability 'lookup' reported failure: not found"
    assert [r.output for r in decider.seen] == ["not found"]
    answer = state.result()
    assert answer is not None
    assert (answer.output, answer.success) == ("not found", False)


async def test_the_decider_may_recover_from_a_failure_the_policy_tolerates() -> None:
    """With a policy that ignores tool errors, the decider that saw the failure picks
    the next capability, and the model decider is told what failed."""
    driver = ScriptedDriver(
        [
            decide(done=False, next_capability="get_weather", arguments={"city": "Oslo"}),
            decide(done=True),
        ]
    )
    orchestrator, _ = router(
        decider=ModelContinuationDecider(driver), error_policy=ErrorPolicy.ignore_tool_errors()
    )
    state = await orchestrator.handle("compute 2 +")
    assert [s.capability for s in state.steps()] == ["calculator", "get_weather"]
    assert (state.status, state.stop_reason()) == (AgentStatus.COMPLETED, StopReason.COMPLETED)
    assert "calculator (failed: ValueError: not an arithmetic expression" in (
        driver.requests[0].messages[1].content
    )


async def test_the_default_classifier_routes_by_capability_name() -> None:
    def echo(text: str) -> str:
        """Echo."""
        return text

    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    orchestrator = CapabilityRouter([echo, shout])
    assert (await orchestrator.handle("please shout this")).steps()[0].capability == "shout"
    plain = await orchestrator.handle("hello there")
    assert (plain.steps()[0].capability, plain.final_response()) == ("echo", "hello there")


async def test_the_model_classifier_validates_its_answer() -> None:
    registry = CapabilityRegistry([get_weather, calculator])
    driver = ScriptedDriver(
        [
            say('```json\n{"capability": "get_weather", "arguments": {"city": "Rome"}}\n```'),
            say('{"capability": "teleport"}'),
            say("I think weather"),
        ]
    )
    classifier = ModelIntentClassifier(driver, registry)
    orchestrator = CapabilityRouter(registry, classifier)
    state = await orchestrator.handle("is it warm in Rome?")
    assert state.steps()[0].arguments == {"city": "Rome"}
    assert "get_weather: Current weather" in driver.requests[0].messages[0].content
    unknown = await orchestrator.handle("beam me up")
    assert "unknown capability 'teleport'" in unknown.steps()[0].errors[0].message
    assert unknown.steps()[0].capability == "(unclassified)"
    garbled = await orchestrator.handle("?")
    assert "the classifier's answer is not valid" in garbled.steps()[0].errors[0].message


async def test_session_memory_and_reference_resolution() -> None:
    """The second request of a session is resolved against the first one's turn."""
    memory = InMemorySessionMemory()
    resolver = ModelReferenceResolver(ScriptedDriver([say("weather in Paris")]))
    orchestrator, recorder = router(memory=memory, resolver=resolver)
    first = await orchestrator.handle("weather in Oslo", "s1")
    assert first.resolved_input is None  # nothing to resolve against yet
    second = await orchestrator.handle("and there in Paris?", "s1")
    assert second.resolved_input == "weather in Paris"
    assert second.steps()[0].arguments == {"city": "Paris"}
    seen = resolver.driver.requests[0].messages  # type: ignore[attr-defined]
    assert [m.content for m in seen[1:]] == [
        "weather in Oslo",
        first.final_response(),
        "and there in Paris?",
    ]
    context = await memory.load("s1")
    assert [t.input for t in context.turns] == ["weather in Oslo", "and there in Paris?"]
    assert context.turns[1].resolved_input == "weather in Paris"
    assert context.turns[1].capability == "get_weather"
    assert [e.turns for e in recorder.of(SessionMemoryAppended)] == [1, 2]
    (resolved,) = recorder.of(ReferencesResolved)
    assert (resolved.original, resolved.resolved) == ("and there in Paris?", "weather in Paris")
    assert [e.capability for e in recorder.of(IntentClassified)] == ["get_weather"] * 2
    assert (await memory.load("other")).turns == ()


async def test_no_session_no_memory() -> None:
    memory = InMemorySessionMemory()
    orchestrator, recorder = router(memory=memory)
    await orchestrator.handle("weather in Oslo")
    assert recorder.of(SessionMemoryAppended) == []


async def test_failed_requests_are_remembered_as_failed() -> None:
    memory = InMemorySessionMemory(max_turns=1)
    orchestrator, _ = router(memory=memory)
    await orchestrator.handle("weather in Oslo", "s")
    await orchestrator.handle("compute 1 +", "s")
    (turn,) = (await memory.load("s")).turns
    assert (turn.input, turn.success) == ("compute 1 +", False)


async def test_serialization_round_trips_full_and_slim() -> None:
    orchestrator, _ = router()
    await orchestrator.handle("weather in Oslo", "s9")
    state = await orchestrator.handle("compute 3*3", "s9")
    full = FullProcessStateSerializer(RoutingState)
    again = full.loads(full.dumps(state))
    assert again == state
    assert again.context == SessionContext(
        "s9",
        (
            SessionTurn(
                "weather in Oslo",
                state.context.turns[0].output,
                "get_weather",  # type: ignore[union-attr]
            ),
        ),
    )
    slim = SlimProcessStateSerializer(RoutingState)
    data = slim.serialize(state)
    assert data["process"] == "routing"
    assert data["steps"][0]["actor"] == "calculator"
    assert data["steps"][0]["tool_calls"][0]["name"] == "calculator"
    restored = slim.deserialize(data)
    assert restored.messages == state.messages
    assert restored.metadata["session_id"] == "s9"


async def test_empty_input_and_empty_registries_are_refused() -> None:
    orchestrator, _ = router()
    with pytest.raises(ValueError, match="must not be empty"):
        await orchestrator.handle("   ")
    with pytest.raises(ValueError, match="at least one capability"):
        CapabilityRouter([])
    with pytest.raises(ValueError, match="two capabilities are named 'calculator'"):
        CapabilityRegistry([calculator, FunctionCapability(calculator)])


async def test_rule_classifier_without_default_says_so() -> None:
    classifier = RuleBasedClassifier([WEATHER])
    with pytest.raises(ValidationError, match="no rule matches 'hi'"):
        await classifier.classify("hi", None)
    with pytest.raises(ValueError, match="bad pattern"):
        Rule("x", "(")


async def test_model_decider_rejects_not_done_without_a_next_capability() -> None:
    decider = ModelContinuationDecider(ScriptedDriver([decide(done=False)]))
    result = CapabilityResult(capability="c", output="o")
    with pytest.raises(ValidationError, match="done=false without a next_capability"):
        await decider.decide("q", "c", result)


class UnavailableMemory(InMemorySessionMemory):
    """A session store that cannot write (its backend is down)."""

    async def append(self, session_id: str, turn: SessionTurn) -> SessionContext:
        raise ConnectionError("session store unavailable")


async def test_a_session_store_that_cannot_write_does_not_lose_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orchestrator, recorder = router(memory=UnavailableMemory())
    state = await orchestrator.handle("weather in Oslo", "s1")
    assert state.status is AgentStatus.COMPLETED
    assert "Oslo" in state.final_response()
    assert recorder.types()[-1] == "process.completed"
    assert "before_finish failed" in caplog.text


class RecordingDecider:
    """Records what it is shown, then answers ``answer`` (or raises it)."""

    name = "recording"

    def __init__(self, answer: ContinuationResult | Exception) -> None:
        self.answer = answer
        self.seen: list[CapabilityResult] = []

    async def decide(
        self,
        user_input: str,
        capability: str,
        result: CapabilityResult,
        history: object = (),
    ) -> ContinuationResult:
        self.seen.append(result)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_the_decider_sees_the_steps_timing_and_the_session_id() -> None:
    decider = RecordingDecider(ContinuationResult(done=True))
    orchestrator, _ = router(decider=decider)
    state = await orchestrator.handle("weather in Oslo", "s7")
    (seen,) = decider.seen
    assert seen.metadata["session_id"] == "s7"
    assert seen.metadata["step_number"] == 1
    assert seen.metadata["duration_ms"] > 0  # the ticking clock advances on every read
    assert seen.metadata["started_at"] == state.step_results()[0].to_dict()["started_at"]
    assert state.steps()[0].result == seen


async def test_a_failing_decider_keeps_the_capabilitys_output() -> None:
    """The decider's error is recorded on the step and published; the request ends
    completed with the capability's output (the run is not thrown away)."""
    decider = RecordingDecider(ConnectionError("decider model unreachable"))
    orchestrator, recorder = router(decider=decider)
    state = await orchestrator.handle("weather in Oslo", "s8")
    assert state.status is AgentStatus.COMPLETED
    assert state.stop_reason() is StopReason.COMPLETED
    (step,) = state.steps()
    assert step.errors == ()
    assert step.decision is None
    error = "ConnectionError: decider model unreachable"
    assert step.decider_error == error
    assert json.loads(state.final_response())["city"] == "Oslo"
    answer = state.result()
    assert answer is not None
    assert (answer.capability, answer.success) == ("get_weather", True)
    evaluation = next(
        e
        for e in state.step_results()[0].outcome.evaluations
        if e.criterion == "ContinuationDecider"
    )
    assert evaluation.decision is ContinuationDecision.STOP
    assert "decider model unreachable" in evaluation.reason
    (decided,) = recorder.of(ContinuationDecided)
    assert (decided.decision, decided.error) == (None, error)
    assert recorder.types()[-1] == "process.completed"
    again = FullProcessStateSerializer(RoutingState).loads(
        FullProcessStateSerializer(RoutingState).dumps(state)
    )
    assert again.steps()[0].decider_error == error


async def test_the_classification_reports_its_confidence_and_reason() -> None:
    rules = [Rule("get_weather", r"weather in (?P<city>\w+)", confidence=0.9, reason="weather")]
    orchestrator, recorder = router(
        classifier=RuleBasedClassifier(rules, default="calculator", default_argument="expression")
    )
    await orchestrator.handle("weather in Oslo")
    await orchestrator.handle("1+1")
    first, second = recorder.of(IntentClassified)
    assert (first.capability, first.confidence, first.reason) == ("get_weather", 0.9, "weather")
    assert (second.capability, second.confidence) == ("calculator", 0.5)
    assert (first.step_number, second.step_number) == (1, 1)
    with pytest.raises(ValueError, match=r"confidence must be 0\.\.1"):
        Rule("x", "x", confidence=2)
