"""The conformance matrix's columns: every surface a run is shown on, each a reader
that turns what the surface shows into :class:`~tests.support.facts.RunFacts`.

A :class:`Surface` reads all the runs of one backend at once (:attr:`Surface.read`:
one Node process for all the runs of a Node client) and says which facts it carries
and for which kinds it does not apply (and why). A new surface joins the matrix by
adding one here: the page columns, for instance, would read the facts from the DOM
(data attributes and text) of the live and run pages in Chromium.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from broadcaster.client import create_session_view, final_text, reduce_session, watch_session
from tests.support.facts import FACTS, NestedFacts, Record, RunFacts, facts_from_envelopes
from tests.support.facts import facts_from_view as view_facts
from tests.support.live import KEY
from tests.support.matrix import NODE_WITHIN, Kind, ProducedRun
from tests.support.node import run_node_script
from tests.support.processes import REPO
from tests.support.sse import SseEvent, sse

__all__ = ["SURFACES", "Reading", "Surface", "surface_named"]

Reading = dict[str, RunFacts | BaseException]
"""What a surface showed of each run (by execution id), or why it could not be read."""
Reader = Callable[[Sequence[ProducedRun]], Awaitable[Reading]]

ALL = frozenset(FACTS)
WITHIN = 60.0  # seconds a surface has to show one run (a bound, on a loaded machine)


@dataclass(frozen=True)
class Surface:
    """A column of the matrix.

    Args:
        name: its id in test names.
        title: its column in docs/protocol.md.
        read: reads the runs of one backend.
        carries: the facts it shows (the others it does not: not compared).
        clip: facts it shows only the first characters of, and what follows a cut.
        not_for: why it does not apply to a kind (None: it does).
        when_failed: facts it does not show of a failed run.
    """

    name: str
    title: str
    read: Reader
    carries: frozenset[str]
    clip: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    not_for: Callable[[Kind], str | None] = lambda kind: None
    when_failed: frozenset[str] = frozenset()

    def facts_for(self, status: str | None) -> list[str]:
        """The facts compared for a run that ended with ``status``."""
        shown = self.carries - (self.when_failed if status == "failed" else frozenset())
        return [name for name in FACTS if name in shown]


async def _each(
    runs: Sequence[ProducedRun],
    read: Callable[[ProducedRun], Awaitable[RunFacts]],
    *,
    at_once: int = 16,
    within: float = WITHIN,
) -> Reading:
    """``read`` every run, ``at_once`` at a time, each within ``within`` seconds."""
    slots = asyncio.Semaphore(at_once)

    async def one(run: ProducedRun) -> RunFacts | BaseException:
        async with slots:
            try:
                return await asyncio.wait_for(read(run), within)
            except Exception as exc:  # reported in that run's cell
                return exc

    found = await asyncio.gather(*(one(run) for run in runs))
    return {run.execution_id: facts for run, facts in zip(runs, found, strict=True)}


def _node_batch(
    results: Sequence[Mapping[str, Any]],
    runs: Sequence[ProducedRun],
    facts: Callable[[Mapping[str, Any]], RunFacts],
) -> Reading:
    reading: Reading = {}
    for run, result in zip(runs, results, strict=True):
        try:
            reading[run.execution_id] = facts(result)
        except Exception as exc:  # reported in that run's cell
            reading[run.execution_id] = exc
    return reading


# -- Pusher WebSocket: the two kits ------------------------------------------------------


def _run_of(session: Mapping[str, Any], execution_id: str) -> Mapping[str, Any]:
    """The run ``execution_id`` of a kit's ``SessionView`` (each run apart)."""
    runs = [run for run in session["runs"] if run["execution_id"] == execution_id]
    held = [run["execution_id"] for run in session["runs"]]
    assert len(runs) == 1, f"run {execution_id} is not one run of the session view: {held}"
    return runs[0]


