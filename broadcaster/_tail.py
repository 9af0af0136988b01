"""``agent-broadcaster tail``: follow one session's run in the terminal.

A live, coloured trace (rich): steps, tool calls, streamed text, each continuation
decision with every criterion, the final status and the reconcile verdict. The runs of
a session are kept apart: each starts under a header naming it (``run 2 · <execution
id>``), and a run nested in another (a routed capability's inner agent) is indented
under the call it serves. The run followed is the session's latest: the earlier ones
are replayed from the channel's history, the latest is followed to its end. With
``--json`` one JSON object a line instead (each envelope with its position, then the
result). The exit status lets a script or a CI job wait on a run: 0 the run followed
completed, 1 it failed (a nested run's failure is its parent's business, not the exit
status), 2 could not follow (server unreachable, unknown session, refused token, bad
``since``).

Everything shown comes from the run's publishers, models and tools, or from the server,
and none of it is trusted: in the trace every value is printed as text (rich markup
escaped) with its control characters shown as escapes (``\\x1b``, ``\\x9b``; streamed
text keeps its line breaks and tabs), and each JSON line escapes them as ``\\uXXXX``
(:mod:`broadcaster._text`), so nothing written can move the cursor, clear the screen,
set the title or the clipboard (OSC 52) or make a link (OSC 8). An envelope with a field
of the wrong type is reported and skipped, never a crash.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from broadcaster._text import excerpt, json_line, printable
from broadcaster.client import (
    TERMINAL,
    Resume,
    RunView,
    WatchError,
    apply_snapshot,
    create_run_view,
    create_session_view,
    fetch_state,
    latest_run,
    reconcile,
    reduce_session,
    watch_session,
)

__all__ = ["EXIT_COMPLETED", "EXIT_FAILED", "EXIT_UNREACHABLE", "tail"]

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_UNREACHABLE = 2


def _show(value: Any) -> str:
    """``value`` as one line of text in rich markup: markup escaped, control characters
    shown as escapes."""
    return escape(printable(value))


def _ms(value: Any) -> str:
    number = float(value or 0)
    return f"{number:.1f} ms" if number < 10 else f"{number:.0f} ms"


_UNREADABLE = (TypeError, ValueError, KeyError, AttributeError)
"""What folding or printing an envelope with a field of the wrong type raises."""


def _unreadable(envelope: dict[str, Any], exc: Exception) -> str:
    return f"{excerpt(envelope.get('type'))}: {type(exc).__name__}: {exc}"


NESTED_INDENT = "  │ "
"""What a nested run's lines start with, once per level of nesting."""


