"""CORS on everything a page on another origin reads (issue 38): the demo's config, a
session's state, its events (SSE), its runs, a run's trace, the run list, the Vercel AI
SDK follow stream and ``/broadcasting/auth``. An allowed origin gets the headers on
every answer and its preflight; any other origin gets none, and its preflight 403; a
private session still needs its token, which the preflight lets a page send as a
header. The run starts: tests/reliability/test_cross_site_runs.py; a built React page
on a second origin: tests/e2e/frontend/test_react_page.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.support.live import LiveServer, StartServer

ALLOWED = "https://app.example"
OTHER = "https://other.example"


@pytest.fixture
async def live(start_server: StartServer) -> LiveServer:
    return await start_server(demo=True, allowed_origins=(ALLOWED,))


@pytest.fixture
async def private(start_server: StartServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    return await start_server(demo=True, allowed_origins=(ALLOWED,))


async def ended_run(http: httpx.AsyncClient) -> dict[str, Any]:
    answer = await http.post("/run", json={"input": "What is 6 * 7?", "wait": True})
    assert answer.status_code == 200, answer.text
    run: dict[str, Any] = answer.json()
    return run


def reads(run: dict[str, Any]) -> list[str]:
    """Every GET a page reads, for the run ``run``."""
    session, execution = run["session_id"], run["execution_id"]
    until = f"since={run['position']}&until=final"
    return [
        "/api/demo/config",
        f"/api/sessions/{session}/state",
        f"/api/sessions/{session}/events?{until}",
        f"/api/sessions/{session}/runs",
        f"/api/sessions/{session}/trace?execution_id={execution}",
        f"/api/sessions/{session}/trace?execution_id={execution}&format=otlp",
        "/api/sessions",
        f"/vercel-ai/{session}/stream",  # 204: the run has ended, nothing to resume
    ]


async def get(http: httpx.AsyncClient, path: str, **headers: str) -> httpx.Response:
    """The answer's head (and a body that ends: the streams are read to their end)."""
    async with http.stream("GET", path, headers=headers) as answer:
        await answer.aread()
        return answer


def asking(origin: str, method: str = "GET", headers: str = "authorization") -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": method,
        "access-control-request-headers": headers,
    }


@pytest.fixture
async def http(live: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
        yield client


async def test_an_allowed_origin_reads_every_get_and_gets_its_preflight(
    http: httpx.AsyncClient,
) -> None:
    run = await ended_run(http)
    for path in reads(run):
        answer = await get(http, path, origin=ALLOWED)
        assert answer.status_code in (200, 204), (path, answer.status_code)
        assert answer.headers["access-control-allow-origin"] == ALLOWED, path
        assert "Origin" in answer.headers.get_list("vary"), path
        assert "ETag" in answer.headers["access-control-expose-headers"], path
        checked = await http.options(path, headers=asking(ALLOWED))
        assert checked.status_code == 204, (path, checked.text)
        assert checked.headers["access-control-allow-origin"] == ALLOWED, path
        assert checked.headers["access-control-allow-methods"] == "GET", path
        allowed = checked.headers["access-control-allow-headers"].lower()
        assert {"authorization", "last-event-id"} <= set(allowed.replace(" ", "").split(","))


async def test_another_origin_gets_no_cors_headers_and_its_preflight_is_refused(
    http: httpx.AsyncClient,
) -> None:
    run = await ended_run(http)
    for path in reads(run):
        answer = await get(http, path, origin=OTHER)
        assert answer.status_code in (200, 204), path  # the browser keeps it from the page
        assert "access-control-allow-origin" not in answer.headers, path
        refused = await http.options(path, headers=asking(OTHER))
        assert refused.status_code == 403, path
        assert "access-control-allow-origin" not in refused.headers, path
        assert OTHER in refused.json()["error"], path
        assert "allowed_origins" in refused.json()["error"], path
    # Not a browser (no Origin): answered as before, no CORS headers either.
    plain = await http.options("/api/sessions")
    assert plain.status_code == 204
    assert "access-control-allow-origin" not in plain.headers


async def test_an_unknown_app_gets_no_cors_headers(http: httpx.AsyncClient) -> None:
    # The run list refuses an app id without that app's key (403, known or not: no
    # oracle of app ids); the state says the app is unknown (404).
    for path, status in (("/api/sessions", 403), ("/api/sessions/s/state", 404)):
        answer = await http.get(f"{path}?app_id=nope", headers={"origin": ALLOWED})
        assert answer.status_code == status, answer.text
        assert "access-control-allow-origin" not in answer.headers
        refused = await http.options(f"{path}?app_id=nope", headers=asking(ALLOWED))
        assert refused.status_code == 403


async def test_a_private_session_still_needs_its_token(private: LiveServer) -> None:
    """CORS lets the page read the answers, the token still decides what they are: the
    state without the token is 403 (readable, so the kit can say why), with it 200;
    /broadcasting/auth answers the page too, and its preflight is allowed."""
    async with httpx.AsyncClient(base_url=private.url, timeout=30) as http:
        run = await ended_run(http)
        token = run["auth"]["token"]
        state = f"/api/sessions/{run['session_id']}/state"
        refused = await http.get(state, headers={"origin": ALLOWED})
        assert refused.status_code == 403
        assert refused.headers["access-control-allow-origin"] == ALLOWED
        assert "private" in refused.json()["error"]
        wrong = await http.get(state, headers={"origin": ALLOWED, "authorization": "Bearer x"})
        assert wrong.status_code == 403
        granted = await http.get(
            state, headers={"origin": ALLOWED, "authorization": f"Bearer {token}"}
        )
        assert granted.status_code == 200, granted.text
        assert granted.headers["access-control-allow-origin"] == ALLOWED
        events = f"/api/sessions/{run['session_id']}/events?since={run['position']}&until=final"
        assert (await get(http, events, origin=ALLOWED)).status_code == 403
        followed = await get(http, f"{events}&token={token}", origin=ALLOWED)
        assert followed.status_code == 200
        assert followed.headers["access-control-allow-origin"] == ALLOWED

        checked = await http.options("/broadcasting/auth", headers=asking(ALLOWED, "POST", ""))
        assert checked.status_code == 204
        assert checked.headers["access-control-allow-methods"] == "POST"
        fields = {"socket_id": "1.2", "channel_name": run["channel"], "session_token": token}
        signed = await http.post("/broadcasting/auth", data=fields, headers={"origin": ALLOWED})
        assert signed.status_code == 200, signed.text
        assert signed.headers["access-control-allow-origin"] == ALLOWED
        stranger = {**fields, "session_token": "x"}
        denied = await http.post("/broadcasting/auth", data=stranger, headers={"origin": ALLOWED})
        assert denied.status_code == 403
        foreign = await http.post("/broadcasting/auth", data=fields, headers={"origin": OTHER})
        assert "access-control-allow-origin" not in foreign.headers
