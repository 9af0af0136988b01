"""Runs of exact content for the dashboard's tests and bench, put on a REAL server.

Most runs the sessions and run pages are tested on are started for real (``POST /run``
on a demo server). A few tests need a run of exact content (2,000 envelopes, hostile
text, the golden run's timings): its envelopes, recorded from real runs
(``tests/fixtures/runs/*.json``), are published to the server through the signed Pusher
HTTP API (:class:`~broadcaster.publishers.PusherHTTPPublisher`) and its final state is
stored (``PUT .../channels/{channel}/state``), which is how an outside agent's run gets
into the server's run index (the state names the run: ``metadata.execution_id``).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from broadcaster.envelope import parse_envelope
from broadcaster.publishers import PusherHTTPPublisher

__all__ = ["Record", "golden_records", "long_run", "publish_run", "renamed", "trace_of"]

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
Record = dict[str, Any]
APP_ID, APP_KEY, APP_SECRET = "1", "agent-key", "agent-secret"  # the server's defaults


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


def publish_run(url: str, records: list[Record], input_text: str = "") -> dict[str, Any]:
    """Publish the records' envelopes on their session's public channel of the server at
    ``url`` (signed HTTP API), then store the run's final state, which indexes it; and
    answer the run's :func:`trace_of` (the envelopes with the positions they got)."""
    first = records[0]["envelope"]
    session_id, execution_id = first["session_id"], first["execution_id"]
    final = records[-1]["envelope"]["payload"]
    channel = f"agent.{session_id}"
    snapshot = {
        "agent_id": f"agent-{execution_id}",
        "status": final.get("status", "completed"),
        "step_count": final.get("step_count", 0),
        "usage": final.get("usage") or {"prompt": 0, "completion": 0, "total": 0},
        "execution": {"updated_at": records[-1]["envelope"]["timestamp"]},
        "steps": [],
        "error_message": final.get("error_message"),
        "messages": [{"role": "user", "content": input_text, "metadata": {}}],
        "metadata": {"execution_id": execution_id},
    }

    async def send() -> None:
        async with PusherHTTPPublisher(url, APP_ID, APP_KEY, APP_SECRET, timeout=30) as pusher:
            for record in records:
                await pusher.broadcast(channel, parse_envelope(record["envelope"]))
            await pusher.save(channel, json.dumps(snapshot).encode())

    # In a thread of its own: playwright's sync API keeps an event loop in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(send())).result()
    return trace_of(url, session_id, execution_id)


def trace_of(url: str, session_id: str, execution_id: str, **params: str) -> dict[str, Any]:
    """The run's trace from the server's ``GET /api/sessions/{id}/trace`` (JSON)."""
    answer = httpx.get(
        f"{url}/api/sessions/{session_id}/trace",
        params={"execution_id": execution_id, **params},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())