class _Trace:
    """Prints envelopes as they come, with rich markup, each run under its header."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.in_text = False
        self.runs: list[str] = []  # the top-level runs' execution ids, in order
        self.parents: dict[str, str] = {}  # a nested run's execution id -> its parent's
        self.indent = ""  # the prefix of the lines of the run being printed
        self.ended: set[str] = set()  # the top-level runs whose end was printed

    def line(self, markup: str) -> None:
        if self.in_text:
            self.console.print()
            self.in_text = False
        self.console.print(f"{self.indent}{markup}", highlight=False)

    def envelope(self, envelope: dict[str, Any]) -> None:
        kind, payload = envelope.get("type"), envelope.get("payload") or {}
        self._run_of(envelope, payload)
        if kind == "agent.stream.chunk":
            chunk = escape(printable(payload.get("chunk", ""), lines=True))
            if self.indent:  # a nested run's text stays inside its indentation
                if not self.in_text:
                    chunk = self.indent + chunk
                chunk = chunk.replace("\n", "\n" + self.indent)
            self.console.print(chunk, end="", highlight=False)
            self.in_text = True
            return
        handler = getattr(self, "_" + str(kind).replace(".", "_"), None)
        if handler is not None:
            handler(payload)

    def _run_of(self, envelope: dict[str, Any], payload: dict[str, Any]) -> None:
        """Print a header when ``envelope`` is the first of a run; set the indentation
        of the run it belongs to."""
        execution = str(envelope.get("execution_id") or "")
        parent = payload.get("parent_execution_id")
        if parent is not None:
            if execution and execution not in self.parents:
                self.parents[execution] = str(parent)
                self.indent = NESTED_INDENT * (self._depth(execution) - 1)
                call = payload.get("parent_tool_call_id")
                via = f" for call {_show(call)}" if call else ""
                self.line(f"[bold magenta]┌ nested run {_show(execution)}[/][dim]{via}[/]")
            self.indent = NESTED_INDENT * self._depth(execution)
            return
        self.indent = ""
        if execution and execution not in self.runs:
            self.runs.append(execution)
            self.line(f"[bold reverse] run {len(self.runs)} · {_show(execution)} [/]")

    def _depth(self, execution: str) -> int:
        depth, seen = 0, set()
        while execution in self.parents and execution not in seen:
            seen.add(execution)
            execution = self.parents[execution]
            depth += 1
        return depth

    def _agent_status(self, payload: dict[str, Any]) -> None:
        status = payload.get("status")
        nested = payload.get("parent_execution_id") is not None
        if status == "in_progress":
            self.line(f"[bold blue]● {'nested ' if nested else ''}run started[/]")
        elif status in TERMINAL:
            self.line(_ending(status, payload.get("stop_reason"), payload.get("error_message")))
            if not nested and self.runs:
                self.ended.add(self.runs[-1])

    def _agent_step_started(self, payload: dict[str, Any]) -> None:
        actor = f" [magenta]{_show(payload['actor'])}[/]" if payload.get("actor") else ""
        self.line(f"[bold]── step {_show(payload.get('step_number'))}[/]{actor}")

    def _agent_tool_started(self, payload: dict[str, Any]) -> None:
        name, args = payload.get("tool_name"), payload.get("args_summary") or ""
        self.line(f"  [cyan]⚙ {_show(name)}[/]({_show(args)})")

    def _agent_tool_completed(self, payload: dict[str, Any]) -> None:
        name, ms = _show(payload.get("tool_name")), _ms(payload.get("duration_ms"))
        if payload.get("success"):
            result = _show(payload.get("result_summary") or "")
            self.line(f"  [green]✓ {name}[/] → {result} [dim]({ms})[/]")
        else:
            self.line(f"  [red]✗ {name}: {_show(payload.get('error'))}[/] [dim]({ms})[/]")

    def _agent_step_completed(self, payload: dict[str, Any]) -> None:
        usage = payload.get("usage") or {}
        self.line(
            f"  [dim]step {_show(payload.get('step_number'))} done: "
            f"{_show(payload.get('finish_reason'))}, {_show(usage.get('total', 0))} tokens, "
            f"{_ms(payload.get('duration_ms'))}[/]"
        )

    def _agent_continuation(self, payload: dict[str, Any]) -> None:
        verdict = "[green]continue[/]" if payload.get("should_continue") else "[yellow]stop[/]"
        reason = payload.get("stop_reason")
        self.line(
            f"  [yellow]↳ decision after step {_show(payload.get('step_number'))}:[/] {verdict}"
            f"{f' ({_show(reason)})' if reason else ''}, resolved by "
            f"[bold]{_show(payload.get('resolved_by'))}[/]"
        )
        for item in payload.get("evaluations") or []:
            self.line(
                f"    [dim]{_show(item.get('criterion'))}: {_show(item.get('decision'))} — "
                f"{_show(item.get('reason'))}[/]"
            )

    def resume(self, resume: Resume) -> None:
        if resume.recovered and resume.after_drop:
            self.line(f"[blue]⟲ reconnected: resumed, {resume.missed} missed events replayed[/]")
        elif not resume.recovered:
            reason = _show(resume.reason or "history not kept")
            self.line(
                f"[bold red]⚠ gap: the server could not replay the history ({reason}); "
                "reloading the stored state[/]"
            )

    def result(self, view: RunView, differences: list[dict[str, Any]] | None, note: str) -> None:
        self.indent = ""
        if len(self.runs) > 1:
            self.line(f"[bold]followed: run {len(self.runs)} of the session's {len(self.runs)}[/]")
        if view["execution_id"] not in self.ended:  # its end came from the stored state
            self.line(_ending(view["status"], view.get("stop_reason"), view.get("error")))
        if differences is None:
            self.line(f"[yellow]reconcile: not checked ({_show(note)})[/]")
        elif not differences:
            self.line("[green]reconcile: in sync with the stored state[/]")
        else:
            self.line(f"[red]reconcile: {len(differences)} differences from the stored state[/]")
            for item in differences:
                step = f" (step {item['step']})" if "step" in item else ""
                self.line(
                    f"  [red]{_show(item['field'])}{step}: events {_show(item['events'])} ≠ "
                    f"state {_show(item['snapshot'])}[/]"
                )


def _ending(status: Any, stop_reason: Any, error: Any) -> str:
    """The line of a run's end: ``■ completed (stop reason)``, red unless completed."""
    colour = "green" if status == "completed" else "red"
    detail = str(stop_reason or "")
    if error:
        detail = f"{detail}: {error}" if detail else str(error)
    return f"[bold {colour}]■ {_show(status)}[/]{f' ({_show(detail)})' if detail else ''}"