async def _python_kit(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        session = create_session_view(run.session_id)
        async with watch_session(run.url, run.session_id, since=run.since, key=KEY) as watch:
            async for envelope in watch:
                session = reduce_session(session, envelope, watch.position)
        view = _run_of(session, run.execution_id)
        return view_facts(view, final_text(dict(view)))

    return await _each(runs, read)


async def _ts_kit(runs: Sequence[ProducedRun]) -> Reading:
    reading: Reading = {}
    for url in sorted({run.url for run in runs}):
        mine = [run for run in runs if run.url == url]
        wanted = json.dumps([[run.session_id, run.since, run.execution_id] for run in mine])
        report, err = await run_node_script(
            "kit_watch.mjs",
            url,
            KEY,
            wanted,
            package="pusher-js",
            what="the Node clients",
            within=NODE_WITHIN,
        )
        assert report["ok"], (report.get("error"), err)

        def facts(result: Mapping[str, Any]) -> RunFacts:
            assert result["state"] == "ended", (result["state"], result["error"])
            view = result["run"]
            assert view is not None, f"not one run of the session view: {result['runs']}"
            return view_facts(view, result["finalText"])

        reading.update(_node_batch(report["results"], mine, facts))
    return reading


# -- server-sent events -------------------------------------------------------------------


async def _sse_records(url: str, until_final: bool) -> list[Record]:
    """The envelopes of an SSE stream: to its end (``until_final``: the server ends it),
    else to the first final status of a run that is not nested (the follower ends)."""
    records: list[Record] = []
    async with sse(url) as reader:
        while True:
            try:
                item: SseEvent = await reader.next(WITHIN)
            except EOFError:
                if until_final:
                    return records
                raise
            if item.comment is not None:
                assert not item.comment.startswith("ended") or until_final, item.comment
                continue
            if not item.event.startswith("agent."):
                continue
            envelope = item.json
            records.append((item.id, envelope))
            payload = envelope["payload"]
            final = item.event == "agent.status" and payload["status"] in ("completed", "failed")
            if final and not until_final and payload.get("parent_execution_id") is None:
                return records
    return records  # pragma: no cover (the loop returns)


async def _sse_since(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        url = f"{run.url}/api/sessions/{run.session_id}/events?since={run.since}"
        return facts_from_envelopes(await _sse_records(url, until_final=False))

    return await _each(runs, read)


async def _sse_until_final(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        url = f"{run.url}/api/sessions/{run.session_id}/events?since={run.since}&until=final"
        return _ended_at_its_end(await _sse_records(url, until_final=True))

    return await _each(runs, read)


def _ended_at_its_end(records: Sequence[Record]) -> RunFacts:
    """The facts of a follow that ends by itself at its run's end: right after the run's
    own final status, not before (a nested run's), not after (a later run's)."""
    facts = facts_from_envelopes(records)
    last = records[-1][0] if records else None
    return facts if last == facts.end else replace(facts, end=f"the follow ended at {last}")


def _ended_at_a_runs_end(records: Sequence[Record], execution_id: str) -> RunFacts:
    """The facts of run ``execution_id`` in a follow that goes on to the session's latest
    run: it must end right after a run's own final status (not a nested run's)."""
    facts = facts_from_envelopes(records, execution_id)
    last = records[-1][1] if records else {}
    payload = last.get("payload") or {}
    ended = (
        last.get("type") == "agent.status"
        and payload.get("status") in ("completed", "failed")
        and payload.get("parent_execution_id") is None
    )
    return facts if ended else replace(facts, end=f"the follow ended at {records[-1][0]}")


# -- AG-UI (@ag-ui/client's HttpAgent, its verification on) ------------------------------


def agui_facts(report: Mapping[str, Any]) -> RunFacts:
    """The facts of an AG-UI run as ``@ag-ui/client`` received and built it."""
    assert report["warnings"] == [], report["warnings"]
    events: list[dict[str, Any]] = report["events"]
    started = events[0]
    assert started["type"] == "RUN_STARTED", started
    end = events[-1]
    status, stop_reason, error, tokens = "in_progress", None, None, {}
    if end["type"] == "RUN_FINISHED":
        status, stop_reason = "completed", end["result"].get("stop_reason")
        usage = end.get("usage") or [{}]
        tokens = usage[0]
    elif end["type"] == "RUN_ERROR":
        status, stop_reason, error = "failed", end.get("code"), end.get("message")
    messages = report.get("messages") or []
    said = [m["content"] for m in messages if m["role"] == "assistant" and m.get("content")]
    calls = {
        c["id"] for m in messages if m["role"] == "assistant" for c in m.get("toolCalls") or []
    }
    phases = {
        e["value"]["tool_call_id"]
        for e in events
        if e["type"] == "CUSTOM" and e["name"] == "agent.routing"
    }
    steps = {e["stepName"] for e in events if e["type"] == "STEP_STARTED"}
    return RunFacts(
        execution_id=started["runId"],
        status=status,
        stop_reason=stop_reason,
        final_text=(said[-1] if said else "") if status == "completed" else None,
        error=error,
        steps=len(steps),
        tool_calls=len(calls),
        routing_phases=len(phases),
        input_tokens=tokens.get("inputTokens"),
        output_tokens=tokens.get("outputTokens"),
        total_tokens=tokens.get("totalTokens"),
    )


async def _agui(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        assert run.agui is not None
        return agui_facts(run.agui)

    return await _each(runs, read)


def _started_through_agui(kind: Kind) -> str | None:
    if kind.framework is not None:
        return "AG-UI starts the demo's agent; a framework's run is published by its own process"
    return None


# -- the Vercel AI SDK's transport --------------------------------------------------------


def vercel_facts(result: Mapping[str, Any]) -> RunFacts:
    """The facts of a run as the ``ai`` package's ``DefaultChatTransport`` and
    ``readUIMessageStream`` built its message."""
    message = result["message"]
    parts: list[dict[str, Any]] = message["parts"]
    status_part = next((p["data"] for p in parts if p["type"] == "data-status"), {})
    status = status_part.get("status", "in_progress")
    texts = [p["text"] for p in parts if p["type"] == "text"]
    usage = (message.get("metadata") or {}).get("usage") or {}
    return RunFacts(
        execution_id=message["id"],
        status=status,
        stop_reason=status_part.get("stop_reason"),
        final_text=(texts[-1] if texts else "") if status == "completed" else None,
        error=status_part.get("error_message"),
        steps=sum(p["type"] == "step-start" for p in parts),
        tool_calls=sum(p["type"] == "dynamic-tool" for p in parts),
        routing_phases=sum(p["type"] == "data-routing" for p in parts),
        input_tokens=usage.get("inputTokens"),
        output_tokens=usage.get("outputTokens"),
        total_tokens=usage.get("totalTokens"),
    )


async def _vercel(runs: Sequence[ProducedRun]) -> Reading:
    reading: Reading = {}
    for url in sorted({run.url for run in runs}):
        mine = [run for run in runs if run.url == url]
        wanted = json.dumps([[run.session_id, run.since] for run in mine])
        report, err = await run_node_script(
            "vercel_ai_client.mjs",
            "replay",
            f"{url}/vercel-ai",
            wanted,
            package="ai",
            what="the ai package",
            within=NODE_WITHIN,
        )
        assert report["ok"], (report.get("error"), report.get("results"), err)
        reading.update(_node_batch(report["results"], mine, vercel_facts))
    return reading


# -- the trace: JSON, and OTLP parsed with the protobuf schema ---------------------------


async def _get(url: str, **params: str) -> Any:
    async with httpx.AsyncClient(timeout=WITHIN) as http:
        response = await http.get(url, params=params)
    assert response.status_code == 200, (url, response.status_code, response.text)
    return response.json()


async def _trace_json(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        url = f"{run.url}/api/sessions/{run.session_id}/trace"
        body = await _get(url, execution_id=run.execution_id)
        records = [(e["position"], e["envelope"]) for e in body["envelopes"]]
        return facts_from_envelopes(records, body["execution_id"])

    return await _each(runs, read)


def parse_otlp(document: Mapping[str, Any]) -> Any:
    """``document`` (OTLP/JSON) parsed strictly with the protobuf schema of
    ``opentelemetry-proto`` (``TracesData``; an unknown field is an error). OTLP/JSON
    writes ids in hex, not base64 as proto3 JSON does; enums must be integers (the
    parser would take their names too, so that is checked here)."""
    from google.protobuf import json_format
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    copy = json.loads(json.dumps(document))
    for resource in copy.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for name, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                    if span.get(name):
                        raw = bytes.fromhex(span[name])
                        assert len(raw) == size, f"{name} {span[name]!r}: not {size} bytes"
                        span[name] = base64.b64encode(raw).decode()
                assert isinstance(span.get("kind"), int), f"span kind {span.get('kind')!r}"
                code = (span.get("status") or {}).get("code")
                assert code is None or isinstance(code, int), f"status code {code!r}"
    return json_format.Parse(json.dumps(copy), TracesData(), ignore_unknown_fields=False)


def _attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in span.attributes:
        which = item.value.WhichOneof("value")
        values[item.key] = getattr(item.value, which) if which else None
    return values


def otlp_facts(data: Any) -> RunFacts:
    """The facts of one run's OTLP trace (``TracesData``): one trace, one root agent
    span; a nested run is an agent span under an ``execute_tool`` span of the run."""
    spans = [s for r in data.resource_spans for sc in r.scope_spans for s in sc.spans]
    traces = {s.trace_id for s in spans}
    assert len(traces) == 1, f"{len(traces)} traces, not one: {[s.name for s in spans]}"
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == 1, f"{len(roots)} root spans: {[s.name for s in roots]}"
    by_id = {s.span_id: s for s in spans}
    children: dict[bytes, list[Any]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)

    def agent_of(span: Any) -> Any:
        parent = by_id.get(span.parent_span_id)
        while parent is not None and not parent.name.startswith("invoke_agent"):
            parent = by_id.get(parent.parent_span_id)
        return parent

    def owned(agent: Any, prefix: str) -> list[Any]:
        return [s for s in spans if s.name.startswith(prefix) and agent_of(s) is agent]

    def nested(agent: Any) -> list[NestedFacts]:
        found = []
        for tool in owned(agent, "execute_tool "):
            for inner in children.get(tool.span_id, []):
                if not inner.name.startswith("invoke_agent"):
                    continue
                attrs = _attributes(inner)
                found.append(
                    NestedFacts(
                        str(attrs.get("agent_broadcaster.execution_id")),
                        str(_attributes(tool).get("gen_ai.tool.call.id")),
                        str(attrs.get("agent_broadcaster.status")),
                        attrs.get("agent_broadcaster.stop_reason"),
                        len(owned(inner, "chat ")),
                        len(owned(inner, "execute_tool ")),
                    )
                )
        return sorted(found, key=lambda n: n.execution_id)

    root = roots[0]
    attrs = _attributes(root)
    status = attrs.get("agent_broadcaster.status", "in_progress")
    error = root.status.message if status == "failed" else None
    return RunFacts(
        execution_id=attrs.get("agent_broadcaster.execution_id"),
        status=status,
        stop_reason=attrs.get("agent_broadcaster.stop_reason"),
        error=error,
        steps=len(owned(root, "chat ")),
        tool_calls=len(owned(root, "execute_tool ")),
        routing_phases=len(owned(root, "routing ")),
        input_tokens=attrs.get("gen_ai.usage.input_tokens"),
        output_tokens=attrs.get("gen_ai.usage.output_tokens"),
        nested=tuple(nested(root)),
    )


async def _otlp(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        url = f"{run.url}/api/sessions/{run.session_id}/trace"
        document = await _get(url, execution_id=run.execution_id, format="otlp")
        return otlp_facts(parse_otlp(document))

    return await _each(runs, read)


# -- the stored state, the run index -------------------------------------------------------


def state_facts(snapshot: Mapping[str, Any]) -> RunFacts:
    """The facts of a session's stored final state (its latest run's)."""
    decision = snapshot.get("last_continuation") or {}
    steps = snapshot.get("steps") or []
    said = [
        m["content"]
        for m in snapshot.get("messages") or []
        if m.get("role") == "assistant" and m.get("content")
    ]
    status = snapshot.get("status")
    return RunFacts(
        status=status,
        stop_reason=decision.get("stop_reason"),
        final_text=(said[-1] if said else "") if status == "completed" else None,
        error=snapshot.get("error_message"),
        steps=len(steps),
        tool_calls=sum(len(step.get("tool_calls") or []) for step in steps),
        total_tokens=sum(int((step.get("usage") or {}).get("total") or 0) for step in steps),
    )


async def _state(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        return state_facts(await _get(f"{run.url}/api/sessions/{run.session_id}/state"))

    return await _each(runs, read)


def _latest_only(kind: Kind) -> str | None:
    if not kind.latest:
        return "the stored state is the session's latest run's (see the next kind)"
    return None


def index_facts(row: Mapping[str, Any]) -> RunFacts:
    """The facts of a run index row (``RunSummary``)."""
    tokens = row.get("tokens") or {}
    return RunFacts(
        execution_id=row.get("execution_id"),
        status=row.get("status"),
        stop_reason=row.get("stop_reason"),
        error=row.get("error"),
        steps=row.get("steps"),
        tool_calls=row.get("tool_calls"),
        routing_phases=row.get("routing_phases"),
        input_tokens=tokens.get("input"),
        output_tokens=tokens.get("output"),
        total_tokens=tokens.get("total"),
        start=row.get("first_position"),
        end=row.get("last_position"),
    )


def _index(path: Callable[[ProducedRun], tuple[str, dict[str, str]]]) -> Reader:
    """A reader of the run index row of each run, from the answer at ``path``."""

    async def read_all(runs: Sequence[ProducedRun]) -> Reading:
        async def read(run: ProducedRun) -> RunFacts:
            where, params = path(run)
            body = await _get(f"{run.url}{where}", **params)
            rows = [r for r in body["runs"] if r["execution_id"] == run.execution_id]
            assert len(rows) == 1, body
            return index_facts(rows[0])

        return await _each(runs, read)

    return read_all


_index_list = _index(lambda run: ("/api/sessions", {"q": run.execution_id}))
_index_session = _index(lambda run: (f"/api/sessions/{run.session_id}/runs", {}))


# -- agent-broadcaster tail --json ----------------------------------------------------------


EXITS = {0: "completed", 1: "failed"}


async def _tail(runs: Sequence[ProducedRun]) -> Reading:
    async def read(run: ProducedRun) -> RunFacts:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "broadcaster",
            "tail",
            run.session_id,
            "--url",
            run.url,
            "--since",
            run.since,
            "--key",
            KEY,
            "--json",
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate()
        finally:
            if proc.returncode is None:  # timed out: not left running
                proc.kill()
                await proc.wait()
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        result = next((line for line in lines if line.get("type") == "tail.result"), None)
        assert result is not None, (proc.returncode, lines[-3:], err.decode()[-2000:])
        records = [(line["position"], line["envelope"]) for line in lines if "envelope" in line]
        facts = _ended_at_a_runs_end(records, run.execution_id)
        if not run.kind.latest:  # tail follows to the session's latest run, says its end
            return facts
        # The status is what the exit code says, when the result line agrees with it.
        said = EXITS.get(proc.returncode or 0, f"exit {proc.returncode}")
        if (result["status"], result["execution_id"]) != (said, run.execution_id):
            said = f"exit {proc.returncode}, result {result['status']} of {result['execution_id']}"
        return replace(facts, status=said)

    # A Python process each (a second or two of start-up): a few at a time.
    return await _each(runs, read, at_once=3, within=60)


# -- the dashboard's pages in Chromium -------------------------------------------------------


PAGE_FACTS = frozenset(
    {
        "execution_id",
        "status",
        "stop_reason",
        "final_text",
        "error",
        "steps",
        "tool_calls",
        "total_tokens",
    }
)
"""What the pages carry in ``#run-facts`` (docs/operations.md, "The live dashboard")."""


def page_facts(data: Mapping[str, str]) -> RunFacts:
    """The facts of the run a page shows, from the data-* attributes of ``#run-facts``."""
    status = data.get("status")
    return RunFacts(
        execution_id=data.get("executionId"),
        status=status,
        stop_reason=data.get("stopReason") or None,
        final_text=data.get("finalText") if status == "completed" else None,
        error=data.get("error") or None,
        steps=int(data.get("steps") or 0),
        tool_calls=int(data.get("toolCalls") or 0),
        total_tokens=int(data.get("tokens") or 0),
    )


PageAddress = Callable[[ProducedRun], tuple[str, str]]
"""The page of a run: its URL, and the selector that is there once it shows the run."""


def _pages(address: PageAddress) -> Reader:
    """A reader of the facts a page of the dashboard shows of each run (Chromium, the
    ``#run-facts`` data attributes once ``address``'s selector is there)."""

    async def read_all(runs: Sequence[ProducedRun]) -> Reading:
        from playwright.async_api import async_playwright

        from tests.support.pages import CHROMIUM_ARGS, WAIT_MS, require_chromium

        executable = require_chromium()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=executable, args=CHROMIUM_ARGS, headless=True
            )

            async def read(run: ProducedRun) -> RunFacts:
                context = await browser.new_context()
                try:
                    page = await context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda error: errors.append(str(error)))
                    url, shown = address(run)
                    await page.goto(url)
                    await page.wait_for_selector(shown, state="attached", timeout=WAIT_MS)
                    assert not errors, f"JavaScript errors on the page: {errors}"
                    data = await page.eval_on_selector("#run-facts", "node => ({...node.dataset})")
                    return page_facts(data)
                finally:
                    await context.close()

            try:
                return await _each(runs, read, at_once=2)
            finally:
                await browser.close()

    return read_all


def _run_page(run: ProducedRun) -> tuple[str, str]:
    query = f"session={run.session_id}&execution={run.execution_id}"
    return f"{run.url}/demo/run.html?{query}", f'body[data-rendered="{run.execution_id}"]'


def _live_page(run: ProducedRun) -> tuple[str, str]:
    """Attached to the session: its latest run, once reconciled with the stored state."""
    shown = f'#run-facts[data-execution-id="{run.execution_id}"]'
    verdicts = ("in_sync", "differs", "superseded", "error")
    return (
        f"{run.url}/#session={run.session_id}",
        ", ".join(f'{shown}[data-reconcile="{verdict}"]' for verdict in verdicts),
    )


# -- the columns ------------------------------------------------------------------------------

_NO_START = ALL - {"start"}
_FOLDED = ALL
"""A surface that delivers the envelopes themselves carries every fact."""

SURFACES: tuple[Surface, ...] = (
    Surface("ws-python", "Pusher WS, Python kit", _python_kit, _NO_START),
    Surface("ws-ts", "Pusher WS, TS kit", _ts_kit, _NO_START),
    Surface("sse-since", "SSE `since`", _sse_since, _FOLDED),
    Surface("sse-until-final", "SSE `until=final`", _sse_until_final, _FOLDED),
    Surface(
        "agui",
        "AG-UI (`@ag-ui/client`)",
        _agui,
        frozenset(FACTS) - {"start", "end", "nested"},
        not_for=_started_through_agui,
        when_failed=frozenset({"input_tokens", "output_tokens", "total_tokens"}),
    ),
    Surface(
        "vercel-ai",
        "Vercel AI SDK transport",
        _vercel,
        frozenset(FACTS) - {"start", "end", "nested"},
    ),
    Surface("trace-json", "trace (JSON)", _trace_json, _FOLDED),
    Surface(
        "trace-otlp",
        "trace (OTLP, protobuf)",
        _otlp,
        frozenset(FACTS) - {"final_text", "total_tokens", "start", "end"},
    ),
    Surface(
        "state",
        "stored state",
        _state,
        frozenset(
            {"status", "stop_reason", "final_text", "error", "steps", "tool_calls", "total_tokens"}
        ),
        clip={"final_text": (2000, "...")},
        not_for=_latest_only,
    ),
    Surface(
        "index-list",
        "run index (list)",
        _index_list,
        frozenset(FACTS) - {"final_text", "nested"},
        clip={"error": (500, "")},
    ),
    Surface(
        "index-session",
        "run index (session's runs)",
        _index_session,
        frozenset(FACTS) - {"final_text", "nested"},
        clip={"error": (500, "")},
    ),
    Surface("tail-json", "`tail --json` + exit code", _tail, _FOLDED),
    Surface(
        "live-page",
        "live dashboard (Chromium)",
        _pages(_live_page),
        PAGE_FACTS,
        not_for=_latest_only,
    ),
    Surface("run-page", "run page (Chromium)", _pages(_run_page), PAGE_FACTS),
)


def surface_named(name: str) -> Surface:
    return next(surface for surface in SURFACES if surface.name == name)
