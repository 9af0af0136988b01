"""Follow an agent session from Python: the client side of the broadcaster.

``watch_session`` follows ``agent.<session>`` (``private-agent.<session>`` with a token)
over the Pusher protocol, with resume by position (docs/protocol.md, "Resume"): after a
dropped connection it resubscribes from the last position it delivered, and the server
replays what was missed. A gap the server cannot fill is never hidden: it is recorded
in :attr:`SessionWatch.resumes` (``recovered=False``) and handed to ``on_resume``.

``reduce_run`` folds envelopes into a ``RunView``: plain JSON data, field for field the
one the TypeScript kit builds (``clients/js/src/run.ts``); ``tests/fixtures/runs/``
holds recorded runs both must reproduce exactly. ``reconcile`` compares a view with the
stored state (``GET /api/sessions/{id}/state``).

Only client-side pieces are used here (websockets' client, httpx): nothing of the
server's node, hub or connections.

Example::

    async for envelope in watch_session("http://127.0.0.1:8080", "s-1"):
        print(envelope["type"])
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote, urlsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from broadcaster.envelope import ROUTING_PHASES

__all__ = [
    "STAGES",
    "TERMINAL",
    "InvalidPosition",
    "Resume",
    "RunView",
    "SessionNotFound",
    "SessionRefused",
    "SessionView",
    "SessionWatch",
    "WatchError",
    "apply_snapshot",
    "create_run_view",
    "create_session_view",
    "fetch_state",
    "final_text",
    "latest_run",
    "parse_position",
    "reconcile",
    "reduce_run",
    "reduce_run_all",
    "reduce_session",
    "watch_session",
]

RunView = dict[str, Any]
"""A run as the events built it (JSON data; see ``clients/js/src/run.ts``)."""

TERMINAL: Final = frozenset({"completed", "failed"})
STAGES: Final = ROUTING_PHASES
"""Reserved tool names of a routed run's phases: kept apart from the step's tools
(:data:`broadcaster.envelope.ROUTING_PHASES`)."""

RESUME_EVENT: Final = "broadcaster:resume"
_PROBE: Final = "start:0"
_SESSION_ID = re.compile(r"^[A-Za-z0-9_\-=@,.;]{1,128}$")
_KNOWN: Final = frozenset(
    {
        "agent.status",
        "agent.step.started",
        "agent.step.completed",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.stream.chunk",
        "agent.continuation",
    }
)


# --- errors ---------------------------------------------------------------------------


class WatchError(Exception):
    """The session cannot be followed: the server cannot be reached or refused.

    Subclasses: :class:`InvalidPosition` (a bad ``since``), :class:`SessionNotFound`,
    :class:`SessionRefused` (a wrong token or a private session without one).
    """


class InvalidPosition(WatchError, ValueError):
    """``since`` is not a position ``<epoch>:<offset>``."""


class SessionNotFound(WatchError):
    """The session has no events and no stored state."""


class SessionRefused(WatchError):
    """The server refused the token, or the session is private and no token was given."""


# --- positions --------------------------------------------------------------------------


def parse_position(text: object) -> tuple[str, int] | None:
    """``(epoch, offset)`` of ``"<epoch>:<offset>"`` (the epoch may contain ``:``)."""
    if not isinstance(text, str):
        return None
    epoch, sep, digits = text.rpartition(":")
    if not sep or not epoch or not digits.isascii() or not digits.isdigit():
        return None
    return epoch, int(digits)


def _is_replay(last: str | None, nxt: str | None) -> bool:
    a, b = parse_position(last), parse_position(nxt)
    return a is not None and b is not None and a[0] == b[0] and b[1] <= a[1]


# --- the reducer (keep in step with clients/js/src/run.ts) ------------------------------


def _usage(raw: Any) -> dict[str, int]:
    raw = raw or {}
    return {key: raw.get(key) or 0 for key in ("prompt", "completion", "total")}


def create_run_view(session_id: str | None = None) -> RunView:
    """A new, empty run."""
    return {
        "session_id": session_id,
        "execution_id": None,
        "status": "pending",
        "stop_reason": None,
        "resolved_by": None,
        "error": None,
        "last_response": None,
        "state_url": None,
        "usage": _usage(None),
        "reported_usage": None,
        "started_at": None,
        "ended_at": None,
        "steps": [],
        "event_count": 0,
        "position": None,
        "from_snapshot": False,
    }


def _new_step(number: int) -> dict[str, Any]:
    return {
        "number": number,
        "started_at": None,
        "available_tools": [],
        "actor": None,
        "chunks": {},
        "text": "",
        "stream_complete": False,
        "tools": [],
        "completed": None,
        "continuation": None,
        "routing": None,
        "from_snapshot": False,
    }


def _step_of(run: RunView, number: int) -> dict[str, Any]:
    for step in run["steps"]:
        if step["number"] == number:
            return step  # type: ignore[no-any-return]
    step = _new_step(number)
    run["steps"].append(step)
    run["steps"].sort(key=lambda s: s["number"])
    return step


def _current_step(run: RunView) -> int:
    return run["steps"][-1]["number"] if run["steps"] else 1


def _tool_of(step: dict[str, Any], tool_id: str) -> dict[str, Any]:
    for tool in step["tools"]:
        if tool["id"] == tool_id:
            return tool  # type: ignore[no-any-return]
    tool = {
        "id": tool_id,
        "name": None,
        "args_summary": None,
        "arguments": None,
        "state": "listed",
        "success": None,
        "error": None,
        "duration_ms": None,
        "result_summary": None,
        "started_at": None,
    }
    step["tools"].append(tool)
    return tool


def _recompute_usage(run: RunView) -> None:
    usage = _usage(None)
    for step in run["steps"]:
        if step["completed"]:
            for key in usage:
                usage[key] += step["completed"]["usage"][key]
    run["usage"] = usage


def _join(chunks: dict[str, str]) -> str:
    return "".join(chunks[key] for key in sorted(chunks, key=int))


def _apply_status(run: RunView, payload: dict[str, Any], at: str | None) -> None:
    run["status"] = payload["status"]
    if payload.get("state_url"):
        run["state_url"] = payload["state_url"]
    if payload["status"] in TERMINAL:
        run["ended_at"] = at
        run["stop_reason"] = payload.get("stop_reason")
        run["error"] = payload.get("error_message")
        run["last_response"] = payload.get("last_response")
        run["reported_usage"] = (
            _usage(payload["usage"]) if payload.get("usage") is not None else None
        )
    else:
        # A later run of the session (in_progress again) keeps the clock going, and the
        # last run's outcome no longer applies.
        run.update(
            ended_at=None, stop_reason=None, error=None, last_response=None, reported_usage=None
        )


def _apply_stage(step: dict[str, Any], started: bool, payload: dict[str, Any]) -> None:
    if step["routing"] is None:
        step["routing"] = {}
    stage = step["routing"].get(payload["tool_name"]) or {
        "id": payload["tool_call_id"],
        "arguments": None,
        "args_summary": "",
        "state": "running",
        "success": None,
        "error": None,
        "duration_ms": None,
        "result_summary": None,
    }
    stage["id"] = payload["tool_call_id"]
    step["routing"][payload["tool_name"]] = stage
    if started:
        stage["arguments"] = payload.get("arguments")
        stage["args_summary"] = payload.get("args_summary") or ""
        return
    stage["state"] = "done"
    stage["success"] = payload.get("success")
    stage["error"] = payload.get("error")
    stage["duration_ms"] = payload.get("duration_ms")
    stage["result_summary"] = payload.get("result_summary")


def _apply_tool(run: RunView, started: bool, payload: dict[str, Any], at: str | None) -> None:
    number = payload.get("step_number")
    step = _step_of(run, number if number is not None else _current_step(run))
    if payload["tool_name"] in STAGES:
        _apply_stage(step, started, payload)
        return
    tool = _tool_of(step, payload["tool_call_id"])
    tool["name"] = payload["tool_name"]
    if started:
        tool["args_summary"] = payload.get("args_summary")
        tool["arguments"] = payload.get("arguments")
        tool["started_at"] = at
        if tool["state"] != "done":
            tool["state"] = "running"
        return
    tool["state"] = "done"
    tool["success"] = payload.get("success")
    tool["error"] = payload.get("error")
    tool["duration_ms"] = payload.get("duration_ms")
    tool["result_summary"] = payload.get("result_summary")


def _apply_step_completed(run: RunView, payload: dict[str, Any]) -> None:
    step = _step_of(run, payload["step_number"])
    summary = payload.get("continuation")
    step["completed"] = {
        "finish_reason": payload.get("finish_reason"),
        "usage": _usage(payload.get("usage")),
        "duration_ms": payload.get("duration_ms") or 0,
        "has_tool_calls": payload.get("has_tool_calls") or False,
        "errors": payload.get("errors") or 0,
        "continuation": (
            {
                "should_continue": summary["should_continue"],
                "stop_reason": summary.get("stop_reason"),
                "resolved_by": summary["resolved_by"],
            }
            if summary is not None
            else None
        ),
    }
    if summary is not None:
        run["resolved_by"] = summary["resolved_by"]
    for ref in payload.get("tool_calls") or []:
        tool = _tool_of(step, ref["id"])
        if tool["name"] is None:
            tool["name"] = ref["name"]
    _recompute_usage(run)


def _apply(run: RunView, kind: str, payload: dict[str, Any], at: str | None) -> None:
    if kind == "agent.status":
        _apply_status(run, payload, at)
    elif kind == "agent.step.started":
        step = _step_of(run, payload["step_number"])
        step["started_at"] = at
        step["available_tools"] = list(payload.get("available_tools") or [])
        step["actor"] = payload.get("actor")
        if run["status"] == "pending":
            run["status"] = "in_progress"
    elif kind == "agent.step.completed":
        _apply_step_completed(run, payload)
    elif kind in ("agent.tool.started", "agent.tool.completed"):
        _apply_tool(run, kind == "agent.tool.started", payload, at)
    elif kind == "agent.stream.chunk":
        number = payload.get("step_number")
        step = _step_of(run, number if number is not None else _current_step(run))
        index = payload.get("chunk_index")
        step["chunks"][str(index if index is not None else len(step["chunks"]))] = payload["chunk"]
        step["text"] = _join(step["chunks"])
        if payload.get("is_complete"):
            step["stream_complete"] = True
    else:  # agent.continuation; step 0 is the decision before step 1: keep it with step 1
        _step_of(run, max(payload["step_number"], 1))["continuation"] = copy.deepcopy(payload)
        run["resolved_by"] = payload["resolved_by"]


_LINK = ("parent_execution_id", "parent_tool_call_id")


def _owner(run: RunView, execution_id: str) -> RunView | None:
    """The run ``execution_id`` among ``run`` and the runs nested in it (any depth)."""
    if run["execution_id"] == execution_id:
        return run
    for runs in (run.get("nested") or {}).values():
        for child in runs.values():
            found = _owner(child, execution_id)
            if found is not None:
                return found
    return None


def _fold_nested(run: RunView, envelope: dict[str, Any], payload: dict[str, Any]) -> None:
    """A nested run's envelope (a routed capability's inner agent): folded into its own
    RunView, kept as ``nested[<parent tool call id>][<execution id>]`` of the run it
    runs in, never into that run's steps, status or usage."""
    owner = _owner(run, str(payload["parent_execution_id"])) or run
    call = str(payload.get("parent_tool_call_id") or "")
    execution = str(envelope.get("execution_id") or "")
    runs = owner.setdefault("nested", {}).setdefault(call, {})
    child = runs.get(execution)
    if child is None:
        child = runs[execution] = create_run_view(envelope.get("session_id"))
    inner = {k: v for k, v in payload.items() if k not in _LINK}
    _fold(child, {**envelope, "payload": inner}, None)


