"""End-to-end runs of an agent with two tools on the scripted driver: the events, the
step results and the stop reason of each scenario."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_core.app.demo_tools import demo_driver
from agent_core.builder import AgentBuilder
from agent_core.continuation import ContinuationDecision, StopReason
from agent_core.drivers.scripted import (
    ScriptedDriver,
    ScriptedFailure,
    ScriptedTurn,
    call,
)
from agent_core.error_policy import ErrorPolicy
from agent_core.errors import ErrorType, RateLimitError
from agent_core.events import (
    AgentEvent,
    ExecutionCompleted,
    ExecutionFailed,
    HookExecuted,
    StepCompleted,
    StreamChunk,
    ToolCallBlocked,
    ToolCallCompleted,
    ToolCallStarted,
)
from agent_core.hooks import HookPoint
from agent_core.messages import Role
from agent_core.state import AgentState, AgentStatus
from agent_core.steps import StepType
from tests.support.factories import (
    MATH,
    Run,
    TickingClock,
    calls,
    say,
)

WEATHER = call("get_weather", "call_w", city="Oslo")


async def test_two_tools_then_an_answer_completes() -> None:
    run = Run([calls(WEATHER), calls(MATH), say("It is mild; 6 * 7 = 42.")])
    state = await run()
    step_events = [
        "agent.step.started",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.continuation",
        "agent.usage",
        "agent.state.updated",
        "agent.step.completed",
    ]
    final_step = [
        "agent.step.started",
        "agent.stream.chunk",
        *step_events[3:],
    ]
    assert run.types() == [
        "agent.execution.started",
        *step_events,
        *step_events,
        *final_step,
        "agent.execution.completed",
    ]
    assert state.status is AgentStatus.COMPLETED
    assert state.stop_reason() is StopReason.COMPLETED
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert (outcome.resolved_by, outcome.decision) == (
        "ToolCallPresenceCheck",
        ContinuationDecision.STOP,
    )
    results = state.step_results()
    assert [r.step_number for r in results] == [1, 2, 3]
    assert [r.step.step_type for r in results] == [
        StepType.TOOL_EXECUTION,
        StepType.TOOL_EXECUTION,
        StepType.FINAL,
    ]
    assert [r.outcome.resolved_by for r in results[:2]] == ["ToolCallPresenceCheck"] * 2
    assert run.tool_runs == ["get_weather", "calculator"]
    assert state.final_response() == "It is mild; 6 * 7 = 42."
    assert [m.role for m in state.messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert state.messages[4].content == "42"


async def test_tool_events_carry_the_real_call() -> None:
    run = Run([calls(WEATHER, MATH), say("done")])
    state = await run()
    started = run.of(ToolCallStarted)
    completed = run.of(ToolCallCompleted)
    assert [(e.tool_call_id, e.tool_name) for e in started] == [  # type: ignore[attr-defined]
        ("call_w", "get_weather"),
        ("call_m", "calculator"),
    ]
    math = completed[1]
    assert isinstance(math, ToolCallCompleted)
    assert (math.args, math.success, math.error, math.result) == (
        {"expression": "6 * 7"},
        True,
        None,
        "42",
    )
    assert math.duration_ms > 0
    assert all(e.agent_id == state.agent_id for e in run.events)
    assert {e.execution_id for e in run.events} == {state.execution_id()}


async def test_step_completed_event_reports_the_step() -> None:
    run = Run([calls(WEATHER), say("done")])
    await run()
    first, last = run.of(StepCompleted)
    assert isinstance(first, StepCompleted)
    assert isinstance(last, StepCompleted)
    assert (first.step_number, first.has_tool_calls, first.errors) == (1, True, 0)
    assert (first.finish_reason, last.finish_reason) == ("tool_calls", "stop")
    assert first.usage.total > 0
    assert first.duration_ms > 0
    assert first.outcome.should_continue
    assert not last.outcome.should_continue


async def test_stream_chunks_rebuild_the_answer() -> None:
    run = Run([say("Hello there, traveller.")])
    state = await run()
    chunks = [e for e in run.of(StreamChunk) if isinstance(e, StreamChunk)]
    assert "".join(c.text_delta for c in chunks) == state.final_response()
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert [c.is_complete for c in chunks] == [False] * (len(chunks) - 1) + [True]


async def test_step_limit_stops_with_steps_limit() -> None:
    run = Run([calls(MATH)] * 5, AgentBuilder().with_max_steps(3))
    state = await run()
    assert state.status is AgentStatus.COMPLETED
    assert state.stop_reason() is StopReason.STEPS_LIMIT
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "StepsLimit"
    assert len(state.step_results()) == 3
    assert run.driver.remaining == 2
    end = run.of(ExecutionCompleted)[0]
    assert isinstance(end, ExecutionCompleted)
    assert end.stop_reason is StopReason.STEPS_LIMIT


async def test_token_limit_stops_with_token_limit() -> None:
    run = Run([calls(MATH)] * 5, AgentBuilder().with_max_tokens(30))
    state = await run()
    assert state.stop_reason() is StopReason.TOKEN_LIMIT
    assert state.execution_usage().total >= 30


async def test_time_limit_stops_with_time_limit() -> None:
    run = Run([calls(MATH)] * 50, AgentBuilder().with_time_limit(60))
    state = await run()
    assert state.stop_reason() is StopReason.TIME_LIMIT
    assert state.status is AgentStatus.COMPLETED
    assert run.driver.remaining > 0


async def test_tool_error_under_stop_on_any_error_fails_the_run() -> None:
    run = Run([calls(call("calculator", "c1", expression="1 / 0")), say("never")])
    state = await run()
    assert state.status is AgentStatus.FAILED
    assert state.stop_reason() is StopReason.ERROR
    last = state.last_step_result()
    assert last is not None
    assert (
        last.step.errors[0].message
        == "tool 'calculator' raised ZeroDivisionError: division by zero"
    )
    assert last.outcome.resolved_by == "ErrorPolicyCriterion"
    failed = run.of(ExecutionFailed)
    assert len(failed) == 1
    assert isinstance(failed[0], ExecutionFailed)
    assert failed[0].error_type is ErrorType.TOOL
    assert run.of(ExecutionCompleted) == []
    assert run.driver.remaining == 1


@pytest.mark.parametrize(
    ("bad_call", "message"),
    [
        (
            call("teleport", "c1"),
            "unknown tool 'teleport'; available tools: get_weather, calculator",
        ),
        (call("get_weather", "c1", town="Oslo"), "invalid arguments for tool 'get_weather'"),
    ],
)
async def test_unknown_tool_and_bad_arguments_are_recorded_errors(
    bad_call: object, message: str
) -> None:
    state = await Run([calls(bad_call), say("never")])()
    assert state.status is AgentStatus.FAILED
    last = state.last_step_result()
    assert last is not None
    assert last.step.errors[0].message.startswith(message)


async def test_retry_tool_errors_lets_the_model_correct_itself() -> None:
    bad = calls(call("calculator", "c1", expression="1 +"))
    run = Run(
        [bad, calls(MATH), say("42")],
        AgentBuilder().with_error_policy(ErrorPolicy.retry_tool_errors(1)),
    )
    state = await run()
    assert state.status is AgentStatus.COMPLETED
    first = state.step_results()[0]
    assert first.outcome.resolved_by == "ErrorPolicyCriterion"
    assert state.messages[2].content.startswith("Error: tool 'calculator' raised ValueError")


async def test_model_error_fails_the_run_by_default() -> None:
    run = Run([ScriptedFailure(RateLimitError("429: slow down")), say("never")])
    state = await run()
    assert state.status is AgentStatus.FAILED
    last = state.last_step_result()
    assert last is not None
    assert last.step.step_type is StepType.ERROR
    assert last.step.errors[0].error_type is ErrorType.RATE_LIMIT
    failed = run.of(ExecutionFailed)[0]
    assert isinstance(failed, ExecutionFailed)
    assert failed.error_message == "429: slow down"


async def test_a_response_with_too_many_tool_calls_runs_none_and_fails_the_step() -> None:
    """A hostile or broken model asking for 10,000 calls at once cost 40 s of CPU and
    seconds of event-loop stalls; the limit per step makes it a model error."""
    many = [call("calculator", f"c{i}", expression="1 + 1") for i in range(5)]
    builder = AgentBuilder().with_max_tool_calls_per_step(4)
    run = Run([calls(*many), say("never")], builder)
    state = await run()
    assert state.status is AgentStatus.FAILED
    assert run.tool_runs == []  # none of the five ran
    last = state.last_step_result()
    assert last is not None
    assert last.step.errors[0].error_type is ErrorType.MODEL
    assert last.step.errors[0].message == (
        "the model asked for 5 tool calls in one response; at most 4 are run per step "
        "(max_tool_calls_per_step)"
    )
    exactly = Run([calls(*many[:4]), say("done")], builder)
    assert (await exactly()).status is AgentStatus.COMPLETED
    assert exactly.tool_runs == ["calculator"] * 4


def test_the_tool_call_limit_must_be_positive() -> None:
    builder = AgentBuilder().with_driver(ScriptedDriver([])).with_max_tool_calls_per_step(0)
    with pytest.raises(ValueError, match="max_tool_calls must be at least 1, got 0"):
        builder.build()


async def test_retry_all_retries_model_errors_then_succeeds() -> None:
    turns: list[ScriptedTurn] = [ScriptedFailure(RateLimitError("429")), say("ok")]
    state = await Run(turns, AgentBuilder().with_error_policy(ErrorPolicy.retry_all(1)))()
    assert state.status is AgentStatus.COMPLETED
    assert [r.step.step_type for r in state.step_results()] == [StepType.ERROR, StepType.FINAL]


async def test_retries_run_out() -> None:
    turns: list[ScriptedTurn] = [ScriptedFailure(RateLimitError("429"))] * 3
    state = await Run(turns, AgentBuilder().with_error_policy(ErrorPolicy.retry_all(1)))()
    assert state.status is AgentStatus.FAILED
    assert len(state.step_results()) == 2


def block_weather(state: AgentState) -> AgentState:
    pending = state.pending_tool_call()
    if pending is not None and pending.name == "get_weather":
        return state.with_tool_call_blocked("weather is off limits")
    return state


async def test_hook_blocks_a_tool_call() -> None:
    builder = AgentBuilder().with_hook(HookPoint.BEFORE_TOOL_USE, block_weather)
    run = Run([calls(WEATHER), say("never")], builder)
    state = await run()
    assert run.tool_runs == []
    blocked = run.of(ToolCallBlocked)
    assert len(blocked) == 1
    assert isinstance(blocked[0], ToolCallBlocked)
    assert (blocked[0].tool_call_id, blocked[0].reason) == ("call_w", "weather is off limits")
    assert run.of(ToolCallStarted) == []
    assert state.status is AgentStatus.FAILED
    last = state.last_step_result()
    assert last is not None
    execution = last.step.tool_executions[0]
    assert execution.blocked
    assert last.step.errors[0].message == (
        "tool call 'get_weather' (call_w) was blocked: weather is off limits"
    )


async def test_blocked_call_under_ignore_policy_goes_back_to_the_model() -> None:
    builder = (
        AgentBuilder()
        .with_hook(HookPoint.BEFORE_TOOL_USE, block_weather)
        .with_error_policy(ErrorPolicy.ignore_tool_errors())
    )
    run = Run([calls(WEATHER), calls(MATH), say("fine")], builder)
    state = await run()
    assert state.status is AgentStatus.COMPLETED
    assert run.tool_runs == ["calculator"]
    assert state.messages[2].content.startswith("Error: tool call 'get_weather'")


async def test_hook_changes_a_tool_call_but_not_its_id() -> None:
    def to_bergen(state: AgentState) -> AgentState:
        pending = state.pending_tool_call()
        assert pending is not None
        changed = pending.model_copy(update={"id": "forged", "arguments": {"city": "Bergen"}})
        return state.with_pending_tool_call(changed)

    builder = AgentBuilder().with_hook(HookPoint.BEFORE_TOOL_USE, to_bergen)
    run = Run([calls(WEATHER), say("ok")], builder)
    state = await run()
    tool_message = state.messages[2]
    assert tool_message.tool_call_id == "call_w"
    assert '"city": "Bergen"' in tool_message.content


async def test_hook_prevents_one_stop() -> None:
    prevented: list[StopReason | None] = []

    def one_more(state: AgentState) -> AgentState:
        if prevented:
            return state
        prevented.append(state.stop_reason())
        return state.with_stop_prevented("ask for a summary").with_user_message("Summarize.")

    builder = AgentBuilder().with_hook(HookPoint.BEFORE_STOP, one_more)
    run = Run([say("Answer."), say("Summary.")], builder)
    state = await run()
    assert prevented == [StopReason.COMPLETED]
    assert state.status is AgentStatus.COMPLETED
    assert [m.content for m in state.messages] == [
        "What is the weather in Oslo?",
        "Answer.",
        "Summarize.",
        "Summary.",
    ]
    assert len(state.step_results()) == 2


async def test_hooks_never_revive_a_failed_execution() -> None:
    def revive(state: AgentState) -> AgentState:
        return state.with_status(AgentStatus.IN_PROGRESS).with_stop_prevented("please")

    builder = (
        AgentBuilder()
        .with_hook(HookPoint.STEP_END, revive)
        .with_hook(HookPoint.BEFORE_STOP, revive)
    )
    run = Run([calls(call("calculator", "c", expression="1/0")), say("never")], builder)
    state = await run()
    assert state.status is AgentStatus.FAILED
    assert run.driver.remaining == 1


async def test_hooks_run_by_priority_then_registration() -> None:
    order: list[str] = []

    def hook(label: str):  # type: ignore[no-untyped-def]
        def record(state: AgentState) -> AgentState:
            order.append(label)
            return state

        return record

    builder = (
        AgentBuilder()
        .with_hook("on_execution_start", hook("low"), priority=-1)
        .with_hook("on_execution_start", hook("first-0"))
        .with_hook("on_execution_start", hook("high"), priority=10)
        .with_hook("on_execution_start", hook("second-0"))
    )
    await Run([say("hi")], builder)()
    assert order == ["high", "first-0", "second-0", "low"]


async def test_raising_hook_is_reported_and_skipped() -> None:
    def broken(state: AgentState) -> AgentState:
        raise KeyError("oops")

    run = Run([say("hi")], AgentBuilder().with_hook(HookPoint.STEP_START, broken, name="broken"))
    state = await run()
    assert state.status is AgentStatus.COMPLETED
    reports = [e for e in run.of(HookExecuted) if isinstance(e, HookExecuted)]
    assert [(r.hook, r.success, r.error) for r in reports] == [
        ("broken", False, "hook broken raised KeyError: 'oops'")
    ]


async def test_raising_listeners_do_not_break_the_run() -> None:
    received: list[str] = []

    def sync_broken(event: AgentEvent) -> None:
        raise RuntimeError("listener bug")

    async def async_broken(event: AgentEvent) -> None:
        raise RuntimeError("async listener bug")

    async def async_ok(event: AgentEvent) -> None:
        await asyncio.sleep(0)
        received.append(event.type)

    builder = (
        AgentBuilder()
        .with_listener(sync_broken)
        .with_listener(async_broken)
        .with_listener(async_ok)
    )
    state = await Run([say("hi")], builder)()
    assert state.status is AgentStatus.COMPLETED
    assert received[0] == "agent.execution.started"
    assert received[-1] == "agent.execution.completed"


async def test_criterion_that_raises_before_the_first_step_fails_the_run() -> None:
    def broken(state: AgentState) -> bool:
        raise RuntimeError("bad criterion")

    run = Run([say("never")], AgentBuilder().with_criteria(broken))
    state = await run()
    assert state.status is AgentStatus.FAILED
    assert state.stop_reason() is StopReason.ERROR
    assert state.step_results() == ()
    assert run.driver.remaining == 1


async def test_a_finished_conversation_continues_with_a_fresh_budget() -> None:
    turns = [calls(MATH), say("42"), calls(MATH), say("Still 42.")]
    run = Run(turns, AgentBuilder().with_max_steps(3))
    first = await run()
    assert first.stop_reason() is StopReason.COMPLETED
    second = await run(first.with_user_message("Again?"))
    assert second.status is AgentStatus.COMPLETED
    assert second.stop_reason() is StopReason.COMPLETED
    assert second.final_response() == "Still 42."
    assert second.step_count() == 4
    assert second.execution_step_count() == 2
    assert second.execution.run_count == 2


async def test_an_agent_runs_one_execution_at_a_time() -> None:
    gate = asyncio.Event()

    async def slow_weather(city: str) -> str:
        await gate.wait()
        return "sunny"

    driver = ScriptedDriver([calls(call("slow_weather", "c", city="x")), say("ok")])
    agent = AgentBuilder().with_driver(driver).with_tools(slow_weather).build()
    first = asyncio.create_task(agent.run("go"))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already running an execution"):
        await agent.run("again")
    gate.set()
    assert (await first).status is AgentStatus.COMPLETED


async def test_iterate_yields_each_step_then_the_final_state() -> None:
    run = Run([calls(MATH), say("42")])
    states = [s async for s in run.agent.iterate("compute")]
    assert [s.step_count() for s in states] == [1, 2, 2]
    assert states[-1].status is AgentStatus.COMPLETED


async def test_demo_script_runs_end_to_end() -> None:
    events: list[AgentEvent] = []
    from agent_core.app.demo_tools import demo_tools

    agent = (
        AgentBuilder()
        .with_driver(demo_driver("Weather in Lisbon?"))
        .with_tools(*demo_tools())
        .with_clock(TickingClock(tick=timedelta(milliseconds=5)))
        .with_listener(events.append)
        .build()
    )
    state = await agent.run("Weather in Lisbon?")
    assert state.status is AgentStatus.COMPLETED
    assert state.final_response().startswith("In Lisbon it is ")
    tools = [e.tool_name for e in events if isinstance(e, ToolCallCompleted)]
    assert tools == ["get_weather", "calculator"]


def test_builder_without_a_driver_explains_what_is_missing() -> None:
    with pytest.raises(ValueError, match="AgentBuilder needs a model driver"):
        AgentBuilder().build()
