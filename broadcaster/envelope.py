"""The agent event envelope: the one stable wire format for agent events.

Every agent lifecycle event reaches ``agent.<session>`` subscribers as
``{type, session_id, execution_id, timestamp, payload}`` (docs/protocol.md), carried as the
Pusher event ``data`` with the Pusher event name equal to ``type``. The JSON Schema
generated from these models is published in ``schemas/`` (see :func:`json_schema`) and
versioned by :data:`SCHEMA_VERSION`; a test keeps the file current.

This module is a client-side piece: publishers (and ``agent_core``'s adapter) build
envelopes with it; the server only moves their bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

__all__ = [
    "EARLIEST_TIMESTAMP",
    "ENVELOPE_TYPES",
    "LATEST_TIMESTAMP",
    "MAX_WIRE_INT",
    "ROUTING_PHASES",
    "SCHEMA_FILE",
    "SCHEMA_VERSION",
    "AgentContinuation",
    "AgentStatus",
    "ContinuationEvaluationPayload",
    "ContinuationPayload",
    "ContinuationSummary",
    "Envelope",
    "StatusPayload",
    "StepCompleted",
    "StepCompletedPayload",
    "StepStarted",
    "StepStartedPayload",
    "StreamChunk",
    "StreamChunkPayload",
    "ToolCallRef",
    "ToolCompleted",
    "ToolCompletedPayload",
    "ToolStarted",
    "ToolStartedPayload",
    "UsagePayload",
    "channel_for",
    "json_schema",
    "parse_envelope",
    "run_usage",
    "utc_timestamp",
    "wire_int",
    "wire_safe",
]

SCHEMA_VERSION = "1.2.0"
"""1.1.0 added ``agent.tool.started`` ``arguments``; 1.2.0 ``parent_execution_id`` and
``parent_tool_call_id`` on every payload (a nested run's link; optional, additive)."""
SCHEMA_FILE = "schemas/agent-envelope.v1.schema.json"
ROUTING_PHASES = frozenset(
    {"reference_resolver", "intent_classifier", "continuation_decider", "session_memory"}
)
"""The tool names of a routed run's phases: published as ``agent.tool.started`` /
``agent.tool.completed`` pairs, but not tool calls of the agent. Every surface counts
and shows them apart from the run's tool calls (``routing_phases`` in the run index,
``routing`` in a step of the kits' ``RunView``, ``CUSTOM agent.routing`` in AG-UI,
``data-routing`` in the Vercel AI stream, ``routing <phase>`` spans in OpenTelemetry)."""
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")

MAX_WIRE_INT = 2**53 - 1
"""The largest count or duration an envelope (or a stored state) carries: the largest
integer JavaScript reads exactly (``Number.MAX_SAFE_INTEGER``). Counts from outside (a
model's usage, a framework's) are clamped to it where they enter (:func:`wire_int`);
beyond 64 bits orjson could not even write them, and a run's final status was lost."""
EARLIEST_TIMESTAMP = "1970-01-01T00:00:00.000Z"
LATEST_TIMESTAMP = "2554-07-21T23:34:33.709Z"
"""The range of an envelope's ``timestamp``: what OTLP's unsigned 64-bit nanoseconds
since 1970 hold (:mod:`agent_core.integrations.otel` exports runs as OTLP)."""


def wire_int(value: int) -> int:
    """``value`` clamped to ``0 ..`` :data:`MAX_WIRE_INT` (a count from outside: a
    model's token usage, a framework's)."""
    return min(max(value, 0), MAX_WIRE_INT)


def wire_safe(value: Any) -> tuple[Any, list[str]]:
    """``value`` (JSON-like: dicts, lists, str, numbers) with what JSON cannot carry
    exactly replaced, and where each replacement is (``messages[3].content``): integers
    past ``±MAX_WIRE_INT`` clamped, infinite or NaN floats null, lone surrogates (which
    are not UTF-8) U+FFFD. What could not be encoded as it was (a run's final state or
    status) is kept this way, and said to be failed because of it."""
    where: list[str] = []

    def clean(item: Any, path: str) -> Any:
        if isinstance(item, bool) or item is None:
            return item
        if isinstance(item, int):
            if -MAX_WIRE_INT <= item <= MAX_WIRE_INT:
                return item
            where.append(path or "the value")
            return MAX_WIRE_INT if item > 0 else -MAX_WIRE_INT
        if isinstance(item, float):
            if math.isfinite(item):
                return item
            where.append(path or "the value")
            return None
        if isinstance(item, str):
            if item.isascii():
                return item
            text = item.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            if text != item:
                where.append(path or "the value")
            return text
        if isinstance(item, Mapping):
            return {
                (key := clean(str(k), path)): clean(v, f"{path}.{key}" if path else key)
                for k, v in item.items()
            }
        if isinstance(item, list | tuple):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(item)]
        return item  # orjson's own kinds (datetime, UUID, ...) or its error

    return clean(value, ""), where