async def _follow(
    url: str,
    session_id: str,
    since: str | None,
    token: str | None,
    key: str | None,
    as_json: bool,
    out: TextIO,
) -> int:
    console = Console(file=out, highlight=False, soft_wrap=True)
    trace = _Trace(console)

    def emit(record: dict[str, Any]) -> None:
        out.write(json_line(record) + "\n")
        out.flush()

    def on_resume(resume: Resume) -> None:
        if as_json:
            emit({"type": "broadcaster:resume", "data": resume.__dict__})
        else:
            trace.resume(resume)

    watch = watch_session(url, session_id, since=since, token=token, key=key, on_resume=on_resume)
    session = create_session_view(session_id)
    async with watch:
        async for envelope in watch:
            try:
                folded = reduce_session(session, envelope, watch.position)
            except _UNREADABLE as exc:  # a publisher's field of the wrong type
                problem = _unreadable(envelope, exc)
                if as_json:
                    emit({"position": watch.position, "envelope": envelope, "unreadable": problem})
                else:
                    trace.line(
                        f"[bold red]⚠ skipped an envelope tail cannot read ({_show(problem)})[/]"
                    )
                continue
            session = folded
            if as_json:
                emit({"position": watch.position, "envelope": envelope})
                continue
            try:
                trace.envelope(envelope)
            except _UNREADABLE as exc:
                trace.line(
                    f"[bold red]⚠ cannot show an envelope ({_show(_unreadable(envelope, exc))})[/]"
                )
    # The run followed: the session's latest (the earlier ones were history).
    view = latest_run(session) or create_run_view(session_id)
    snapshot, note = watch.snapshot, ""
    if snapshot is not None:
        view = apply_snapshot(view, snapshot)
    if view["status"] in TERMINAL:
        try:
            snapshot = await fetch_state(url, session_id, token)
        except WatchError as exc:
            note = str(exc)
    differences = reconcile(view, snapshot) if snapshot is not None else None
    if snapshot is None and not note:
        note = "no stored state for this run"
    if as_json:
        emit(
            {
                "type": "tail.result",
                "execution_id": view["execution_id"],
                "runs": len(session["runs"]),
                "status": view["status"],
                "differences": differences,
                "resumes": [r.__dict__ for r in watch.resumes],
                "note": note or None,
            }
        )
    else:
        trace.result(view, differences, note)
    return EXIT_COMPLETED if view["status"] == "completed" else EXIT_FAILED


def tail(
    url: str,
    session_id: str,
    *,
    since: str | None = None,
    token: str | None = None,
    key: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Follow the run and print it; returns the exit status (0, 1 or 2)."""
    stream = out or sys.stdout
    try:
        return asyncio.run(_follow(url, session_id, since, token, key, as_json, stream))
    except WatchError as exc:
        if as_json:
            stream.write(json_line({"type": "tail.error", "error": str(exc)}) + "\n")
        else:
            Console(file=sys.stderr, highlight=False).print(
                f"[bold red]agent-broadcaster tail: {_show(exc)}[/]"
            )
        return EXIT_UNREACHABLE
