"""A STAND-IN for the run index endpoints of issue 31, for the dashboard's browser tests
until the server's own endpoints land (they are built on another branch).

It serves exactly the HTTP contract (/work/wt/issue-31-contract.md, summarised in
docs/operations.md): ``GET /api/sessions`` (filters, cursor, ``ETag`` /
``If-None-Match``), ``GET /api/sessions/{id}/runs`` and ``GET
/api/sessions/{id}/trace?execution_id=…&format=json|otlp``, from envelopes recorded
from real runs (the golden runs in ``tests/fixtures/runs/``). Private sessions are left
out of lists and refused (403) without their token, as the contract says; the app's
signature is not modelled (the tests look from a stranger's side).

The browser loads the pages from a real demo server; the tests route only these three
paths to this app (:func:`route_index`). After the server endpoints merge, drop the
routing (and this file) and record the runs on the real server instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from playwright.sync_api import BrowserContext, Route
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from broadcaster.client import create_run_view, reduce_run_all

__all__ = ["IndexStandIn", "RecordedRun", "golden_records", "long_run", "route_index"]

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
Record = dict[str, Any]


def golden_records(name: str) -> tuple[list[Record], dict[str, Any] | None]:
    """The ``{position, envelope}`` records of the golden run ``name`` (snapshot ops
    dropped) and its stored state."""
    fixture = json.loads((RUNS / f"{name}.json").read_text(encoding="utf-8"))
    records = [
        {"position": op["position"], "envelope": op["envelope"]}
        for op in fixture["ops"]
        if "envelope" in op
    ]
    return records, fixture["snapshot"]


def renamed(records: list[Record], session_id: str) -> list[Record]:
    """The records as if published on session ``session_id`` (ids only)."""
    return [
        {"position": r["position"], "envelope": {**r["envelope"], "session_id": session_id}}
        for r in records
    ]


def long_run(envelopes: int, session_id: str = "s-long-run") -> list[Record]:
    """A run of exactly ``envelopes`` records (at least 12) made from the golden
    ``completed`` run's envelopes: its first step (text chunks, a tool call, the
    continuation decision) repeated with the step number, call id, timestamps and
    positions moved on, between its first and last ``agent.status``."""
    records, _ = golden_records("completed")
    first, last = records[0]["envelope"], records[-1]["envelope"]
    kinds = ("agent.stream.chunk", "agent.tool.started", "agent.tool.completed")
    template = [r["envelope"] for r in records if r["envelope"]["payload"].get("step_number") == 1]
    started = next(e for e in template if e["type"] == "agent.step.started")
    body = [e for e in template if e["type"] in kinds]
    closing = [e for e in template if e["type"] in ("agent.continuation", "agent.step.completed")]
    origin = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00"))
    out: list[dict[str, Any]] = []

    def emit(envelope: dict[str, Any], payload: dict[str, Any]) -> None:
        at = origin.timestamp() + len(out) * 0.002
        stamp = datetime.fromtimestamp(at, tz=origin.tzinfo).isoformat(timespec="milliseconds")
        out.append(
            {
                **envelope,
                "session_id": session_id,
                "timestamp": stamp.replace("+00:00", "Z"),
                "payload": payload,
            }
        )

    emit(first, dict(first["payload"]))
    step = 0
    while len(out) < envelopes - 1:
        step += 1
        room = envelopes - 1 - len(out)
        emit(started, {**started["payload"], "step_number": step})
        for envelope in body:
            if len(out) >= envelopes - 1 - len(closing):
                break
            payload = {**envelope["payload"], "step_number": step}
            if "tool_call_id" in payload:
                payload["tool_call_id"] = f"call_{step}"
            emit(envelope, payload)
        if room > len(body) + len(closing) + 1:
            for index in range(room - len(body) - len(closing) - 1 if room < 40 else 4):
                chunk = next(e for e in body if e["type"] == "agent.stream.chunk")
                payload = {**chunk["payload"], "step_number": step, "chunk_index": 100 + index}
                payload["chunk"] = f" more text {index}."
                emit(chunk, payload)
        for envelope in closing:
            payload = {**envelope["payload"], "step_number": step}
            if "tool_calls" in payload:
                payload["tool_calls"] = [
                    {**ref, "id": f"call_{step}"} for ref in payload["tool_calls"]
                ]
            emit(envelope, payload)
    emit(last, {**last["payload"], "step_count": step})
    epoch = "10e90000"
    return [
        {"position": f"{epoch}:{index + 1}", "envelope": envelope}
        for index, envelope in enumerate(out[:envelopes])
    ]


def _unix(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


@dataclass
class RecordedRun:
    """One run's envelopes (one execution), and what the index says about it."""

    records: list[Record]
    input_preview: str = ""
    private: bool = False
    token: str | None = None
    summary: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.summary = self.summarize()

    @property
    def session_id(self) -> str:
        return str(self.records[0]["envelope"]["session_id"])

    @property
    def execution_id(self) -> str:
        return str(self.records[0]["envelope"]["execution_id"])

    def summarize(self) -> dict[str, Any]:
        """The RunSummary of the contract, folded with the Python client's reducer."""
        view = reduce_run_all(create_run_view(self.session_id), self.records)
        status = view["status"] if view["status"] in ("completed", "failed") else "running"
        steps = view["steps"]
        actors = [step["actor"] for step in steps if step.get("actor")]
        usage = view["usage"]
        error = view["error"]
        return {
            "session_id": self.session_id,
            "execution_id": self.execution_id,
            "started_at": _unix(view["started_at"]),
            "ended_at": _unix(view["ended_at"]) if status != "running" else None,
            "status": status,
            "stop_reason": view["stop_reason"],
            "resolved_by": view["resolved_by"],
            "steps": sum(1 for step in steps if step["completed"]),
            "tool_calls": sum(len(step["tools"]) for step in steps),
            "tokens": {
                "input": usage["prompt"],
                "output": usage["completion"],
                "total": usage["total"],
            },
            "capability": actors[0] if actors else None,
            "error": error[:500] if error else None,
            "input_preview": self.input_preview[:200],
            "private": self.private,
            "first_position": self.records[0]["position"],
            "last_position": self.records[-1]["position"],
        }


