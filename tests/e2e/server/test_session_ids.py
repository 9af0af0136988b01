"""A session id is the whole path segment: a final newline is not accepted as its end
(``re.match`` with ``$`` allowed ``abc\n``, which then named the channel
``agent.abc\n``)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.live import StartServer


@pytest.mark.parametrize("suffix", ["state", "events"])
async def test_a_session_id_with_a_final_newline_is_refused(
    start_server: StartServer, suffix: str
) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        response = await http.get(f"/api/sessions/abc%0A/{suffix}")
    assert response.status_code == 400, response.text
    assert "invalid session id" in response.json()["error"]


async def test_a_private_session_channel_with_a_final_newline_is_not_authorized(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
        response = await http.post(
            "/broadcasting/auth",
            data={"socket_id": "1.1", "channel_name": "private-agent.abc\n", "session_token": "t"},
        )
    assert response.status_code == 403, response.text
    assert "is not a private agent session channel" in response.json()["error"]
