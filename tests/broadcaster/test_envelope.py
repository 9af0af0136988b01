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
    SCHEMA_FILE,
    AgentStatus,
    StatusPayload,
    UsagePayload,
    json_schema,
    parse_envelope,
    run_usage,
    utc_timestamp,
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
