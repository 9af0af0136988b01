"""The server as a process: configuration from the environment, graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import websockets

from tests.support.live import Client, write_apps
from tests.support.processes import ServerFactory


def test_environment_configures_the_app(server_factory: ServerFactory) -> None:
    env = {"BROADCASTER_APP_KEY": "env-key", "BROADCASTER_ACTIVITY_TIMEOUT": "33"}
    server = server_factory(env=env)

    async def scenario() -> None:
        client = await Client.connect(f"{server.ws_url}/app/env-key?protocol=7")
        assert client.activity_timeout == 33
        await client.close()

    asyncio.run(scenario())


def test_apps_file_serves_several_apps(server_factory: ServerFactory, tmp_path: Path) -> None:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": "1", "key": "key-one", "secret": "s1"},
        {"id": "2", "key": "key-two", "secret": "s2"},
    )
    server = server_factory("--apps-file", str(apps))

    async def scenario() -> None:
        for key in ("key-one", "key-two"):
            client = await Client.connect(f"{server.ws_url}/app/{key}?protocol=7")
            await client.close()

    asyncio.run(scenario())


def test_graceful_shutdown_closes_clients_with_4200(server_factory: ServerFactory) -> None:
    server = server_factory("--shutdown-timeout", "4")

    async def scenario() -> None:
        clients = [await Client.connect(f"{server.ws_url}/app/agent-key?protocol=7")]
        clients.append(await Client.connect(f"{server.ws_url}/app/agent-key?protocol=7"))
        await clients[0].subscribe("agent.1")
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        codes = [await client.closed_with() for client in clients]
        assert codes == [4200, 4200]

    asyncio.run(scenario())
    assert server.proc is not None
    # uvicorn re-raises the signal once its graceful shutdown is complete.
    assert server.proc.wait(15) in (0, -signal.SIGTERM)
    server.stop()  # collects the rest of the output
    assert "Finished server process" in server.log
    assert "Traceback" not in server.log


def test_graceful_shutdown_is_bounded_when_a_client_never_answers(
    server_factory: ServerFactory,
) -> None:
    """A client that ignores the close frame does not hold the shutdown up."""
    server = server_factory("--shutdown-timeout", "2")

    async def scenario() -> None:
        client = await Client.connect(f"{server.ws_url}/app/agent-key?protocol=7", close_timeout=30)
        # Stop reading: the client's transport never processes the close frame.
        client.ws.transport.pause_reading()
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.proc.wait, 15)
        assert code in (0, -signal.SIGTERM)
        client.ws.transport.abort()

    asyncio.run(scenario())
    server.stop()
    assert "Finished server process" in server.log


def test_a_refusal_quoting_a_long_non_ascii_key_still_closes_cleanly(
    server_factory: ServerFactory,
) -> None:
    """The close reason quotes the key from the URL; cut by characters it overflowed the
    123-byte limit of a close frame, the close handshake broke and the server crashed
    while shutting down."""
    server = server_factory()

    async def attempt() -> int | None:
        client_url = f"{server.ws_url}/app/{'é' * 80}?protocol=7"
        async with websockets.connect(client_url) as ws:
            first = await ws.recv()
            assert '"code\\":4001' in str(first)
            try:
                await asyncio.wait_for(ws.recv(), 5)
            except websockets.ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd is not None else None
        return None

    assert asyncio.run(attempt()) == 4001
    assert server.stop() in (0, -signal.SIGTERM)
    assert "Traceback" not in server.log
    assert "Finished server process" in server.log
