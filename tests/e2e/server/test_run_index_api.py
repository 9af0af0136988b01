"""``GET /api/sessions``, ``/api/sessions/{id}/runs`` and ``/api/sessions/{id}/trace``
on real servers (memory, Redis, Redis Cluster), read as the dashboard and as a stranger
would read them."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from broadcaster.node import Node
from broadcaster.publication import Publication
from broadcaster.publishers import BackendStateStore
from broadcaster.run_index import RunSummary
from broadcaster.sessions import SCAN_BUDGET, claim_session
from broadcaster.signing import signed_params
from tests.support.live import LiveServer, StartServer, write_apps

CLOCK = itertools.count(time.time())
"""Start times a second apart: the list's order is the runs' start order."""

BACKENDS = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]


async def server_on(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest, **settings: Any
) -> LiveServer:
    if kind == "memory":
        return await start_server(**settings)
    topology = request.getfixturevalue("redis_server" if kind == "redis" else "redis_cluster")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return await start_server(backend=topology.url, redis_prefix=prefix, **settings)


async def record(node: Node, channel: str, execution_id: str, text: str, **end: Any) -> None:
    """One run on ``channel``: started, its envelopes published, ended."""
    app = node.apps[0]
    runs = BackendStateStore(node.backend, app.id).runs
    await runs.started(channel, execution_id, input_text=text, started_at=next(CLOCK))
    status = end.get("status", "completed")
    session = channel.rpartition(".")[2]
    payloads: list[tuple[str, dict[str, Any]]] = [
        ("agent.status", {"status": "in_progress"}),
        ("agent.step.started", {"step_number": 1}),
        (
            "agent.step.completed",
            {
                "step_number": 1,
                "has_tool_calls": False,
                "duration_ms": 3,
                "continuation": {
                    "should_continue": False,
                    "stop_reason": end.get("stop_reason", "done"),
                    "resolved_by": end.get("resolved_by", "Done"),
                },
            },
        ),
        (
            "agent.status",
            {
                "status": status,
                "step_count": 1,
                "stop_reason": end.get("stop_reason", "done"),
                "error_message": "it broke" if status == "failed" else None,
                "usage": {"prompt": 1, "completion": 2, "total": 3},
            },
        ),
    ]
    for kind, payload in payloads:
        data = {
            "type": kind,
            "session_id": session,
            "execution_id": execution_id,
            "timestamp": "2026-01-16T10:05:00.000Z",
            "payload": payload,
        }
        await node.backend.publish(Publication(app.id, channel, kind, json.dumps(data)))
    await runs.ended(channel, execution_id)


async def until(
    check: Callable[[], Awaitable[bool]], what: str, within: float = 20, every: float = 0.01
) -> None:
    """Poll ``check`` (an HTTP read) every ``every`` seconds until it holds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(every)


async def _is(value: Awaitable[str | None], expected: str) -> bool:
    return await value == expected


