"""Cross-site run starts (issue 29, point 2): the run-start endpoints take only JSON
(415), refuse a page from an origin the app does not allow (403), and answer CORS
preflights for allowed origins only. The page on a second origin: tests/e2e/frontend/
test_cross_origin.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.live import APP_ID, KEY, SECRET, LiveServer, StartServer, write_apps

ALLOWED = "https://dashboard.example"
EVIL = "https://evil.example"
AGUI_INPUT = {
    "threadId": "t-cross-site",
    "runId": "r-1",
    "state": {},
    "messages": [{"id": "m1", "role": "user", "content": "Weather in Oslo?"}],
    "tools": [],
    "context": [],
    "forwardedProps": {},
}
CHAT = {
    "id": "c-cross-site",
    "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}],
}
DOORS: list[tuple[str, dict[str, Any]]] = [
    ("/run", {"input": "What is the weather in Oslo?"}),
    ("/ag-ui", AGUI_INPUT),
    ("/vercel-ai", CHAT),
]


async def restricted(start_server: StartServer, tmp_path: Path) -> LiveServer:
    app = {"id": APP_ID, "key": KEY, "secret": SECRET, "allowed_origins": [ALLOWED]}
    return await start_server(demo=True, apps_file=write_apps(tmp_path / "apps.json", app))


def json_body(body: dict[str, Any]) -> bytes:
    return httpx.Request("POST", "http://x", json=body).content


@pytest.mark.parametrize(("path", "body"), DOORS)
async def test_a_text_plain_post_starts_no_run(
    start_server: StartServer, path: str, body: dict[str, Any]
) -> None:
    """A form or text/plain POST (what a page may send cross-site without asking): 415."""
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url) as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {} if content_type is None else {"content-type": content_type}
            answer = await http.post(path, content=json_body(body), headers=headers)
            assert answer.status_code == 415, answer.text
            assert "Content-Type: application/json" in answer.json()["error"]
        charset = {"content-type": "application/json; charset=latin-1"}
        assert (await http.post(path, content=json_body(body), headers=charset)).status_code == 415
    assert not demo_running(live)


@pytest.mark.parametrize(("path", "body"), DOORS)
async def test_json_with_a_utf8_charset_starts_a_run(
    start_server: StartServer, path: str, body: dict[str, Any]
) -> None:
    live = await start_server(demo=True)
    headers = {"content-type": "application/json; charset=UTF-8"}
    async with httpx.AsyncClient(base_url=live.url) as http:
        answer = await http.post(path, content=json_body(body), headers=headers)
    assert answer.status_code in (200, 202), answer.text


@pytest.mark.parametrize(("path", "body"), DOORS)
async def test_a_foreign_origin_is_refused_when_origins_are_restricted(
    start_server: StartServer, tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    live = await restricted(start_server, tmp_path)
    async with httpx.AsyncClient(base_url=live.url) as http:
        for content_type in ("text/plain", "application/json"):
            headers = {"origin": EVIL, "content-type": content_type}
            answer = await http.post(path, content=json_body(body), headers=headers)
            assert answer.status_code == 403, answer.text
            assert "https://evil.example" in answer.json()["error"]
            assert "allowed_origins" in answer.json()["error"]
            assert "access-control-allow-origin" not in answer.headers
        refused = await http.options(path, headers=preflight(EVIL))
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers
        # No Origin: not a page (a server or a script), as before.
        assert (await http.post(path, json=body)).status_code in (200, 202)


@pytest.mark.parametrize(("path", "body"), DOORS)
async def test_an_allowed_origin_gets_its_preflight_and_cors_headers(
    start_server: StartServer, tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    live = await restricted(start_server, tmp_path)
    async with httpx.AsyncClient(base_url=live.url) as http:
        answer = await http.options(path, headers=preflight(ALLOWED))
        assert answer.status_code == 204, answer.text
        assert answer.headers["access-control-allow-origin"] == ALLOWED
        assert answer.headers["access-control-allow-methods"] == "POST"
        allowed = answer.headers["access-control-allow-headers"].lower()
        assert "content-type" in allowed
        assert "authorization" in allowed
        assert answer.headers["vary"] == "Origin"
        started = await http.post(path, json=body, headers={"origin": ALLOWED})
        assert started.status_code in (200, 202), started.text
        assert started.headers["access-control-allow-origin"] == ALLOWED
        assert "X-Session-Token" in started.headers["access-control-expose-headers"]


async def test_any_origin_is_allowed_by_default(start_server: StartServer) -> None:
    """``allowed_origins`` ``*`` (the default): every page may, as over WebSocket."""
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url) as http:
        answer = await http.options("/run", headers=preflight(EVIL))
        assert answer.status_code == 204
        assert answer.headers["access-control-allow-origin"] == EVIL
        started = await http.post("/run", json=DOORS[0][1], headers={"origin": EVIL})
        assert started.status_code == 202


def preflight(origin: str) -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type",
    }


def demo_running(live: LiveServer) -> bool:
    demo = live.server.config.app.state.extensions["demo"]
    return bool(demo.runs is not None and getattr(demo.runs, "_runs", None))