Count = Annotated[int, Field(ge=0, le=MAX_WIRE_INT)]
"""A count on the wire: never negative, never past :data:`MAX_WIRE_INT`."""
StepNumber = Annotated[int, Field(ge=1, le=MAX_WIRE_INT)]
Millis = Annotated[float, Field(ge=0, le=MAX_WIRE_INT)]
"""A duration in milliseconds (finite: no infinity, which JSON cannot write)."""


def utc_timestamp(moment: datetime | None = None) -> str:
    """``moment`` (default: now) as UTC with millisecond precision and a ``Z``."""
    moment = (moment or datetime.now(UTC)).astimezone(UTC)
    # isoformat: faster than strftime, and four-digit years below 1000 too ("+00:00" cut)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


def channel_for(session_id: str) -> str:
    """The public channel of a session: ``agent.<session>``."""
    return f"agent.{session_id}"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- payloads ------------------------------------------------------------------------


def _absent(value: object) -> bool:
    return value is None


class _Payload(_Model):
    """What every payload may carry: the link of a nested run to its parent (left out
    of the JSON when absent, so a top-level run's envelopes are as they were)."""

    parent_execution_id: str | None = Field(
        default=None,
        exclude_if=_absent,
        min_length=1,
        max_length=128,
        description=(
            "Set on the envelopes of a nested run (a routed capability's inner agent): "
            "the execution id of the run it runs inside. Absent on a top-level run."
        ),
    )
    parent_tool_call_id: str | None = Field(
        default=None,
        exclude_if=_absent,
        min_length=1,
        description="With parent_execution_id: the parent's tool call the nested run serves.",
    )


class UsagePayload(_Model):
    prompt: Count = 0
    completion: Count = 0
    total: Count = 0


def run_usage(steps: list[UsagePayload], reported: UsagePayload | None) -> UsagePayload | None:
    """A run's own tokens: the sum of its ``agent.step.completed`` usage, or, when no
    step reported any (a framework that reports usage at the end only), ``reported``,
    the final status's. An ``agent_core`` run's final status counts its session's
    tokens (a second run's include the first's), so the sum is what every surface shows
    as the run's tokens (the run index, AG-UI, the Vercel AI stream, OpenTelemetry)."""
    if not any(usage.total or usage.prompt or usage.completion for usage in steps):
        return reported
    return UsagePayload(
        prompt=sum(u.prompt for u in steps),
        completion=sum(u.completion for u in steps),
        total=sum(u.total for u in steps),
    )


class StatusPayload(_Payload):
    """``agent.status``: the run's overall status changed."""

    status: Literal["pending", "in_progress", "completed", "failed"]
    step_count: Count = 0
    error_message: str | None = None
    last_response: str | None = None
    stop_reason: str | None = None
    usage: UsagePayload | None = None
    state_url: str | None = Field(
        default=None,
        description="Where the final slim snapshot can be fetched (set on completion).",
    )


class StepStartedPayload(_Payload):
    """``agent.step.started``."""

    step_number: StepNumber
    message_count: Count = 0
    available_tools: list[str] = Field(default_factory=list)
    actor: str | None = Field(
        default=None,
        description="Who acts in this step (chat participant, collaborator); null for an agent.",
    )


class ContinuationSummary(_Model):
    should_continue: bool
    stop_reason: str | None = None
    resolved_by: str


class ToolCallRef(_Model):
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)


class StepCompletedPayload(_Payload):
    """``agent.step.completed`` (``continuation`` when the trace is enabled)."""

    step_number: StepNumber
    has_tool_calls: bool
    errors: Count = 0
    finish_reason: str | None = None
    usage: UsagePayload = UsagePayload()
    duration_ms: Millis
    tool_calls: list[ToolCallRef] = Field(default_factory=list)
    continuation: ContinuationSummary | None = None


class ToolStartedPayload(_Payload):
    """``agent.tool.started``."""

    tool_name: str = Field(min_length=1)
    tool_call_id: str = Field(min_length=1)
    args_summary: str = ""
    step_number: StepNumber | None = None
    arguments: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The call's full arguments; null when the publisher redacts them or their JSON "
            "is longer than its max_arguments_bytes (8,192 by default; args_summary stays)."
        ),
    )


class ToolCompletedPayload(_Payload):
    """``agent.tool.completed``."""

    tool_name: str = Field(min_length=1)
    tool_call_id: str = Field(min_length=1)
    success: bool
    error: str | None = None
    duration_ms: Millis
    result_summary: str | None = None
    step_number: StepNumber | None = None