def signed(live: LiveServer, path: str, **query: str) -> dict[str, str]:
    app = live.node.apps[0]
    return signed_params(app.key, app.secret, "GET", path, extra=query)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_the_list_filters_pages_and_leaves_private_sessions_out(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest
) -> None:
    live = await server_on(kind, start_server, request)
    node = live.node
    await record(node, "agent.alpha", "a1", "Find the weather in Paris")
    await record(node, "agent.beta", "b1", "book a flight", status="failed", stop_reason="error")
    await record(node, "agent.alpha", "a2", "and in London?", resolved_by="MaxSteps")
    await record(node, "private-agent.secret", "s1", "my password is hunter2")
    gamma = BackendStateStore(node.backend, node.apps[0].id).runs
    await gamma.started("agent.gamma", "g1", started_at=next(CLOCK))

    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        everything = (await http.get("/api/sessions")).json()
        ids = [run["execution_id"] for run in everything["runs"]]
        assert ids == ["g1", "a2", "b1", "a1"]  # newest first, the private run left out
        assert everything["next_cursor"] is None
        assert everything["runs"][0]["status"] == "running"
        failed = everything["runs"][2]
        assert failed["status"] == "failed"
        assert failed["error"] == "it broke"
        assert failed["tokens"] == {"input": 1, "output": 2, "total": 3}

        async def ids_of(**query: str) -> list[str]:
            answer = await http.get("/api/sessions", params=query)
            assert answer.status_code == 200, answer.text
            return [run["execution_id"] for run in answer.json()["runs"]]

        assert await ids_of(status="failed") == ["b1"]
        assert await ids_of(stop_reason="done", status="completed") == ["a2", "a1"]
        assert await ids_of(resolved_by="MaxSteps") == ["a2"]
        assert await ids_of(q="PARIS") == ["a1"]
        assert await ids_of(q="alpha") == ["a2", "a1"]  # the session id matches too
        assert await ids_of(q="hunter2") == []
        assert await ids_of(**{"from": "0", "to": "1"}) == []

        first = (await http.get("/api/sessions", params={"limit": 2})).json()
        assert [run["execution_id"] for run in first["runs"]] == ["g1", "a2"]
        rest = await http.get("/api/sessions", params={"limit": 2, "cursor": first["next_cursor"]})
        assert [run["execution_id"] for run in rest.json()["runs"]] == ["b1", "a1"]

        as_app = await http.get("/api/sessions", params=signed(live, "/api/sessions", q="hunter2"))
        assert as_app.status_code == 200, as_app.text
        [secret] = as_app.json()["runs"]
        assert secret["private"] is True
        assert secret["session_id"] == "secret"
        forged = {**signed(live, "/api/sessions"), "auth_signature": "0" * 64}
        assert (await http.get("/api/sessions", params=forged)).status_code == 401

        runs = (await http.get("/api/sessions/alpha/runs")).json()
        assert [run["execution_id"] for run in runs["runs"]] == ["a1", "a2"]  # oldest first
        assert runs["runs"][0]["first_position"] is not None
        assert (await http.get("/api/sessions/nobody/runs")).status_code == 404

        trace = await http.get("/api/sessions/beta/trace", params={"execution_id": "b1"})
        assert trace.status_code == 200, trace.text
        assert trace.headers["content-disposition"] == 'attachment; filename="beta-b1.json"'
        body = trace.json()
        assert body["summary"]["status"] == "failed"
        assert body["trimmed"] is False
        assert [e["envelope"]["type"] for e in body["envelopes"]] == [
            "agent.status",
            "agent.step.started",
            "agent.step.completed",
            "agent.status",
        ]
        running = await http.get("/api/sessions/gamma/trace", params={"execution_id": "g1"})
        assert running.json()["envelopes"] == []  # nothing published yet, read live


async def test_a_stranger_cannot_read_or_list_a_private_session(live: LiveServer) -> None:
    app = live.node.apps[0]
    claim = await claim_session(live.node, app, None, "secret", 60)
    assert claim is not None
    token = claim.token(app)
    await record(live.node, "private-agent.secret", "s1", "my password is hunter2")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        assert (await http.get("/api/sessions")).json()["runs"] == []
        for path in ("/api/sessions/secret/runs", "/api/sessions/secret/trace?execution_id=s1"):
            refused = await http.get(path)
            assert refused.status_code == 403, refused.text
            assert "private" in refused.json()["error"]
            wrong = await http.get(path, headers={"Authorization": "Bearer " + "0" * 64})
            assert wrong.status_code == 403
            allowed = await http.get(path, headers={"Authorization": f"Bearer {token}"})
            assert allowed.status_code == 200, allowed.text
        trace = await http.get(f"/api/sessions/secret/trace?execution_id=s1&token={token}")
        assert trace.json()["summary"]["private"] is True


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=ten", "limit"),
        ("status=done", "status"),
        ("cursor=not-a-cursor", "cursor"),
        ("q=" + "x" * 201, "q"),
        ("from=nan", "from"),
        ("from=yesterday", "from"),
        ("from=10&to=5", "from"),
        ("stop_reason=" + "x" * 201, "stop_reason"),
    ],
)
async def test_bad_list_parameters_get_400_naming_them(
    live: LiveServer, query: str, named: str
) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        answer = await http.get(f"/api/sessions?{query}")
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]


async def test_bad_trace_parameters_and_unknown_runs(live: LiveServer) -> None:
    await record(live.node, "agent.s", "e1", "hi")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        missing = await http.get("/api/sessions/s/trace")
        assert missing.status_code == 400
        assert "execution_id" in missing.json()["error"]
        bad_format = await http.get("/api/sessions/s/trace?execution_id=e1&format=xml")
        assert bad_format.status_code == 400
        assert "format" in bad_format.json()["error"]
        unknown = await http.get("/api/sessions/s/trace?execution_id=e2")
        assert unknown.status_code == 404
        otlp = await http.get("/api/sessions/s/trace?execution_id=e1&format=otlp")
        assert otlp.status_code == 501  # no agent_core extension on this server
        assert "--demo" in otlp.json()["error"]


