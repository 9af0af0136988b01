"""Deeply nested JSON where a string belongs is a clear 4xx, never a 500: ``str()`` of a
list nested 1,000 deep raised RecursionError (a 2 KB body and a traceback in the log)."""

from __future__ import annotations

import httpx

from tests.support.live import StartServer

JSON = {"content-type": "application/json"}  # run-start doors take only JSON (415)

DEEP = "[" * 1000 + "]" * 1000


async def test_a_chat_text_part_that_is_not_a_string_is_refused(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    body = (
        '{"id": "deep-1", "messages": [{"id": "m", "role": "user", '
        f'"parts": [{{"type": "text", "text": {DEEP}}}]}}]}}'
    )
    part = {"type": "text", "text": 7}
    flat = {"id": "deep-2", "messages": [{"role": "user", "parts": [part]}]}
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        deep = await http.post("/vercel-ai", content=body, headers=JSON)
        number = await http.post("/vercel-ai", json=flat)
    for response in (deep, number):
        assert response.status_code == 422, response.text
        assert "a text part's text must be a string" in response.json()["error"]


async def test_an_auth_request_with_a_nested_json_value_is_refused(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    body = f'{{"socket_id": "1.1", "channel_name": {DEEP}}}'
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        response = await http.post(
            "/broadcasting/auth", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert "channel_name" in response.json()["error"]