def split(records: list[Record]) -> list[list[Record]]:
    """Records split into runs by execution id, in order."""
    runs: dict[str, list[Record]] = {}
    for record in records:
        runs.setdefault(record["envelope"]["execution_id"], []).append(record)
    return list(runs.values())


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class IndexStandIn:
    """The index endpoints over :attr:`runs` (tests add and replace runs while the page
    polls; :meth:`add` / :meth:`replace`)."""

    STATUSES = ("running", "completed", "failed")

    def __init__(self) -> None:
        self.runs: list[RecordedRun] = []
        self.requests: list[tuple[str, int]] = []  # (path?query, status answered)
        self.app = Starlette(
            routes=[
                HttpRoute("/api/sessions", self.sessions, methods=["GET"]),
                HttpRoute("/api/sessions/{session_id}/runs", self.session_runs, methods=["GET"]),
                HttpRoute("/api/sessions/{session_id}/trace", self.trace, methods=["GET"]),
            ]
        )

    def add(self, run: RecordedRun) -> RecordedRun:
        self.runs.append(run)
        return run

    def replace(self, old: RecordedRun, new: RecordedRun) -> None:
        self.runs[self.runs.index(old)] = new

    # --- helpers -----------------------------------------------------------------------

    def _answer(self, request: Request, response: Response) -> Response:
        self.requests.append(
            (str(request.url.path) + "?" + request.url.query, response.status_code)
        )
        return response

    @staticmethod
    def _token(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        return request.query_params.get("token")

    def _session(self, request: Request) -> tuple[list[RecordedRun], Response | None]:
        session_id = request.path_params["session_id"]
        runs = [run for run in self.runs if run.session_id == session_id]
        if not runs:
            return [], _error(404, f"unknown session {session_id!r}")
        if any(run.private for run in runs) and self._token(request) != runs[0].token:
            return [], _error(403, "this session is private: its token is needed")
        return runs, None

    # --- endpoints ---------------------------------------------------------------------

    async def sessions(self, request: Request) -> Response:
        query = request.query_params
        try:
            limit = int(query.get("limit", "50"))
        except ValueError:
            return self._answer(request, _error(400, "limit must be an integer 1..200"))
        if not 1 <= limit <= 200:
            return self._answer(request, _error(400, "limit must be an integer 1..200"))
        status = query.get("status")
        if status is not None and status not in self.STATUSES:
            return self._answer(
                request, _error(400, "status must be one of running, completed, failed")
            )
        bounds: dict[str, float] = {}
        for name in ("from", "to"):
            if name in query:
                try:
                    bounds[name] = float(query[name])
                except ValueError:
                    return self._answer(request, _error(400, f"{name} must be unix seconds"))
        text = query.get("q", "")
        if len(text) > 200:
            return self._answer(request, _error(400, "q is longer than 200 characters"))
        offset = 0
        if "cursor" in query:
            try:
                offset = int(base64.urlsafe_b64decode(query["cursor"].encode()).decode())
            except ValueError:
                return self._answer(request, _error(400, "cursor is not one this server gave"))
        matching = []
        for run in self.runs:
            s = run.summary
            if run.private:
                continue  # a stranger's list: private sessions are left out
            if status and s["status"] != status:
                continue
            if "stop_reason" in query and s["stop_reason"] != query["stop_reason"]:
                continue
            if "resolved_by" in query and s["resolved_by"] != query["resolved_by"]:
                continue
            if "from" in bounds and s["started_at"] < bounds["from"]:
                continue
            if "to" in bounds and s["started_at"] > bounds["to"]:
                continue
            haystack = f"{s['input_preview']}\n{s['session_id']}\n{s['execution_id']}".lower()
            if text and text.lower() not in haystack:
                continue
            matching.append(s)
        matching.sort(key=lambda s: s["started_at"], reverse=True)
        page = matching[offset : offset + limit]
        more = offset + limit < len(matching)
        cursor = base64.urlsafe_b64encode(str(offset + limit).encode()).decode() if more else None
        body = orjson.dumps({"runs": page, "next_cursor": cursor})
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if request.headers.get("if-none-match") == etag:
            return self._answer(request, Response(status_code=304, headers={"ETag": etag}))
        return self._answer(
            request, Response(body, media_type="application/json", headers={"ETag": etag})
        )

    async def session_runs(self, request: Request) -> Response:
        runs, refused = self._session(request)
        if refused is not None:
            return self._answer(request, refused)
        ordered = sorted((run.summary for run in runs), key=lambda s: s["started_at"])
        body = {"session_id": request.path_params["session_id"], "runs": ordered}
        return self._answer(request, JSONResponse(body))

    async def trace(self, request: Request) -> Response:
        runs, refused = self._session(request)
        if refused is not None:
            return self._answer(request, refused)
        execution_id = request.query_params.get("execution_id")
        if not execution_id:
            return self._answer(request, _error(400, "execution_id is required"))
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "otlp"):
            return self._answer(request, _error(400, "format must be json or otlp"))
        run = next((r for r in runs if r.execution_id == execution_id), None)
        if run is None:
            return self._answer(request, _error(404, f"unknown execution {execution_id!r}"))
        name = f"{run.session_id}-{run.execution_id}"
        if fmt == "otlp":
            disposition = f'attachment; filename="{name}.otlp.json"'
            return self._answer(
                request,
                JSONResponse(otlp(run.records), headers={"Content-Disposition": disposition}),
            )
        body = {
            "session_id": run.session_id,
            "execution_id": run.execution_id,
            "trimmed": False,
            "summary": run.summary,
            "envelopes": run.records,
        }
        disposition = f'attachment; filename="{name}.json"'
        return self._answer(
            request, JSONResponse(body, headers={"Content-Disposition": disposition})
        )


def otlp(records: list[Record]) -> dict[str, Any]:
    """OTLP/JSON of the run from the existing mapping (agent_core/integrations/otel.py)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_core.integrations.otel import EnvelopeTracer
    from broadcaster.envelope import parse_envelope

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = EnvelopeTracer(provider)
    for record in records:
        tracer.feed(parse_envelope(record["envelope"]))
    provider.shutdown()
    message = MessageToDict(encode_spans(exporter.get_finished_spans()))
    return dict(message)


INDEX_PATHS = re.compile(r"^/api/sessions(?:/[^/]+/(?:runs|trace))?$")


def route_index(context: BrowserContext, standin_url: str) -> None:
    """Send the browser's requests for the index endpoints (only those) to the stand-in
    at ``standin_url``; everything else reaches the real server."""

    def forward(route: Route) -> None:
        url = route.request.url
        path_and_query = url.split("/", 3)[3]
        response = route.fetch(url=f"{standin_url}/{path_and_query}", max_redirects=0)
        route.fulfill(response=response)

    context.route(lambda url: INDEX_PATHS.match(url_path(url)) is not None, forward)


def url_path(url: str) -> str:
    rest = url.split("://", 1)[-1]
    path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
    return path.split("?", 1)[0].split("#", 1)[0]
