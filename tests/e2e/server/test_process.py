"""The server as a process: configuration from the environment, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import websockets

from tests.support.live import Client, write_apps
from tests.support.processes import RedisServer, ServerFactory, ServerProcess, free_port


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


def banner(server: ServerProcess) -> str:
    """The banner's backend line (printed before the "listening" line)."""
    return next(line for line in server.output if line.startswith("agent-broadcaster backend:"))


@pytest.mark.redis
def test_redis_url_is_the_backend_unless_one_is_named(
    server_factory: ServerFactory, redis_server: RedisServer
) -> None:
    """``serve`` takes ``REDIS_URL`` as the Procfile's worker does; ``--backend`` and
    ``BROADCASTER_BACKEND`` come first; the banner names the backend and its source."""
    taken = server_factory(env={"REDIS_URL": redis_server.url})
    assert (
        banner(taken).strip()
        == f"agent-broadcaster backend: redis {redis_server.url} (from REDIS_URL)"
    )
    taken.wait_ready()
    named = server_factory("--backend", "memory://", env={"REDIS_URL": redis_server.url})
    assert banner(named).startswith("agent-broadcaster backend: memory (")
    env = {"REDIS_URL": "redis://127.0.0.1:1/0", "BROADCASTER_BACKEND": redis_server.url}
    assert banner(server_factory(env=env)).strip().endswith(f"redis {redis_server.url}")


def test_the_banner_and_logs_show_no_credentials(server_factory: ServerFactory) -> None:
    """A Redis that is not there yet: the server starts (not ready) and says where it
    looks, without the password (nor a query, where redis-py takes one)."""
    port = free_port()
    for url, shown in [
        (f"redis://user:s3cret@127.0.0.1:{port}/0", f"redis redis://127.0.0.1:{port}/0"),
        (
            f"redis-sentinel://:s3cret@127.0.0.1:{port}/mymaster/0?password=s3cret",
            f"sentinel redis-sentinel://127.0.0.1:{port}/mymaster/0",
        ),
    ]:
        server = server_factory("--backend", url)
        assert banner(server).strip() == f"agent-broadcaster backend: {shown}"
        assert "s3cret" not in server.log
        server.stop()


def test_a_bad_redis_url_is_refused_naming_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BROADCASTER_BACKEND"}
    done = subprocess.run(
        [sys.executable, "-m", "broadcaster", "serve", "--port", "0"],
        env={**env, "REDIS_URL": "http://127.0.0.1:6379"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "unsupported backend URL 'http://127.0.0.1:6379'" in done.stderr
    assert (
        "the backend is REDIS_URL's: --backend, then BROADCASTER_BACKEND, then REDIS_URL"
        in done.stderr
    )
