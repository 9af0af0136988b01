"""Text that attacks a terminal, in every field of a run a model, a tool or a publisher
writes: what ``agent-broadcaster tail`` must show without acting on (its tests, unit
and end to end)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["EXECUTION_ID", "HOSTILE", "NESTED_ID", "controls", "hostile_run", "hostile_state"]

HOSTILE = (
    "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: put "evil" on the clipboard
    "\x1b]0;pwned\x07"  # the window title
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"  # OSC 8 hyperlink
    "\x9b31m"  # C1 CSI: red, in one character
    "\x90qsixel\x9c"  # C1 DCS ... ST
    "\r\x08\x07\x7f\x85\u2028\u202e"  # CR, BS, BEL, DEL, NEL, line separator, RLO
    "[link=https://evil.example/]markup[/link][bold]"  # rich markup
)
"""A string with an escape sequence of each kind a terminal acts on."""
EXECUTION_ID = "x-\x1b]0;run\x07\x9b2J[link=https://evil.example/]x[/link]"
"""A hostile execution id (ids are at most 128 characters)."""
NESTED_ID = "n-\x1b]8;;https://evil.example/\x1b\\nested\x1b]8;;\x1b\\"

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def controls(text: str, *, newlines: bool = True) -> list[str]:
    """The control characters in ``text`` a terminal would act on (a tab is allowed,
    and with ``newlines`` a line feed)."""
    return [c for c in _CONTROL.findall(text) if not (newlines and c == "\n")]


def hostile_run(session_id: str, execution_id: str) -> list[dict[str, Any]]:
    """A failed run of one step whose every free text field is :data:`HOSTILE`."""
    h = HOSTILE
    ts = "2026-01-16T10:05:00.123Z"

    def envelope(kind: str, **payload: Any) -> dict[str, Any]:
        return {
            "type": kind,
            "session_id": session_id,
            "execution_id": execution_id,
            "timestamp": ts,
            "payload": payload,
        }

    def nested(kind: str, **payload: Any) -> dict[str, Any]:
        link = {"parent_execution_id": execution_id, "parent_tool_call_id": h}
        return {**envelope(kind, **link, **payload), "execution_id": NESTED_ID}

    evaluation = {"criterion": h, "decision": "stop", "reason": h, "stop_reason": h}
    return [
        envelope("agent.status", status="in_progress"),
        envelope(
            "agent.continuation",
            step_number=0,
            should_continue=True,
            resolved_by=h,
            evaluations=[{**evaluation, "decision": "allow", "stop_reason": None}],
        ),
        envelope("agent.step.started", step_number=1, actor=h, available_tools=[h]),
        envelope(
            "agent.tool.started",
            step_number=1,
            tool_name=h,
            tool_call_id="c1",
            args_summary=h,
            arguments={"city": h},
        ),
        # A run nested under the call: its execution id and the call it serves are shown.
        nested("agent.status", status="in_progress"),
        nested("agent.step.started", step_number=1, actor=h),
        nested("agent.status", status="completed", stop_reason=h),
        envelope(
            "agent.tool.completed",
            step_number=1,
            tool_name=h,
            tool_call_id="c1",
            success=False,
            error=h,
            duration_ms=3,
        ),
        envelope(
            "agent.tool.completed",
            step_number=1,
            tool_name=h,
            tool_call_id="c2",
            success=True,
            result_summary=h,
            duration_ms=3,
        ),
        envelope(
            "agent.stream.chunk", step_number=1, chunk=f"{h}\nline two\tcolumn", chunk_index=0
        ),
        envelope(
            "agent.step.completed",
            step_number=1,
            has_tool_calls=True,
            finish_reason=h,
            duration_ms=5,
            usage={"prompt": 1, "completion": 1, "total": 2},
            tool_calls=[{"id": "c1", "name": h}],
            continuation={"should_continue": False, "stop_reason": h, "resolved_by": h},
        ),
        envelope(
            "agent.continuation",
            step_number=1,
            should_continue=False,
            resolved_by=h,
            stop_reason=h,
            evaluations=[evaluation],
        ),
        envelope(
            "agent.status",
            status="failed",
            step_count=1,
            error_message=h,
            stop_reason=h,
            last_response=h,
        ),
    ]


def hostile_state(execution_id: str) -> dict[str, Any]:
    """A stored state that differs from :func:`hostile_run` in hostile text (the
    reconcile differences quote it)."""
    return {
        "agent_id": "agent-hostile",
        "status": "failed",
        "step_count": 1,
        "usage": {"prompt": 1, "completion": 1, "total": 2},
        "execution": {"updated_at": "2026-01-01T00:00:00.000Z"},
        "steps": [
            {
                "step_number": 1,
                "tool_calls": [{"id": HOSTILE, "name": HOSTILE}],
                "finish_reason": HOSTILE + "!",
            }
        ],
        "messages": [{"role": "assistant", "content": HOSTILE + "!", "metadata": {}}],
        "metadata": {"execution_id": execution_id},
    }