class StreamChunkPayload(_Payload):
    """``agent.stream.chunk``: coalesced streamed text."""

    chunk: str
    is_complete: bool = False
    tokens_delta: Count = 0
    chunk_index: Count = 0
    step_number: StepNumber | None = None


class ContinuationEvaluationPayload(_Model):
    criterion: str
    decision: Literal["forbid", "allow", "request", "stop"]
    reason: str
    stop_reason: str | None = None


class ContinuationPayload(_Payload):
    """``agent.continuation``: the full decision for one step (debugging trace)."""

    step_number: Count
    should_continue: bool
    stop_reason: str | None = None
    resolved_by: str
    evaluations: list[ContinuationEvaluationPayload]


# --- envelopes -----------------------------------------------------------------------


class _Envelope(_Model):
    session_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-=@,.;]+$")
    execution_id: str = Field(min_length=1, max_length=128)
    timestamp: str = Field(
        default_factory=utc_timestamp,
        description="UTC, millisecond precision, Z suffix: 2026-01-16T10:05:00.123Z",
        pattern=_TIMESTAMP.pattern,
    )

    @field_validator("timestamp")
    @classmethod
    def _utc_millis(cls, value: str) -> str:
        if not _TIMESTAMP.fullmatch(value):
            raise ValueError(f"timestamp {value!r} is not UTC with milliseconds and Z")
        try:
            datetime.fromisoformat(value[:-1])
        except ValueError:
            raise ValueError(f"timestamp {value!r} is not a date and time") from None
        # Same-width ISO texts compare as the moments they name.
        if not EARLIEST_TIMESTAMP <= value <= LATEST_TIMESTAMP:
            raise ValueError(
                f"timestamp {value!r} is out of range: {EARLIEST_TIMESTAMP} to "
                f"{LATEST_TIMESTAMP} (what OTLP's 64-bit nanoseconds hold)"
            )
        return value

    @property
    def channel(self) -> str:
        return channel_for(self.session_id)

    def to_json(self) -> bytes:
        """The envelope as compact JSON bytes (what a publication carries as data)."""
        return orjson.dumps(self.model_dump(mode="json"))


class AgentStatus(_Envelope):
    type: Literal["agent.status"] = "agent.status"
    payload: StatusPayload


class StepStarted(_Envelope):
    type: Literal["agent.step.started"] = "agent.step.started"
    payload: StepStartedPayload


class StepCompleted(_Envelope):
    type: Literal["agent.step.completed"] = "agent.step.completed"
    payload: StepCompletedPayload


class ToolStarted(_Envelope):
    type: Literal["agent.tool.started"] = "agent.tool.started"
    payload: ToolStartedPayload


class ToolCompleted(_Envelope):
    type: Literal["agent.tool.completed"] = "agent.tool.completed"
    payload: ToolCompletedPayload


class StreamChunk(_Envelope):
    type: Literal["agent.stream.chunk"] = "agent.stream.chunk"
    payload: StreamChunkPayload


class AgentContinuation(_Envelope):
    type: Literal["agent.continuation"] = "agent.continuation"
    payload: ContinuationPayload


Envelope = Annotated[
    AgentStatus
    | StepStarted
    | StepCompleted
    | ToolStarted
    | ToolCompleted
    | StreamChunk
    | AgentContinuation,
    Field(discriminator="type"),
]
ENVELOPE_TYPES = (
    "agent.status",
    "agent.step.started",
    "agent.step.completed",
    "agent.tool.started",
    "agent.tool.completed",
    "agent.stream.chunk",
    "agent.continuation",
)
_ADAPTER: TypeAdapter[Envelope] = TypeAdapter(Envelope)


def parse_envelope(data: str | bytes | dict[str, Any]) -> Envelope:
    """Validate an envelope from JSON text or a dict.

    Raises:
        pydantic.ValidationError: naming the field that is wrong.
    """
    if isinstance(data, dict):
        return _ADAPTER.validate_python(data)
    return _ADAPTER.validate_json(data)


def json_schema() -> dict[str, Any]:
    """The published JSON Schema (draft 2020-12) of the envelope union."""
    schema = _ADAPTER.json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:agent-broadcaster:agent-envelope:{SCHEMA_VERSION}",
        "title": "Agent event envelope",
        "description": (
            "One agent lifecycle event on channel agent.<session_id>, carried as the "
            "Pusher event data; the Pusher event name equals `type`."
        ),
        "version": SCHEMA_VERSION,
        **schema,
    }


if __name__ == "__main__":  # python -m broadcaster.envelope > schemas/...json
    print(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
