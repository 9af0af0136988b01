"""The envelope models and their published JSON Schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import jsonschema
import orjson
import pytest
from pydantic import ValidationError

from broadcaster.envelope import (
    ENVELOPE_TYPES,
    LATEST_TIMESTAMP,
    MAX_WIRE_INT,
    SCHEMA_FILE,
    AgentStatus,
    StatusPayload,
    UsagePayload,
    json_schema,
    parse_envelope,
    run_usage,
    utc_timestamp,
    wire_int,
    wire_safe,
)
from tests.support.processes import REPO

BASE = {"session_id": "s-1", "execution_id": "e-1", "timestamp": "2026-01-16T10:05:00.123Z"}
PAYLOADS: dict[str, dict[str, Any]] = {
    "agent.status": {"status": "completed", "step_count": 3, "state_url": "/api/x"},
    "agent.step.started": {"step_number": 2, "message_count": 5, "available_tools": ["a"]},
    "agent.step.completed": {
        "step_number": 2,
        "has_tool_calls": True,
        "errors": 0,
        "finish_reason": "tool_calls",
        "usage": {"prompt": 500, "completion": 150, "total": 650},
        "duration_ms": 1250.5,
        "tool_calls": [{"id": "call_1", "name": "add"}],
        "continuation": {
            "should_continue": True,
            "stop_reason": None,
            "resolved_by": "ToolCallPresenceCheck",
        },
    },
    "agent.tool.started": {"tool_name": "add", "tool_call_id": "call_1", "args_summary": "a: 1"},
    "agent.tool.completed": {
        "tool_name": "add",
        "tool_call_id": "call_1",
        "success": True,
        "error": None,
        "duration_ms": 0.4,
        "result_summary": "3",
    },
    "agent.stream.chunk": {"chunk": "Hello", "is_complete": False, "tokens_delta": 1},
    "agent.continuation": {
        "step_number": 2,
        "should_continue": False,
        "stop_reason": "steps_limit",
        "resolved_by": "StepsLimit",
        "evaluations": [
            {"criterion": "StepsLimit", "decision": "forbid", "reason": "step 20 reached 20"},
            {"criterion": "ToolCallPresenceCheck", "decision": "request", "reason": "tools"},
        ],
    },
}


def test_published_schema_file_is_current() -> None:
    """Regenerate with: python -m broadcaster.envelope > schemas/agent-envelope.v1.schema.json"""
    on_disk = json.loads((REPO / SCHEMA_FILE).read_text())
    assert on_disk == json_schema()


def test_every_type_has_an_example() -> None:
    assert set(PAYLOADS) == set(ENVELOPE_TYPES)


@pytest.mark.parametrize("kind", ENVELOPE_TYPES)
def test_each_type_round_trips_and_validates_against_the_schema(kind: str) -> None:
    raw = {"type": kind, **BASE, "payload": PAYLOADS[kind]}
    envelope = parse_envelope(orjson.dumps(raw))
    assert envelope.type == kind
    encoded = orjson.loads(envelope.to_json())
    jsonschema.validate(encoded, json_schema())
    assert parse_envelope(encoded) == envelope


def test_unknown_type_is_rejected_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"agent\.bogus"):
        parse_envelope({"type": "agent.bogus", **BASE, "payload": {}})


@pytest.mark.parametrize(
    "stamp", ["2026-01-16T10:05:00Z", "2026-01-16T10:05:00.123+00:00", "2026-01-16 10:05:00.123Z"]
)
def test_timestamps_must_be_utc_milliseconds_z(stamp: str) -> None:
    with pytest.raises(ValidationError, match="timestamp"):
        AgentStatus(**{**BASE, "timestamp": stamp}, payload=StatusPayload(status="completed"))


def test_utc_timestamp_converts_to_utc_and_truncates_to_milliseconds() -> None:
    moment = datetime(2026, 1, 16, 12, 5, 0, 123999, tzinfo=timezone(timedelta(hours=2)))
    assert utc_timestamp(moment) == "2026-01-16T10:05:00.123Z"
    assert utc_timestamp().endswith("Z")
    assert datetime.fromisoformat(utc_timestamp().replace("Z", "+00:00")).tzinfo == UTC


def test_utc_timestamp_keeps_four_digit_years_and_whole_seconds() -> None:
    # strftime's %Y gave "1-01-01...", which the envelope's timestamp pattern refuses.
    assert utc_timestamp(datetime(1, 2, 3, 4, 5, 6, tzinfo=UTC)) == "0001-02-03T04:05:06.000Z"
    assert utc_timestamp(datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == (
        "0999-12-31T23:59:59.999Z"
    )


def test_tool_call_ids_cannot_be_empty() -> None:
    payload = {**PAYLOADS["agent.tool.started"], "tool_call_id": ""}
    with pytest.raises(ValidationError, match="tool_call_id"):
        parse_envelope({"type": "agent.tool.started", **BASE, "payload": payload})


def test_schema_rejects_what_the_models_reject() -> None:
    bad = {"type": "agent.status", **BASE, "payload": {"status": "exploded"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json_schema())


def test_a_runs_usage_is_its_steps_sum_else_what_its_final_status_reported() -> None:
    steps = [UsagePayload(prompt=10, completion=2, total=12), UsagePayload(total=5)]
    session = UsagePayload(prompt=100, completion=20, total=120)
    assert run_usage(steps, session) == UsagePayload(prompt=10, completion=2, total=17)
    # A framework that reports usage at the end only: its final status's.
    assert run_usage([UsagePayload()], session) == session
    assert run_usage([], None) is None


# -- hostile numbers (issue 44) --------------------------------------------------------


OUT_OF_RANGE = ["1969-12-31T23:59:59.999Z", "2554-07-21T23:34:33.710Z", "9999-12-31T23:59:59.999Z"]
NOT_A_DATE = ["0000-01-01T00:00:00.000Z", "2026-13-45T10:05:00.000Z", "2026-02-30T10:05:00.000Z"]


@pytest.mark.parametrize("stamp", [*OUT_OF_RANGE, *NOT_A_DATE])
def test_timestamps_otlp_cannot_hold_are_refused(stamp: str) -> None:
    """Before 1970 or past 2554 (unsigned 64-bit nanoseconds), or no date at all: the
    OTLP export answered 500 for such an envelope."""
    with pytest.raises(ValidationError, match="timestamp"):
        parse_envelope({"type": "agent.status", **BASE, "timestamp": stamp, "payload": {}})


@pytest.mark.parametrize("stamp", ["1970-01-01T00:00:00.000Z", LATEST_TIMESTAMP])
def test_the_timestamp_range_is_inclusive(stamp: str) -> None:
    payload = {"status": "in_progress"}
    parse_envelope({"type": "agent.status", **BASE, "timestamp": stamp, "payload": payload})


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("agent.status", "step_count"),
        ("agent.step.started", "message_count"),
        ("agent.step.completed", "duration_ms"),
        ("agent.tool.completed", "duration_ms"),
        ("agent.stream.chunk", "tokens_delta"),
        ("agent.continuation", "step_number"),
    ],
)
def test_counts_and_durations_past_what_javascript_holds_exactly_are_refused(
    kind: str, field: str
) -> None:
    envelope = {"type": kind, **BASE, "payload": {**PAYLOADS[kind], field: MAX_WIRE_INT}}
    parse_envelope(envelope)
    envelope["payload"][field] = MAX_WIRE_INT + 1
    with pytest.raises(ValidationError, match=field):
        parse_envelope(envelope)
    if field == "duration_ms":
        envelope["payload"][field] = float("inf")  # orjson writes null: not a duration
        with pytest.raises(ValidationError, match=field):
            parse_envelope(envelope)


def test_usage_past_the_bound_is_refused_and_wire_int_clamps() -> None:
    payload = {**PAYLOADS["agent.step.completed"], "usage": {"prompt": 10**20}}
    with pytest.raises(ValidationError, match="prompt"):
        parse_envelope({"type": "agent.step.completed", **BASE, "payload": payload})
    assert MAX_WIRE_INT == 2**53 - 1
    assert [wire_int(n) for n in (-5, 0, 7, 10**20)] == [0, 0, 7, MAX_WIRE_INT]
    assert "maximum" in json.dumps(json_schema())


def test_wire_safe_replaces_what_json_cannot_carry_and_says_where() -> None:
    value = {"a": [1, 10**20, -(10**20)], "t": "ok \ud800", "f": float("nan"), "b": True}
    kept, where = wire_safe(value)
    assert kept == {"a": [1, MAX_WIRE_INT, -MAX_WIRE_INT], "t": "ok \ufffd", "f": None, "b": True}
    assert where == ["a[1]", "a[2]", "t", "f"]
    orjson.dumps(kept)
    assert wire_safe({"x": [1, "é"]}) == ({"x": [1, "é"]}, [])