def _fold(run: RunView, envelope: Any, position: str | None) -> bool:
    """Fold ``envelope`` into ``run`` in place; False when it leaves the run as it was."""
    if not isinstance(envelope, dict) or envelope.get("type") not in _KNOWN:
        return False
    payload = envelope.get("payload")
    if not isinstance(payload, dict) or _is_replay(run["position"], position):
        return False
    if payload.get("parent_execution_id") is not None:
        _fold_nested(run, envelope, payload)
        if position is not None:
            run["position"] = position
        return True
    at = envelope.get("timestamp")
    if run["started_at"] is None and at is not None:
        run["started_at"] = at
    if run["session_id"] is None and envelope.get("session_id"):
        run["session_id"] = envelope["session_id"]
    if envelope.get("execution_id"):
        run["execution_id"] = envelope["execution_id"]
    _apply(run, envelope["type"], payload, at)
    run["event_count"] += 1
    if position is not None:
        run["position"] = position
    return True


def reduce_run(view: RunView, envelope: Any, position: str | None = None) -> RunView:
    """Fold one envelope into ``view``, returning a new RunView (``view`` is unchanged).

    With its ``position``, an envelope the view already holds (same epoch, not after the
    view's position: a duplicate or an overlapping replay) leaves the view as it was.
    Unknown envelope types are ignored.
    """
    if not isinstance(envelope, dict) or envelope.get("type") not in _KNOWN:
        return view
    payload = envelope.get("payload")
    if not isinstance(payload, dict) or _is_replay(view["position"], position):
        return view
    run = copy.deepcopy(view)
    _fold(run, envelope, position)
    return run


