"""Runs over HTTP and their envelopes over a Pusher client: start a run, subscribe,
read the run to its final status, and the routed-run helpers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import jsonschema

from broadcaster.envelope import json_schema
from tests.support.live import Client, LiveServer

JSON = {"content-type": "application/json"}  # run-start doors take only JSON (415)


# Built once: jsonschema.validate() re-checks the schema itself on every call.
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


Connect = Callable[..., Awaitable[Client]]


Event = tuple[str, str, Any]  # (position, type, payload)


async def start_run(base_url: str, **body: Any) -> dict[str, Any]:
    body.setdefault("input", "What is the weather in Oslo?")
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{base_url}/run", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def read_run(client: Client, *, stop_after: int | None = None) -> list[Event]:
    """Channel events until the run's final agent.status (or ``stop_after`` events)."""
    events: list[Event] = []
    while stop_after is None or len(events) < stop_after:
        message = await client.recv(within=10)
        if not message["event"].startswith("agent."):
            continue
        envelope = message["data"]
        VALIDATOR.validate(envelope)
        assert envelope["type"] == message["event"]
        events.append((message["position"], envelope["type"], envelope["payload"]))
        payload = envelope["payload"]
        nested = payload.get("parent_execution_id") is not None  # a nested run's end
        final = envelope["type"] == "agent.status" and payload["status"] in ("completed", "failed")
        if final and not nested:
            break
    return events


async def subscribe(client: Client, channel: str, position: str | None) -> None:
    fields = {} if position is None else {"position": position}
    answer = await client.subscribe(channel, **fields)
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer


async def resumed(client: Client) -> dict[str, Any]:
    """Skip to the resume answer (missed events come before it and are returned by
    read_run later, so this is only for a fresh subscription with nothing missed)."""
    message = await client.expect("broadcaster:resume")
    data: dict[str, Any] = message["data"]
    return data


def offsets(events: list[Event]) -> list[int]:
    return [int(position.rsplit(":", 1)[1]) for position, _, _ in events]


def stream(events: list[Event]) -> list[tuple[str, Any]]:
    return [(kind, payload) for _, kind, payload in events]


async def full_run(server_url: str, client: Client, **body: Any) -> tuple[dict[str, Any], list]:
    run = await start_run(server_url, **body)
    await subscribe(client, run["channel"], run["position"])
    return run, await read_run(client)


ROUTED_RUN = [
    ("agent.status", None),
    ("agent.tool.started", "intent_classifier"),
    ("agent.tool.completed", "intent_classifier"),
    ("agent.step.started", None),
    ("agent.tool.started", "weather_agent"),
    ("agent.tool.completed", "weather_agent"),
    ("agent.tool.started", "continuation_decider"),
    ("agent.tool.completed", "continuation_decider"),
    ("agent.continuation", None),
    ("agent.step.completed", None),
    ("agent.tool.started", "session_memory"),
    ("agent.tool.completed", "session_memory"),
    ("agent.status", None),
]


def phases(events: list[Event]) -> list[tuple[str, str | None]]:
    return [(kind, payload.get("tool_name")) for _, kind, payload in events]


def tool(events: list[Event], kind: str, name: str) -> dict[str, Any]:
    payload: dict[str, Any] = next(p for _, k, p in events if k == kind and p["tool_name"] == name)
    return payload


async def routed(url: str, client: Client, **body: Any) -> tuple[dict[str, Any], list[Event]]:
    run = await start_run(url, **body)
    await subscribe(client, run["channel"], run["position"])
    return run, await read_run(client)


async def authorise(live: LiveServer, socket_id: str, channel: str, token: str) -> httpx.Response:
    fields = {"socket_id": socket_id, "channel_name": channel, "session_token": token}
    async with httpx.AsyncClient() as http:
        return await http.post(f"{live.url}/broadcasting/auth", data=fields)


def complete_demo_run(base_url: str, text: str = "What is 6 * 7?") -> dict[str, Any]:
    """One run on a demo server through ``POST /run`` with ``wait``, as the README's
    tour does; it must complete. Returns the answer."""
    response = httpx.post(f"{base_url}/run", json={"input": text, "wait": True}, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["status"] == "completed", answer
    return answer