async def test_a_run_is_opened_after_its_channel_history_expired(
    start_server: StartServer,
) -> None:
    live = await start_server(history_ttl=1)
    await record(live.node, "agent.old", "e1", "yesterday's failed run", status="failed")

    async def history_gone() -> bool:
        return not await live.node.backend.runs.kept(live.node.apps[0].id, "agent.old")

    await until(history_gone, "the channel's history to expire")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        trace = (await http.get("/api/sessions/old/trace?execution_id=e1")).json()
    assert trace["summary"]["status"] == "failed"
    assert len(trace["envelopes"]) == 4
    assert trace["trimmed"] is False


async def test_an_idle_poll_of_the_list_is_answered_304(live: LiveServer) -> None:
    await record(live.node, "agent.s", "e1", "hi")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        first = await http.get("/api/sessions")
        etag = first.headers["etag"]
        again = await http.get("/api/sessions", headers={"If-None-Match": etag})
        assert again.status_code == 304
        await record(live.node, "agent.s", "e2", "again")
        changed = await http.get("/api/sessions", headers={"If-None-Match": etag})
        assert changed.status_code == 200
        assert changed.headers["etag"] != etag


async def test_a_run_through_post_run_is_listed_running_then_completed_with_its_trace(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        started = await http.post("/run", json={"input": "what is the weather", "pace_ms": 150})
        assert started.status_code == 202, started.text
        session, execution = started.json()["session_id"], started.json()["execution_id"]
        seen: list[str] = []

        async def status() -> str | None:
            runs = (await http.get("/api/sessions", params={"q": session})).json()["runs"]
            found = [run["status"] for run in runs if run["execution_id"] == execution]
            if found and (not seen or seen[-1] != found[0]):
                seen.append(found[0])
            return found[0] if found else None

        # Polled within the list's per-client rate (5 a second after a burst of 20).
        await until(lambda: _is(status(), "completed"), "the run to complete", every=0.2)
        assert seen[0] == "running"
        assert seen[-1] == "completed"

        [run] = (await http.get(f"/api/sessions/{session}/runs")).json()["runs"]
        assert run["input_preview"] == "what is the weather"
        assert run["steps"] >= 1
        assert run["ended_at"] >= run["started_at"]
        trace = (await http.get(f"/api/sessions/{session}/trace?execution_id={execution}")).json()
        assert trace["envelopes"][-1]["envelope"]["type"] == "agent.status"
        assert trace["envelopes"][-1]["envelope"]["payload"]["status"] == "completed"
        otlp = await http.get(f"/api/sessions/{session}/trace?execution_id={execution}&format=otlp")
        assert otlp.status_code == 200, otlp.text
        assert otlp.headers["content-disposition"].endswith('.otlp.json"')
        spans = otlp.json()["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert any(span["name"].startswith("invoke_agent") for span in spans)
        assert all(len(span["traceId"]) == 32 for span in spans)


async def test_a_private_demo_run_is_hidden_from_a_stranger(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        started = (await http.post("/run", json={"input": "secret plans", "pace_ms": 0})).json()
        session, token = started["session_id"], started["auth"]["token"]
        path = f"/api/sessions/{session}/runs"
        mine = {"Authorization": f"Bearer {token}"}

        async def ended() -> bool:
            answer = await http.get(path, headers=mine)
            return answer.status_code == 200 and answer.json()["runs"][0]["status"] != "running"

        await until(ended, "the private run to end")
        assert (await http.get(path)).status_code == 403
        assert (await http.get("/api/sessions", params={"q": session})).json()["runs"] == []
        listed = await http.get("/api/sessions", params=signed(live, "/api/sessions", q=session))
        assert listed.json()["runs"][0]["private"] is True


async def test_a_routed_run_is_listed_with_its_capability(start_server: StartServer) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        body = {"input": "What is the weather in Oslo?", "mode": "route", "pace_ms": 0}
        started = (await http.post("/run", json=body)).json()
        path = f"/api/sessions/{started['session_id']}/runs"

        async def ended() -> bool:
            answer = await http.get(path)
            return answer.status_code == 200 and answer.json()["runs"][0]["status"] != "running"

        await until(ended, "the routed run to end")
        [run] = (await http.get(path)).json()["runs"]
        listed = (await http.get("/api/sessions")).json()["runs"]
        params = {"execution_id": started["execution_id"]}
        trace = (await http.get(f"{path[: -len('/runs')]}/trace", params=params)).json()
    assert run["status"] == "completed", run
    assert run["capability"]
    assert run["execution_id"] == started["execution_id"]
    # The capability's inner agent is a run nested under its call: in the routed run's
    # trace, not listed as a run of its own, not counted in the routed run's totals.
    assert [r["execution_id"] for r in listed] == [started["execution_id"]]
    nested = [
        e["envelope"]
        for e in trace["envelopes"]
        if e["envelope"]["execution_id"] != started["execution_id"]
    ]
    assert len(nested) >= 10
    assert {e["payload"]["parent_execution_id"] for e in nested} == {started["execution_id"]}
    # One tool call, the capability's; the classifier, decider and memory are phases.
    assert (run["steps"], run["tool_calls"], run["routing_phases"]) == (1, 1, 3)


async def publish(node: Node, channel: str, execution_id: str, kind: str, **payload: Any) -> None:
    data = {
        "type": kind,
        "session_id": channel.rpartition(".")[2],
        "execution_id": execution_id,
        "timestamp": "2026-01-16T10:05:00.000Z",
        "payload": payload,
    }
    app = node.apps[0]
    await node.backend.publish(Publication(app.id, channel, kind, json.dumps(data)))


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_sessions_second_run_is_listed_with_its_own_steps_and_tokens(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest
) -> None:
    """Step numbers go on across a session's runs and the final status carries the
    session's step count and usage: the index counts each run's own steps and tokens
    (as the client kit's reducer does). A run indexed from its stored state alone takes
    its input preview from the state's first user message."""
    live = await server_on(kind, start_server, request)
    node = live.node
    store = BackendStateStore(node.backend, node.apps[0].id)
    channel = "agent.delta"
    usage = {"prompt": 1, "completion": 1, "total": 2}
    for execution_id, numbers in (("d1", (1, 2)), ("d2", (3, 4, 5))):
        await store.runs.started(channel, execution_id, input_text="hi", started_at=next(CLOCK))
        await publish(node, channel, execution_id, "agent.status", status="in_progress")
        for number in numbers:
            await publish(node, channel, execution_id, "agent.step.started", step_number=number)
            await publish(
                node,
                channel,
                execution_id,
                "agent.step.completed",
                step_number=number,
                has_tool_calls=False,
                duration_ms=1,
                usage=usage,
            )
        session_total = {"prompt": numbers[-1], "completion": numbers[-1], "total": 2 * numbers[-1]}
        await publish(
            node,
            channel,
            execution_id,
            "agent.status",
            status="completed",
            step_count=numbers[-1],
            usage=session_total,
        )
        await store.runs.ended(channel, execution_id)
    # An outside agent's run: published, then its state stored (no start record).
    await publish(node, "agent.epsilon", "e1", "agent.status", status="in_progress")
    await publish(node, "agent.epsilon", "e1", "agent.status", status="completed", step_count=0)
    snapshot = {
        "status": "completed",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "What is the weather in Oslo?"},
        ],
        "metadata": {"execution_id": "e1"},
    }
    await store.save("agent.epsilon", json.dumps(snapshot).encode())

    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        runs = (await http.get("/api/sessions/delta/runs")).json()["runs"]
        assert [(r["execution_id"], r["steps"]) for r in runs] == [("d1", 2), ("d2", 3)]
        assert [r["tokens"] for r in runs] == [
            {"input": 2, "output": 2, "total": 4},
            {"input": 3, "output": 3, "total": 6},
        ]
        (outside,) = (await http.get("/api/sessions/epsilon/runs")).json()["runs"]
        assert outside["input_preview"] == "What is the weather in Oslo?"
        assert outside["status"] == "completed"


# -- security round 3 (issue 44): cursors, cost, other apps ----------------------------


async def fill(node: Node, runs: int, private_every: int, app_id: str | None = None) -> None:
    """``runs`` finished runs straight into the index (one a second, oldest first);
    every ``private_every``-th is private."""
    index, app = node.backend.runs, app_id or node.apps[0].id
    now = time.time() - runs
    for i in range(runs):
        private = i % private_every == 0
        channel = f"{'private-' if private else ''}agent.s{i}"
        summary = RunSummary(f"s{i}", f"x-{i}", now + i, status="completed", private=private)
        await index.put_run(app, channel, f"x-{i}", int((now + i) * 1000), summary.to_json(), 600)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_cursor_names_no_run(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest
) -> None:
    """A filter that matches nothing runs out of its scan budget on a private run: the
    cursor named it (``[…, "private-agent.s…\\nx-…"]`` in plain base64), so an anonymous
    poller learned every private session and execution id. Now it is sealed: opaque to
    its reader, who can only hand it back."""
    live = await server_on(kind, start_server, request)
    await fill(live.node, SCAN_BUDGET + 50, private_every=1)  # every run private
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        page = (await http.get("/api/sessions", params={"q": "zz-no-match", "limit": 1})).json()
        assert page["runs"] == []
        cursor = page["next_cursor"]
        assert cursor is not None, "the scan budget ran out: a cursor to go on"
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        assert b"private" not in raw
        assert b"agent.s" not in raw
        rest = await http.get("/api/sessions", params={"q": "zz-no-match", "cursor": cursor})
        assert rest.status_code == 200, rest.text
        assert rest.json() == {"runs": [], "next_cursor": None}


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_changed_or_made_up_cursor_gets_400_on_every_backend(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest
) -> None:
    """Redis answered 503 for ``[true, "x"]`` (a boolean start passed for a number)."""
    live = await server_on(kind, start_server, request)
    await fill(live.node, 5, private_every=100)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        cursor = (await http.get("/api/sessions", params={"limit": 1})).json()["next_cursor"]

        def b64(value: object) -> str:
            return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

        forged = [b64([True, "x"]), b64([10**30, "agent.s1\nx-1"]), b64([1, "agent.s1\nx-1"])]
        changed = cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB")
        for bad in [*forged, changed, "not-a-cursor", "%%%", "A" * 5000]:
            answer = await http.get("/api/sessions", params={"cursor": bad})
            assert answer.status_code == 400, (bad, answer.text)
            assert "cursor" in answer.json()["error"]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_filter_that_matches_little_pages_through_the_whole_index(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest
) -> None:
    """One request reads at most SCAN_BUDGET entries; following the cursors finds
    every match, once, in order."""
    live = await server_on(kind, start_server, request, run_list_rate=0)
    await fill(live.node, 3 * SCAN_BUDGET + 10, private_every=7)
    found: list[str] = []
    requests = 0
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        params: dict[str, Any] = {"q": "s1", "limit": 200}
        while True:
            page = (await http.get("/api/sessions", params=params)).json()
            requests += 1
            found += [run["session_id"] for run in page["runs"]]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
    expected = [f"s{i}" for i in reversed(range(3 * SCAN_BUDGET + 10)) if i % 7 and "s1" in f"s{i}"]
    assert found == expected
    assert requests >= 3


async def test_the_list_answers_429_with_retry_after_past_a_clients_rate(
    start_server: StartServer,
) -> None:
    live = await start_server(run_list_rate=0.5, run_list_burst=3)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        for _ in range(3):
            assert (await http.get("/api/sessions")).status_code == 200
        refused = await http.get("/api/sessions")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "2"
        assert "run_list_rate" in refused.json()["error"]
        assert (await http.get("/api/sessions/s/runs")).status_code == 404, "only the list"


ONE, TWO = "https://one.example", "https://two.example"
ORIGIN = {"origin": TWO}


async def test_another_apps_runs_are_listed_only_with_its_key(
    start_server: StartServer, tmp_path: Path
) -> None:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": "1", "key": "key-one", "secret": "secret-one", "allowed_origins": [ONE]},
        {"id": "2", "key": "key-two", "secret": "secret-two", "allowed_origins": [TWO]},
    )
    live = await start_server(apps_file=apps)
    await fill(live.node, 3, private_every=100, app_id="2")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        refused = await http.get("/api/sessions", params={"app_id": "2"})
        assert refused.status_code == 403, refused.text
        assert "app_key" in refused.json()["error"]
        assert (await http.get("/api/sessions", params={"app_id": "9"})).status_code == 403
        assert (await http.get("/api/sessions")).json()["runs"] == []  # app 1's
        assert (await http.get("/api/sessions", params={"app_id": "1"})).status_code == 200
        mine = await http.get("/api/sessions", params={"app_key": "key-two"}, headers=ORIGIN)
        assert len(mine.json()["runs"]) == 2  # the private one left out
        assert mine.headers["access-control-allow-origin"] == TWO, "app 2's origins decide"
        both = await http.get("/api/sessions", params={"app_key": "key-two", "app_id": "2"})
        assert both.status_code == 200
        wrong = await http.get("/api/sessions", params={"app_key": "key-two", "app_id": "1"})
        assert wrong.status_code == 404
        app = live.node.app_by_id("2")
        assert app is not None
        query = signed_params(app.key, app.secret, "GET", "/api/sessions", extra={"app_id": "2"})
        signed_list = await http.get("/api/sessions", params=query)
        assert len(signed_list.json()["runs"]) == 3  # as the app: the private one too
        cursor = await http.get("/api/sessions", params={"limit": 1, "app_key": "key-two"})
        other = await http.get("/api/sessions", params={"cursor": cursor.json()["next_cursor"]})
        assert other.status_code == 400, "a cursor is the app's own"