def reduce_run_all(view: RunView, records: Iterable[Mapping[str, Any]]) -> RunView:
    """Fold many ``{"envelope", "position"}`` records into ``view`` at once, in order: the
    same RunView as :func:`reduce_run` over each in turn, with one copy of the view
    instead of one per envelope (a stored trace of thousands). ``view`` is unchanged."""
    run = copy.deepcopy(view)
    for record in records:
        _fold(run, record.get("envelope"), record.get("position"))
    return run


SessionView = dict[str, Any]
"""A session's runs apart (see ``clients/js/src/session.ts``): ``{"session_id", "runs"
(top-level RunViews, oldest first), "position"}``."""


def create_session_view(session_id: str | None = None) -> SessionView:
    """A new session with no run yet."""
    return {"session_id": session_id, "runs": [], "position": None}


def _holds(run: RunView, execution_id: str) -> bool:
    """Whether ``run`` or a run nested in it (any depth) has ``execution_id``."""
    return _owner(run, execution_id) is not None


def _run_index(runs: list[RunView], envelope: dict[str, Any]) -> int:
    """The index in ``runs`` of the run ``envelope`` belongs to; -1: a new run (a nested
    run's envelope goes to the run holding its parent; one without an id stays with
    the latest run)."""
    parent = envelope["payload"].get("parent_execution_id")
    if parent is not None:
        found = [i for i, run in enumerate(runs) if _holds(run, str(parent))]
        return found[0] if found else len(runs) - 1
    execution_id = envelope.get("execution_id")
    if not execution_id:
        return len(runs) - 1
    for i, run in enumerate(runs):
        if run["execution_id"] == execution_id:
            return i
    # A run known so far only from envelopes without its id (nested ones, say) is this one.
    return len(runs) - 1 if runs and runs[-1]["execution_id"] is None else -1


