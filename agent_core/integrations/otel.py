"""OpenTelemetry out: a run's envelopes as a trace, following the GenAI semantic
conventions (``gen_ai.*``).

``pip install agent-broadcaster[otel]``. :class:`EnvelopeTracer` is a
:class:`~broadcaster.publishers.Publisher` (give it to an adapter, or wrap the real
publisher with :class:`TracingPublisher`) that turns each execution into:

- an agent span ``invoke_agent <agent>`` (``gen_ai.operation.name`` ``invoke_agent``,
  ``gen_ai.agent.name``, ``gen_ai.conversation.id`` = the session), ended by the final
  ``agent.status`` with the run's usage (``gen_ai.usage.input_tokens`` /
  ``output_tokens``), its stop reason and, on failure, an error status;
- a span per step ``chat step <n>`` (``gen_ai.operation.name`` ``chat``, the step's
  usage, ``gen_ai.response.finish_reasons``, the actor as ``gen_ai.agent.name``);
- a span per tool call ``execute_tool <tool>`` (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; with ``include_content``, the
  arguments and result as ``gen_ai.tool.call.arguments`` / ``.result``);
- a span per phase of a routed run ``routing <phase>`` (``agent_broadcaster.routing.phase``
  and ``.call_id``: the classifier, decider and memory are not tool calls);
- continuation decisions as ``agent.continuation`` span events on the step span;
- a run nested in another (a routed capability's inner agent, ``parent_execution_id``)
  as an agent span ``invoke_agent <capability>`` under the capability's
  ``execute_tool`` span, in the same trace.

The agent span's usage is the run's own (the sum of its steps'; the final status's
only when no step reported usage), so a session's second run does not count the first.

Spans take their times from the envelopes' timestamps, so a trace can also be built
after the fact from a channel's history. Send it to a collector with
:func:`otlp_tracer_provider` (OTLP over HTTP; ``OTEL_EXPORTER_OTLP_ENDPOINT``, e.g.
``http://localhost:4318``)::

    tracer = EnvelopeTracer(otlp_tracer_provider("my-agents"))
    publisher = TracingPublisher(PusherHTTPPublisher(url, "1", key, secret), tracer)
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self

import orjson

from agent_core.integrations._extras import missing_extra

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(exc, "otel", __name__) from None

from broadcaster import envelope as env
from broadcaster.publishers import Publisher, PublisherStats

__all__ = ["EnvelopeTracer", "TracingPublisher", "otlp_json", "otlp_tracer_provider"]

SYSTEM = "agent_broadcaster"
"""The prefix of the attributes the GenAI conventions have no name for."""


def otlp_tracer_provider(service_name: str = "agent-broadcaster") -> TracerProvider:
    """A tracer provider exporting over OTLP/HTTP in batches; the collector's address
    and headers come from the standard ``OTEL_EXPORTER_OTLP_*`` environment."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def _ns(timestamp: str) -> int:
    moment = datetime.strptime(timestamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return int(moment.timestamp() * 1_000_000) * 1000


@dataclass
class _Execution:
    agent: Span
    steps: dict[int, Span] = field(default_factory=dict)
    tools: dict[str, Span] = field(default_factory=dict)
    tool_names: dict[str, str] = field(default_factory=dict)
    traced: set[int] = field(default_factory=set)
    usage: list[env.UsagePayload] = field(default_factory=list)
    step: int | None = None


class EnvelopeTracer:
    """Turns envelopes into spans, one trace per execution.

    Args:
        provider: the tracer provider (default: the global one).
        agent_name: ``gen_ai.agent.name`` of the agent spans.
        include_content: put tool arguments and results on the tool spans (they may
            hold personal data: off by default, as the conventions advise).
    """

    def __init__(
        self,
        provider: trace.TracerProvider | None = None,
        *,
        agent_name: str = "agent",
        include_content: bool = False,
    ) -> None:
        self.tracer = trace.get_tracer("agent_core.integrations.otel", tracer_provider=provider)
        self.agent_name = agent_name
        self.include_content = include_content
        self.stats = PublisherStats()
        self.never_waits = True  # broadcast() only traces (see Publisher)
        self._runs: dict[str, _Execution] = {}

    async def broadcast(self, channel: str, envelope: env.Envelope) -> None:
        """The :class:`Publisher` interface: trace ``envelope``."""
        self.feed(envelope)
        self.stats.published += 1

    async def aclose(self) -> None:
        """End the spans of executions that never ended (their status was lost)."""
        for execution_id in list(self._runs):
            self._close(execution_id, None, error="the run's final status was not seen")

    def feed(self, envelope: env.Envelope) -> None:
        """Add ``envelope`` to its execution's trace."""
        at = _ns(envelope.timestamp)
        run = self._runs.get(envelope.execution_id)
        if run is None:
            run = self._open(envelope, at)
        match envelope:
            case env.AgentStatus():
                if envelope.payload.status in ("completed", "failed"):
                    self._close(envelope.execution_id, envelope.payload, at=at)
            case env.StepStarted():
                self._step_started(run, envelope.payload, at)
            case env.StepCompleted():
                self._step_completed(run, envelope.payload, at)
            case env.ToolStarted():
                self._tool_started(run, envelope.payload, at)
            case env.ToolCompleted():
                self._tool_completed(run, envelope.payload, at)
            case env.AgentContinuation():
                self._decision(run, envelope.payload.step_number, envelope.payload, at)
            case env.StreamChunk():
                pass  # text is not traced (content); its step span covers it

    def _open(self, envelope: env.Envelope, at: int) -> _Execution:
        name, context = self.agent_name, None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": envelope.session_id,
            f"{SYSTEM}.execution_id": envelope.execution_id,
            f"{SYSTEM}.channel": envelope.channel,
        }
        parent, call = envelope.payload.parent_execution_id, envelope.payload.parent_tool_call_id
        parent_run = None if parent is None else self._runs.get(parent)
        if parent_run is not None and call is not None and call in parent_run.tools:
            # A nested run: under the call it serves, in its parent's trace.
            name = parent_run.tool_names.get(call, name)
            context = trace.set_span_in_context(parent_run.tools[call])
            attributes[f"{SYSTEM}.parent_execution_id"] = parent
            attributes[f"{SYSTEM}.parent_tool_call_id"] = call
        attributes["gen_ai.agent.name"] = name
        span = self.tracer.start_span(
            f"invoke_agent {name}",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=at,
        )
        run = _Execution(span)
        self._runs[envelope.execution_id] = run
        return run

    def _child(self, run: _Execution, name: str, at: int, attributes: dict[str, Any]) -> Span:
        parent = run.agent
        if run.step is not None and run.step in run.steps:
            parent = run.steps[run.step]
        return self.tracer.start_span(
            name,
            context=trace.set_span_in_context(parent),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=at,
        )

    def _step_started(self, run: _Execution, payload: env.StepStartedPayload, at: int) -> None:
        number = payload.step_number
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            f"{SYSTEM}.step.number": number,
            f"{SYSTEM}.step.available_tools": list(payload.available_tools),
        }
        if payload.actor is not None:
            attributes["gen_ai.agent.name"] = payload.actor
        run.step = None  # a step's parent is the agent span
        run.steps[number] = self._child(run, f"chat step {number}", at, attributes)
        run.step = number

    def _step_completed(self, run: _Execution, payload: env.StepCompletedPayload, at: int) -> None:
        span = run.steps.pop(payload.step_number, None)
        if span is None:
            return
        usage = payload.usage
        run.usage.append(usage)
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion)
        if payload.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [payload.finish_reason])
        span.set_attribute(f"{SYSTEM}.step.tool_call_ids", [c.id for c in payload.tool_calls])
        if payload.errors:
            span.set_attribute(f"{SYSTEM}.step.errors", payload.errors)
        if payload.continuation is not None and payload.step_number not in run.traced:
            self._decision(run, payload.step_number, payload.continuation, at)
        span.end(end_time=at)
        if run.step == payload.step_number:
            run.step = None

    def _tool_started(self, run: _Execution, payload: env.ToolStartedPayload, at: int) -> None:
        attributes: dict[str, Any]
        if payload.tool_name in env.ROUTING_PHASES:
            name = f"routing {payload.tool_name}"
            attributes = {
                f"{SYSTEM}.routing.phase": payload.tool_name,
                f"{SYSTEM}.routing.call_id": payload.tool_call_id,
            }
        else:
            name = f"execute_tool {payload.tool_name}"
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": payload.tool_name,
                "gen_ai.tool.call.id": payload.tool_call_id,
                "gen_ai.tool.type": "function",
            }
        if self.include_content and payload.arguments is not None:
            arguments = orjson.dumps(payload.arguments, default=str).decode()
            attributes["gen_ai.tool.call.arguments"] = arguments
        run.tools[payload.tool_call_id] = self._child(run, name, at, attributes)
        run.tool_names[payload.tool_call_id] = payload.tool_name

    def _tool_completed(self, run: _Execution, payload: env.ToolCompletedPayload, at: int) -> None:
        span = run.tools.pop(payload.tool_call_id, None)
        if span is None:  # a completion without its start: a zero-length span
            self._tool_started(run, _started_of(payload), at)
            span = run.tools.pop(payload.tool_call_id)
        span.set_attribute(f"{SYSTEM}.tool.duration_ms", payload.duration_ms)
        if self.include_content and payload.result_summary is not None:
            span.set_attribute("gen_ai.tool.call.result", payload.result_summary)
        if not payload.success:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, payload.error or "the tool failed"))
        span.end(end_time=at)

    def _decision(
        self,
        run: _Execution,
        step_number: int,
        decision: env.ContinuationPayload | env.ContinuationSummary,
        at: int,
    ) -> None:
        attributes: dict[str, Any] = {
            f"{SYSTEM}.continuation.should_continue": decision.should_continue,
            f"{SYSTEM}.continuation.resolved_by": decision.resolved_by,
            f"{SYSTEM}.continuation.step_number": step_number,
        }
        if decision.stop_reason is not None:
            attributes[f"{SYSTEM}.continuation.stop_reason"] = decision.stop_reason
        if isinstance(decision, env.ContinuationPayload):
            run.traced.add(step_number)
            attributes[f"{SYSTEM}.continuation.evaluations"] = [
                f"{e.criterion}: {e.decision}" for e in decision.evaluations
            ]
        span = run.steps.get(step_number, run.agent)
        span.add_event("agent.continuation", attributes=attributes, timestamp=at)

    def _close(
        self,
        execution_id: str,
        payload: env.StatusPayload | None,
        *,
        at: int | None = None,
        error: str | None = None,
    ) -> None:
        run = self._runs.pop(execution_id, None)
        if run is None:
            return
        for span in [*run.tools.values(), *run.steps.values()]:
            span.end(end_time=at)
        span = run.agent
        if payload is not None:
            span.set_attribute(f"{SYSTEM}.status", payload.status)
            span.set_attribute(f"{SYSTEM}.step_count", payload.step_count)
            if payload.stop_reason is not None:
                span.set_attribute(f"{SYSTEM}.stop_reason", payload.stop_reason)
                span.set_attribute("gen_ai.response.finish_reasons", [payload.stop_reason])
            usage = env.run_usage(run.usage, payload.usage)
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.prompt)
                span.set_attribute("gen_ai.usage.output_tokens", usage.completion)
            if payload.status == "failed":
                error = payload.error_message or "the run failed"
        if error is not None:
            kind = "lost" if payload is None else (payload.stop_reason or "error")
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=at)


