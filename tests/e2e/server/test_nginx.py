"""Behind a real proxy (issue 29, point 4): Debian's nginx, configured from the shipped
``deploy/nginx.conf`` (rendered with free ports and a certificate made here), terminates
TLS in front of ``agent-broadcaster serve --trusted-proxies 127.0.0.1``. pusher-js in
Node receives a run over ``wss://``, an SSE follow gets its events while the run goes
(no proxy buffering), and the per-address connection limit counts the client the proxy
forwards, not the proxy: clients on 127.0.0.2 and 127.0.0.3 do not share one."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support.live import KEY
from tests.support.nginx import Certificates, Nginx, make_certificates
from tests.support.node import NodeClient
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.node

LIMIT = 2  # max_connections_per_ip of the server behind the proxy
FIRST, SECOND = "127.0.0.2", "127.0.0.3"  # two clients, as the proxy sees them


@dataclass
class Deployment:
    server: ServerProcess
    nginx: Nginx
    certs: Certificates

    def http(self, address: str = "127.0.0.1") -> httpx.Client:
        """An HTTPS client of the proxy whose connections come from ``address``."""
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        transport = httpx.HTTPTransport(local_address=address, verify=context)
        return httpx.Client(base_url=self.nginx.url, transport=transport, timeout=20)

    def websocket(self, address: str) -> Callable[[], ClientConnection]:
        """Opens a Pusher WebSocket through the proxy (wss) from ``address``."""
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        url = f"wss://127.0.0.1:{self.nginx.tls_port}/app/{KEY}?protocol=7"

        def open_one() -> ClientConnection:
            sock = socket.create_connection(
                ("127.0.0.1", self.nginx.tls_port), timeout=10, source_address=(address, 0)
            )
            return connect(url, sock=sock, ssl=context, open_timeout=10)

        return open_one


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    folder: Path = tmp_path_factory.mktemp("nginx")
    certs = make_certificates(folder)
    server = ServerProcess(
        ["--demo", "--trusted-proxies", "127.0.0.1", "--max-connections-per-ip", str(LIMIT)]
    ).start()
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    nginx = Nginx(folder, port, certs)
    try:
        nginx.start()
        yield Deployment(server, nginx, certs)
    finally:
        nginx.stop()
        server.stop()


def start_run(deployment: Deployment, session: str, **body: object) -> dict[str, str]:
    with deployment.http() as http:
        answer = http.post(
            "/run", json={"input": "What is the weather in Oslo?", "session_id": session, **body}
        )
    assert answer.status_code == 202, answer.text
    run: dict[str, str] = answer.json()
    return run


def test_pusher_js_receives_a_run_over_wss_through_nginx(deployment: Deployment) -> None:
    session = f"s-wss-{secrets.token_hex(4)}"
    channel = f"agent.{session}"
    client = NodeClient(
        deployment.server,
        (channel,),
        url=deployment.nginx.url,
        env={"NODE_EXTRA_CA_CERTS": str(deployment.certs.ca)},
    )
    try:
        client.wait_for(lambda r: r["type"] == "subscribed", "its subscription over wss")
        start_run(deployment, session)
        final = client.wait_for(
            lambda r: (
                r["type"] == "event"
                and r["event"] == "agent.status"
                and r["data"]["payload"]["status"] in ("completed", "failed")
            ),
            "the run's final status",
        )
    finally:
        client.stop()
    assert final["data"]["payload"]["status"] == "completed"
    kinds = {r["event"] for r in client.seen if r["type"] == "event"}
    assert {"agent.step.started", "agent.stream.chunk", "agent.tool.started"} <= kinds


def test_an_sse_follow_through_nginx_gets_events_while_the_run_goes(
    deployment: Deployment,
) -> None:
    """The first event comes while the run is still going (its final state is not
    stored yet), not with the rest at its end: the proxy buffers nothing."""
    session = f"s-sse-{secrets.token_hex(4)}"
    run = start_run(deployment, session, pace_ms=150)
    state = f"/api/sessions/{session}/state"
    with deployment.http() as http:
        events = f"/api/sessions/{session}/events"
        with http.stream("GET", events, params={"since": run["position"]}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            received = sse_events(stream.iter_lines())
            first = next(received)
            going = http.get(state)
            assert going.status_code == 404, "the run had ended before its first event came"
            statuses = [status_of(*first)]
            for event in received:
                statuses.append(status_of(*event))
                if statuses[-1] in ("completed", "failed"):
                    break
        assert statuses[-1] == "completed"
        assert http.get(state).status_code == 200


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """``(event, data)`` of each event of an SSE stream."""
    name = "message"
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            yield name, line[5:].strip()
            name = "message"


def status_of(event: str, data: str) -> str | None:
    """The status of an ``agent.status`` event, None for any other."""
    return json.loads(data)["payload"]["status"] if event == "agent.status" else None


def test_per_address_limits_count_the_client_behind_the_proxy(deployment: Deployment) -> None:
    """The first client holds the limit's worth of streams: its next request is refused
    (429, saying which address), the second client's are not, although every connection
    reaches the server from the proxy. The server logs the clients, not the proxy."""
    with contextlib.ExitStack() as held, deployment.http(FIRST) as first:
        for n in range(LIMIT):
            path = f"/api/channels/agent.held-{n}-{secrets.token_hex(4)}/events"
            stream = held.enter_context(first.stream("GET", path))
            assert stream.status_code == 200
        refused = first.get("/up")
        assert refused.status_code == 429, refused.text
        assert f"too many connections from {FIRST}" in refused.json()["error"]
        upgrade = deployment.websocket(FIRST)
        with pytest.raises(InvalidStatus) as refused_upgrade:
            upgrade()
        assert refused_upgrade.value.response.status_code == 429
        with deployment.http(SECOND) as second:
            assert second.get("/up").status_code == 200, "another client is not limited"
        with deployment.websocket(SECOND)() as socket_of_second:
            assert "pusher:connection_established" in str(socket_of_second.recv(timeout=10))
    log = deployment.server.log
    assert f'{SECOND}:0 - "GET /up HTTP/1.1" 200' in log
    assert f"refusing connections from {FIRST}" in log