def reduce_session(view: SessionView, envelope: Any, position: str | None = None) -> SessionView:
    """Fold one envelope into the session ``view``, each run apart (a new execution id
    starts a run; a nested run's envelopes stay with the run they are nested in),
    returning a new SessionView (``view`` is unchanged; the runs the envelope does not
    touch are the same objects). Replays and unknown types are left out, as
    :func:`reduce_run` does."""
    if (
        not isinstance(envelope, dict)
        or envelope.get("type") not in _KNOWN
        or not isinstance(envelope.get("payload"), dict)
        or _is_replay(view["position"], position)
    ):
        return view
    runs = list(view["runs"])
    index = _run_index(runs, envelope)
    if index < 0:
        runs.append(create_run_view(view["session_id"]))
        index = len(runs) - 1
    runs[index] = reduce_run(runs[index], envelope, position)
    return {
        "session_id": view["session_id"],
        "runs": runs,
        "position": view["position"] if position is None else position,
    }


def latest_run(view: SessionView) -> RunView | None:
    """The session's latest run (started last), or None before any."""
    runs: list[RunView] = view["runs"]
    return runs[-1] if runs else None


def final_text(view: RunView, completed_only: bool = False) -> str:
    """The assistant's final answer: the last step's streamed text (else last_response)."""
    steps = [s for s in view["steps"] if s["chunks"] and (not completed_only or s["completed"])]
    if steps:
        return steps[-1]["text"]  # type: ignore[no-any-return]
    return view["last_response"] or ""


def _last_assistant_text(snapshot: dict[str, Any]) -> str:
    messages = snapshot.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if message.get("role") == "assistant" and message.get("content"):
            return str(message["content"])
    return ""