def _started_of(payload: env.ToolCompletedPayload) -> env.ToolStartedPayload:
    return env.ToolStartedPayload(
        tool_name=payload.tool_name,
        tool_call_id=payload.tool_call_id,
        step_number=payload.step_number,
    )


class TracingPublisher:
    """Publishes through ``publisher`` and traces every envelope with ``tracer``.

    Args:
        publisher: the real publisher.
        tracer: the envelope tracer.
    """

    def __init__(self, publisher: Publisher, tracer: EnvelopeTracer) -> None:
        self.publisher = publisher
        self.tracer = tracer
        self.stats = publisher.stats
        # Waits exactly when the real publisher does (tracing itself never waits).
        self.never_waits = bool(getattr(publisher, "never_waits", False))

    async def broadcast(self, channel: str, envelope: env.Envelope) -> None:
        """Trace ``envelope``, then publish it."""
        try:
            self.tracer.feed(envelope)
        except Exception:  # tracing must never cost the audience an envelope
            self.tracer.stats.dropped += 1
        await self.publisher.broadcast(channel, envelope)

    async def flush(self, within: float | None = None) -> bool:
        """Wait until the publisher delivered its buffer (True at once when it has none)."""
        flush = getattr(self.publisher, "flush", None)
        return True if flush is None else bool(await flush(within))

    async def aclose(self) -> None:
        """Close the publisher and end what the tracer still has open."""
        await self.tracer.aclose()
        await self.publisher.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """End what the tracer has open, deliver and close the publisher."""
        await self.aclose()


def otlp_json(
    envelopes: Sequence[Mapping[str, Any]], service_name: str = "agent-broadcaster"
) -> dict[str, Any]:
    """A run's envelopes (decoded JSON, in order) as one OTLP/JSON document
    (``{"resourceSpans": [...]}``, ids in hex and enums as integers, as OTLP/JSON
    wants), through the same mapping as :class:`EnvelopeTracer`: what
    ``GET /api/sessions/{id}/trace?format=otlp`` serves. Envelopes that are not valid
    are left out."""
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = EnvelopeTracer(provider)
    for data in envelopes:
        try:
            envelope = env.parse_envelope(dict(data))
        except ValueError:
            continue
        tracer.feed(envelope)
    for execution_id in list(tracer._runs):
        tracer._close(execution_id, None, error="the run's final status is not in its trace")
    provider.shutdown()
    spans = encode_spans(exporter.get_finished_spans())
    # OTLP/JSON: enums are integers, never names (span kinds, status codes).
    document: dict[str, Any] = MessageToDict(spans, use_integers_for_enums=True)
    for resource in document.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                for name in ("traceId", "spanId", "parentSpanId"):
                    if span.get(name):
                        span[name] = base64.b64decode(span[name]).hex()
    return document
