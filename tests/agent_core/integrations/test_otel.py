"""The OpenTelemetry exporter: a run's envelopes become one trace per execution with
GenAI semantic convention spans (agent, steps, tool calls), read back through the
SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_core.adapters.broadcasting import AdapterOptions, AgentEventAdapter
from agent_core.app.demo_tools import demo_driver, demo_tools
from agent_core.builder import AgentBuilder
from agent_core.integrations.otel import EnvelopeTracer, TracingPublisher, otlp_tracer_provider
from broadcaster import envelope as env
from broadcaster.publishers import RecordingPublisher
from tests.support.framework_runs import RUNS


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return sorted(
        (s for s in finished if s.name.startswith(prefix)), key=lambda s: s.start_time or 0
    )


async def test_an_agent_core_run_becomes_one_genai_trace(spans: Any) -> None:
    provider, exporter = spans
    recording = RecordingPublisher()
    publisher = TracingPublisher(recording, EnvelopeTracer(provider, agent_name="demo"))
    question = "What is the weather in Oslo?"
    options = AdapterOptions(include_continuation_trace=True)
    adapter = AgentEventAdapter(publisher, "o-1", "x-1", options=options)
    builder = AgentBuilder().with_tools(*demo_tools()).with_driver(demo_driver(question))
    await adapter.install(builder).build().run(question)
    await adapter.aclose()
    await publisher.aclose()
    finished = exporter.get_finished_spans()
    envelopes = recording.envelopes()

    (agent,) = by_name(finished, "invoke_agent")
    steps = by_name(finished, "chat step")
    tools = by_name(finished, "execute_tool")
    assert len(finished) == 1 + len(steps) + len(tools)
    assert {s.context.trace_id for s in finished} == {agent.context.trace_id}
    assert agent.name == "invoke_agent demo"
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.conversation.id"] == "o-1"
    assert agent.attributes["agent_broadcaster.execution_id"] == "x-1"
    final = envelopes[-1].payload
    assert isinstance(final, env.StatusPayload)
    assert final.usage is not None
    assert agent.attributes["gen_ai.usage.input_tokens"] == final.usage.prompt
    assert agent.attributes["gen_ai.usage.output_tokens"] == final.usage.completion
    assert agent.attributes["agent_broadcaster.stop_reason"] == final.stop_reason
    assert agent.status.status_code == StatusCode.UNSET

    completed = [e.payload for e in envelopes if isinstance(e, env.StepCompleted)]
    assert [s.attributes["agent_broadcaster.step.number"] for s in steps] == [1, 2, 3]
    for span, step in zip(steps, completed, strict=True):
        assert span.parent is not None
        assert span.parent.span_id == agent.context.span_id
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.usage.input_tokens"] == step.usage.prompt
        assert span.attributes["gen_ai.usage.output_tokens"] == step.usage.completion
        assert span.attributes["gen_ai.response.finish_reasons"] == (step.finish_reason,)
        (decision,) = [e for e in span.events if e.name == "agent.continuation"]
        assert decision.attributes is not None
        should = decision.attributes["agent_broadcaster.continuation.should_continue"]
        assert should is (step.continuation is not None and step.continuation.should_continue)
        assert decision.attributes["agent_broadcaster.continuation.evaluations"]

    started = [e.payload for e in envelopes if isinstance(e, env.ToolStarted)]
    assert [t.attributes["gen_ai.tool.call.id"] for t in tools] == [p.tool_call_id for p in started]
    for span, call in zip(tools, started, strict=True):
        assert span.name == f"execute_tool {call.tool_name}"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.name"] == call.tool_name
        assert "gen_ai.tool.call.arguments" not in span.attributes, "content is opt-in"
        step_span = steps[(call.step_number or 1) - 1]
        assert span.parent is not None
        assert span.parent.span_id == step_span.context.span_id
        assert step_span.start_time <= span.start_time <= span.end_time <= step_span.end_time


@pytest.mark.io
@pytest.mark.parametrize("framework", sorted(RUNS))
async def test_a_framework_run_is_traced_with_its_call_ids_and_content(
    framework: str, spans: Any
) -> None:
    provider, exporter = spans
    tracer = EnvelopeTracer(provider, agent_name=framework, include_content=True)
    await RUNS[framework](tracer, "o-2", execution_id="x-2")
    finished = exporter.get_finished_spans()
    (tool, *_) = by_name(finished, "execute_tool")
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"city":"Oslo"}'
    assert tool.attributes["gen_ai.tool.call.result"] == "sunny in Oslo"
    assert len(by_name(finished, "invoke_agent")) == 1
    assert tracer.stats.published > 0


async def test_a_failed_run_and_a_failed_tool_are_error_spans(spans: Any) -> None:
    provider, exporter = spans
    tracer = EnvelopeTracer(provider)
    ids = {"session_id": "o-3", "execution_id": "x-3"}
    for envelope in [
        env.AgentStatus(**ids, payload=env.StatusPayload(status="in_progress")),
        env.StepStarted(**ids, payload=env.StepStartedPayload(step_number=1)),
        env.ToolStarted(**ids, payload=env.ToolStartedPayload(tool_name="t", tool_call_id="c")),
        env.ToolCompleted(
            **ids,
            payload=env.ToolCompletedPayload(
                tool_name="t", tool_call_id="c", success=False, error="boom", duration_ms=2
            ),
        ),
        env.AgentStatus(
            **ids,
            payload=env.StatusPayload(
                status="failed", error_message="gave up", stop_reason="error"
            ),
        ),
    ]:
        tracer.feed(envelope)
    finished = exporter.get_finished_spans()
    (tool,) = by_name(finished, "execute_tool")
    (agent,) = by_name(finished, "invoke_agent")
    (step,) = by_name(finished, "chat step")
    assert (tool.status.status_code, tool.status.description) == (StatusCode.ERROR, "boom")
    assert (agent.status.status_code, agent.status.description) == (StatusCode.ERROR, "gave up")
    assert agent.attributes["error.type"] == "error"
    assert step.end_time is not None, "the open step is ended with the run"


async def test_closing_ends_the_trace_of_a_run_whose_final_status_was_lost(spans: Any) -> None:
    provider, exporter = spans
    tracer = EnvelopeTracer(provider)
    ids = {"session_id": "o-4", "execution_id": "x-4"}
    tracer.feed(env.AgentStatus(**ids, payload=env.StatusPayload(status="in_progress")))
    tracer.feed(env.StepStarted(**ids, payload=env.StepStartedPayload(step_number=1)))
    assert exporter.get_finished_spans() == ()
    await tracer.aclose()
    finished = exporter.get_finished_spans()
    assert len(finished) == 2
    (agent,) = by_name(finished, "invoke_agent")
    assert agent.attributes["error.type"] == "lost"


def test_the_otlp_provider_reads_the_collector_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    provider = otlp_tracer_provider("agents-under-test")
    try:
        assert provider.resource.attributes["service.name"] == "agents-under-test"
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    "stamp", ["1969-12-31T23:59:59.999Z", "2600-01-01T00:00:00.000Z", "2026-13-45T10:05:00.000Z"]
)
def test_envelopes_whose_time_otlp_cannot_hold_are_left_out_of_the_export(stamp: str) -> None:
    """Unsigned 64-bit nanoseconds since 1970 end in 2554: such a time (or no date at
    all) raised, and the trace download answered 500."""
    from agent_core.integrations.otel import otlp_json

    base = {"session_id": "o-1", "execution_id": "x-1"}
    good = "2026-01-16T10:05:00.000Z"
    envelopes = [
        {**base, "type": "agent.status", "timestamp": good, "payload": {"status": "in_progress"}},
        {**base, "type": "agent.step.started", "timestamp": stamp, "payload": {"step_number": 1}},
        {**base, "type": "agent.status", "timestamp": good, "payload": {"status": "completed"}},
    ]
    document = otlp_json(envelopes)
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [span["name"] for span in spans] == ["invoke_agent agent"]