def reconcile(view: RunView, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Compare what the events built with the stored state; one entry per difference
    (``{field, step?, events, snapshot}``), empty when in sync."""
    differences: list[dict[str, Any]] = []

    def differ(field: str, events: Any, snap: Any, step: int | None = None) -> None:
        a, b = _text(events), _text(snap)
        if a != b:
            entry: dict[str, Any] = {"field": field, "events": a, "snapshot": b}
            if step is not None:
                entry = {"field": field, "step": step, "events": a, "snapshot": b}
            differences.append(entry)

    completed = [s for s in view["steps"] if s["completed"]]
    earlier = max(0, view["steps"][0]["number"] - 1) if view["steps"] else 0
    differ("status", view["status"], snapshot.get("status"))
    differ("step count", len(completed) + earlier, snapshot.get("step_count"))
    reported = view["reported_usage"]
    tokens = (
        view["usage"]["total"]
        if earlier == 0
        else reported["total"]
        if view["status"] in TERMINAL and reported
        else None
    )
    if tokens is not None:
        differ("total tokens", tokens, (snapshot.get("usage") or {}).get("total", 0))
    theirs = {s["step_number"]: s for s in snapshot.get("steps") or []}
    numbers = sorted(set(theirs) | {s["number"] for s in completed})
    mine_by_number = {s["number"]: s for s in view["steps"]}
    for number in numbers:
        mine, their = mine_by_number.get(number), theirs.get(number)
        if mine is None or not mine["completed"]:
            differences.append(
                {"field": "step", "step": number, "events": "missing", "snapshot": "present"}
            )
            continue
        if their is None:
            if number > (snapshot.get("step_count") or 0):
                differences.append(
                    {"field": "step", "step": number, "events": "present", "snapshot": "missing"}
                )
            continue
        my_ids = ", ".join(sorted(t["id"] for t in mine["tools"])) or "none"
        their_ids = ", ".join(sorted(c["id"] for c in their.get("tool_calls") or [])) or "none"
        differ("tool call ids", my_ids, their_ids, number)
        differ(
            "finish reason",
            mine["completed"]["finish_reason"] or "none",
            their.get("finish_reason") or "none",
            number,
        )
    differ("final assistant text", final_text(view, True), _last_assistant_text(snapshot))
    return differences


def _text(value: Any) -> str:
    """``String(value)`` as JavaScript writes it, so both reconciles agree."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def apply_snapshot(view: RunView, snapshot: dict[str, Any]) -> RunView:
    """Fill the steps whose events were lost from the stored state (``from_snapshot``);
    steps known from events are kept. Returns a new view."""
    run = copy.deepcopy(view)
    for summary in snapshot.get("steps") or []:
        existing = next((s for s in run["steps"] if s["number"] == summary["step_number"]), None)
        if existing is not None and existing["completed"]:
            continue
        step = _step_of(run, summary["step_number"])
        step["from_snapshot"] = True
        if step["actor"] is None:
            step["actor"] = summary.get("actor")
        step["completed"] = {
            "finish_reason": summary.get("finish_reason"),
            "usage": {
                "prompt": 0,
                "completion": 0,
                "total": (summary.get("usage") or {}).get("total") or 0,
            },
            "duration_ms": summary.get("duration_ms") or 0,
            "has_tool_calls": summary.get("has_tool_calls") or False,
            "errors": summary.get("errors") or 0,
            "continuation": None,
        }
        for ref in summary.get("tool_calls") or []:
            tool = _tool_of(step, ref["id"])
            if tool["name"] is None:
                tool["name"] = ref["name"]
        run["from_snapshot"] = True
    if snapshot.get("status") in TERMINAL and run["status"] not in TERMINAL:
        run["status"] = snapshot["status"]
    text = _last_assistant_text(snapshot)
    if (
        text
        and run["steps"]
        and not run["steps"][-1]["chunks"]
        and snapshot.get("status") in TERMINAL
    ):
        last = run["steps"][-1]
        last["chunks"] = {"0": text}
        last["text"] = text
        last["stream_complete"] = True
    _recompute_usage(run)
    return run


# --- watching ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Resume:
    """The server's answer to a (re)subscribe with a position (``broadcaster:resume``)."""

    recovered: bool
    position: str | None
    reason: str | None
    missed: int
    """Events replayed before the answer."""
    after_drop: bool
    """Whether this answers a resubscribe after a dropped connection."""


def _base(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WatchError(f"url {url!r} is not an http(s) URL of the server")
    return url.rstrip("/")


async def fetch_state(
    url: str, session_id: str, token: str | None = None, *, wait: float = 10
) -> dict[str, Any] | None:
    """The stored state of a session (``GET /api/sessions/{id}/state``); None when none
    is stored (unknown session, run in progress, or expired).

    Raises:
        SessionRefused: 403.
        WatchError: the server cannot be reached or answered another error.
    """
    target = f"{_base(url)}/api/sessions/{quote(session_id, safe='')}/state"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with httpx.AsyncClient(timeout=wait) as http:
            response = await http.get(target, headers=headers)
    except httpx.HTTPError as exc:
        raise WatchError(f"GET {target}: {exc or type(exc).__name__}") from exc
    if response.status_code == 404:
        return None
    if response.status_code == 403:
        raise SessionRefused(f"GET {target}: {_error_of(response)}")
    if response.status_code != 200:
        raise WatchError(f"GET {target} answered {response.status_code}: {_error_of(response)}")
    body = response.json()
    if not isinstance(body, dict):
        raise WatchError(f"GET {target} answered {body!r}, not a state")
    return body


def _error_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("error", body)) if isinstance(body, dict) else str(body)[:200]


class _Reconnect(Exception):
    """The connection dropped (or the server asked for a reconnect): resubscribe."""


class SessionWatch:
    """An async iterator of one session's envelopes (dicts, in order, each at most
    once), resuming by position across dropped connections. Made by
    :func:`watch_session`; see there."""

    def __init__(
        self,
        url: str,
        session_id: str,
        *,
        since: str | None,
        token: str | None,
        key: str | None,
        until_end: bool,
        reconnect_for: float,
        connect_timeout: float,
        on_resume: Callable[[Resume], None] | None,
    ) -> None:
        self.url = _base(url)
        self.session_id = session_id
        self.token = token
        self.key = key
        self.until_end = until_end
        self.reconnect_for = reconnect_for
        self.connect_timeout = connect_timeout
        self.on_resume = on_resume
        self.channel = f"{'private-' if token else ''}agent.{session_id}"
        self.position: str | None = since
        """The position of the last envelope the iteration has yielded."""
        self.resumes: list[Resume] = []
        """The server's resume answers, each added when the iteration reaches it."""
        self.state = "connecting"
        """connecting, live, reconnecting, recovered, reloaded (a gap the server could
        not fill), ended, closed."""
        self.snapshot: dict[str, Any] | None = None
        """The stored state, when a gap or an expired history made the watcher read it."""
        self._from_start = since is not None
        self._ever_live = False
        self._missed = 0
        self._accepting = False
        self._answered = False  # the last subscribe's resume answer came
        self._ended = False  # the run's terminal agent.status was delivered
        self._ws: ClientConnection | None = None
        # Envelopes with their positions and resume answers, in the order they came.
        self._queue: asyncio.Queue[
            tuple[dict[str, Any], str | None] | Resume | BaseException | None
        ] = asyncio.Queue()
        self._received: str | None = since
        self._task: asyncio.Task[None] | None = None

    # -- the iterator --

    def __aiter__(self) -> SessionWatch:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        item = await self._queue.get()
        while isinstance(item, Resume):
            self.resumes.append(item)
            if self.on_resume is not None:
                self.on_resume(item)
            item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        envelope, position = item
        if position is not None:
            self.position = position
        return envelope

    async def __aenter__(self) -> SessionWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop following (closes the connection)."""
        if self.state not in ("ended", "failed"):
            self.state = "closed"
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ws is not None:
            await self._ws.close()

    # -- the connection --

    async def _run(self) -> None:
        try:
            await self._follow()
        except WatchError as exc:
            self.state = "failed"
            self._queue.put_nowait(exc)
        except Exception as exc:  # handed to the consumer as a WatchError, never lost
            self.state = "failed"
            self._queue.put_nowait(WatchError(f"watching {self.channel} failed: {exc!r}"))
        else:
            self._queue.put_nowait(None)

    async def _follow(self) -> None:
        key = self.key or await self._app_key()
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                ended = await self._session(key)
            except (_Reconnect, ConnectionClosed, OSError, InvalidHandshake, TimeoutError) as exc:
                if not self._ever_live:
                    raise WatchError(f"cannot connect to {self.url}: {_describe(exc)}") from exc
                self.state = "reconnecting"
                deadline = deadline or loop.time() + self.reconnect_for
                if loop.time() > deadline:
                    raise WatchError(
                        f"lost {self.url} and could not reconnect within "
                        f"{self.reconnect_for:g} s (resume from {self._received})"
                    ) from exc
                await asyncio.sleep(0.5)
                continue
            if ended:
                return
            deadline = None

    async def _app_key(self) -> str:
        if os.environ.get("BROADCASTER_APP_KEY"):
            return os.environ["BROADCASTER_APP_KEY"]
        try:
            async with httpx.AsyncClient(timeout=self.connect_timeout) as http:
                response = await http.get(f"{self.url}/api/demo/config")
        except httpx.HTTPError as exc:
            raise WatchError(f"cannot connect to {self.url}: {_describe(exc)}") from exc
        if response.status_code == 200 and response.json().get("app_key"):
            return str(response.json()["app_key"])
        raise WatchError(
            f"no app key: pass key= (or set BROADCASTER_APP_KEY); {self.url}/api/demo/config "
            f"answered {response.status_code}"
        )

    def _ws_url(self, key: str) -> str:
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}/app/{quote(key, safe='')}?protocol=7&client=python-watch"

    async def _session(self, key: str) -> bool:
        """One connection; True when the iteration is over (run ended)."""
        async with asyncio.timeout(self.connect_timeout):
            ws = await connect(self._ws_url(key), open_timeout=self.connect_timeout)
        self._ws = ws
        try:
            established = await self._receive(ws, self.connect_timeout)
            if established.get("event") != "pusher:connection_established":
                raise WatchError(f"{self.url} refused the connection: {established}")
            socket_id = _data(established).get("socket_id", "")
            await self._subscribe(ws, socket_id)
            while True:
                message = await self._receive(ws, None)
                if await self._handle(ws, socket_id, message):
                    return True
        finally:
            await ws.close()

    async def _receive(self, ws: ClientConnection, wait: float | None) -> dict[str, Any]:
        async with asyncio.timeout(wait):
            frame = await ws.recv()
        message = json.loads(frame)
        if not isinstance(message, dict):
            raise WatchError(f"unexpected frame {frame!r:.200}")
        return message

    async def _subscribe(self, ws: ClientConnection, socket_id: str) -> None:
        data: dict[str, Any] = {"channel": self.channel, "position": self._received or _PROBE}
        if self.token:
            data["auth"] = await self._authorize(socket_id)
        self._missed = 0
        self._accepting = False
        self._answered = False
        await ws.send(json.dumps({"event": "pusher:subscribe", "data": data}))

    async def _authorize(self, socket_id: str) -> str:
        target = f"{self.url}/broadcasting/auth"
        form = {"socket_id": socket_id, "channel_name": self.channel, "session_token": self.token}
        try:
            async with httpx.AsyncClient(timeout=self.connect_timeout) as http:
                response = await http.post(target, data=form)
        except httpx.HTTPError as exc:
            raise _Reconnect(str(exc)) from exc
        if response.status_code in (401, 403, 404):
            raise SessionRefused(f"{self.channel}: {_error_of(response)}")
        if response.status_code != 200:
            raise _Reconnect(f"POST {target} answered {response.status_code}")
        return str(response.json()["auth"])

    async def _handle(self, ws: ClientConnection, socket_id: str, message: dict[str, Any]) -> bool:
        event = message.get("event")
        if event == "pusher:ping":
            await ws.send(json.dumps({"event": "pusher:pong", "data": {}}))
            return False
        if event == "pusher:error":
            raise _Reconnect(f"pusher:error {_data(message)}")
        if message.get("channel") != self.channel:
            return False
        if event == "pusher:subscription_error":
            raise SessionRefused(f"subscription to {self.channel} refused: {_data(message)}")
        if event == "pusher_internal:subscription_succeeded":
            self._accepting = True
            return False
        if event == RESUME_EVENT:
            return await self._resumed(ws, socket_id, _data(message))
        if not self._accepting or not isinstance(event, str) or not event.startswith("agent."):
            return False
        position = message.get("position")
        position = position if isinstance(position, str) else None
        if _is_replay(self._received, position):
            return False
        if position is not None:
            self._received = position
        self._missed += 1
        envelope = _data(message)
        self._queue.put_nowait((envelope, position))
        payload = envelope.get("payload") or {}
        if envelope.get("type") == "agent.status" and payload.get("parent_execution_id") is None:
            # A nested run's end is not the run's; a later run of the session that began
            # (in a replay, after an earlier run's end) is followed to its own end.
            self._ended = self.until_end and str(payload.get("status")) in TERMINAL
        # A run that ends within a replay ends once the resume answer came, so the
        # answer (recovered or not) is always reported.
        return self._ended and self._answered and self._end()

    def _end(self) -> bool:
        self.state = "ended"
        return True

    async def _resumed(self, ws: ClientConnection, socket_id: str, answer: dict[str, Any]) -> bool:
        self._answered = True
        current = parse_position(answer.get("position"))
        if self._received is None:
            # The answer to the probe (no since): replay what the channel already holds.
            if current is not None and current[1] > 0:
                self._received = f"{current[0]}:0"
                self._from_start = True
                await ws.send(
                    json.dumps({"event": "pusher:unsubscribe", "data": {"channel": self.channel}})
                )
                await self._subscribe(ws, socket_id)
                return False
            if current is None:
                return await self._nothing_published()
            self._received = answer.get("position")
            self._report(Resume(True, self._received, None, 0, False))
            return False
        after_drop = self._ever_live and not self._from_start
        self._from_start = False
        recovered = bool(answer.get("recovered"))
        if not recovered and current is not None:
            self._received = answer.get("position")
        self._report(
            Resume(
                recovered, answer.get("position"), answer.get("reason"), self._missed, after_drop
            )
        )
        if recovered:
            return self._ended and self._end()
        return await self._gap() or (self._ended and self._end())

    async def _nothing_published(self) -> bool:
        """The channel holds nothing: an unknown session, or one whose history expired."""
        self.snapshot = await fetch_state(self.url, self.session_id, self.token)
        if self.snapshot is None:
            raise SessionNotFound(
                f"unknown session {self.session_id!r}: no events on {self.channel} and no "
                "stored state"
            )
        self._report(Resume(False, None, "history expired", 0, False))
        self.state = "reloaded"
        return self.until_end and self.snapshot.get("status") in TERMINAL

    async def _gap(self) -> bool:
        self.state = "reloaded"
        self.snapshot = await fetch_state(self.url, self.session_id, self.token)
        return bool(self.until_end and self.snapshot and self.snapshot.get("status") in TERMINAL)

    def _report(self, resume: Resume) -> None:
        self._ever_live = True
        if resume.recovered:
            self.state = "recovered" if resume.after_drop else "live"
        self._queue.put_nowait(resume)


def _data(message: dict[str, Any]) -> dict[str, Any]:
    data = message.get("data")
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return {"message": data}
    return data if isinstance(data, dict) else {}


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def watch_session(
    url: str,
    session_id: str,
    *,
    since: str | None = None,
    token: str | None = None,
    key: str | None = None,
    until_end: bool = True,
    reconnect_for: float = 30.0,
    connect_timeout: float = 10.0,
    on_resume: Callable[[Resume], None] | None = None,
) -> SessionWatch:
    """Follow ``agent.<session_id>`` on the server at ``url`` (``http[s]://host:port``).

    ``async for envelope in watch_session(url, session_id): ...`` yields each envelope
    (a dict) once, in order; :attr:`SessionWatch.position` is the position of the last
    one. After a dropped connection it reconnects (for up to ``reconnect_for`` seconds)
    and resumes from that position; every resume answer is in ``resumes`` and passed
    to ``on_resume``. A gap the server could not fill sets ``state`` to "reloaded" and
    reads the stored state into ``snapshot``.

    Args:
        since: the position to start after (``POST /run`` answers it); default: the
            channel's whole history.
        token: a private session's token (subscribes to ``private-agent.<id>``).
        key: the app key; default ``BROADCASTER_APP_KEY`` or the demo's
            ``/api/demo/config``.
        until_end: stop after the run's terminal ``agent.status``.

    Raises:
        InvalidPosition: at once, for a ``since`` that is not ``<epoch>:<offset>``.
        WatchError: at once for an invalid session id or url; while iterating:
            :class:`SessionNotFound`, :class:`SessionRefused`, or the server could not
            be reached.
    """
    if not _SESSION_ID.fullmatch(session_id or ""):
        raise WatchError(f"invalid session id {session_id!r}: 1-128 of A-Z a-z 0-9 _ - = @ , . ;")
    if since is not None and parse_position(since) is None:
        raise InvalidPosition(f"since {since!r} is not a position '<epoch>:<offset>'")
    return SessionWatch(
        url,
        session_id,
        since=since,
        token=token,
        key=key,
        until_end=until_end,
        reconnect_for=reconnect_for,
        connect_timeout=connect_timeout,
        on_resume=on_resume,
    )