async def test_the_otlp_download_of_a_run_with_times_otlp_cannot_hold_is_not_a_500(
    start_server: StartServer,
) -> None:
    """A publisher with the app's secret may publish any text: envelopes dated before
    1970 or after 2554 (past OTLP's unsigned 64-bit nanoseconds), or on no date at all,
    made the OTLP export answer 500. They are left out of it now."""
    live = await start_server(demo=True)
    node, channel = live.node, "agent.when"
    runs = BackendStateStore(node.backend, node.apps[0].id).runs
    await runs.started(channel, "w1", input_text="when?", started_at=next(CLOCK))
    stamps = ["1969-12-31T23:59:59.999Z", "2600-01-01T00:00:00.000Z", "2026-13-45T10:05:00.000Z"]
    await publish(node, channel, "w1", "agent.status", status="in_progress")
    for number, stamp in enumerate(stamps, start=1):
        data = {
            "type": "agent.step.started",
            "session_id": "when",
            "execution_id": "w1",
            "timestamp": stamp,
            "payload": {"step_number": number},
        }
        app = node.apps[0].id
        await node.backend.publish(
            Publication(app, channel, "agent.step.started", json.dumps(data))
        )
    await publish(node, channel, "w1", "agent.status", status="completed")
    await runs.ended(channel, "w1")
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        otlp = await http.get("/api/sessions/when/trace?execution_id=w1&format=otlp")
        assert otlp.status_code == 200, otlp.text
        spans = otlp.json()["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert [span["name"] for span in spans] == ["invoke_agent agent"]
        trace = await http.get("/api/sessions/when/trace?execution_id=w1")
        assert len(trace.json()["envelopes"]) == 5, "the JSON trace keeps what was published"


async def test_a_run_listed_running_that_nothing_runs_is_marked_abandoned(
    start_server: StartServer,
) -> None:
    """A run still listed ``running`` whose server went away before its end (the
    session's run claim lapsed) is answered ``"abandoned": true``; an earlier running
    row is abandoned whatever the claim (one run at a time per session). A run going on
    is not, and a server without the demo extension (no one to ask) marks nothing."""
    live = await start_server(demo=True)
    node, app = live.node, live.node.apps[0]
    runs = BackendStateStore(node.backend, app.id).runs
    for execution in ("x-dead-1", "x-dead-2"):
        await runs.started("agent.crashed", execution, input_text="hi", started_at=next(CLOCK))
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:

        async def abandoned() -> list[bool]:
            answer = await http.get("/api/sessions/crashed/runs")
            assert answer.status_code == 200, answer.text
            return [run.get("abandoned", False) for run in answer.json()["runs"]]

        assert await abandoned() == [True, True]
        assert await node.backend.claim_value(app.id, "run:crashed", "someone", 30)
        assert await abandoned() == [True, False]  # the latest may be running somewhere

        started = await http.post("/run", json={"input": "weather in Oslo?", "pace_ms": 150})
        session = started.json()["session_id"]
        going = (await http.get(f"/api/sessions/{session}/runs")).json()["runs"]
        assert [(run["status"], "abandoned" in run) for run in going] == [("running", False)]

    bare = await start_server()
    store = BackendStateStore(bare.node.backend, bare.node.apps[0].id)
    await store.runs.started("agent.crashed", "x-dead-1", started_at=next(CLOCK))
    async with httpx.AsyncClient(base_url=bare.url, timeout=10) as http:
        [run] = (await http.get("/api/sessions/crashed/runs")).json()["runs"]
        assert run["status"] == "running"
        assert "abandoned" not in run
