"""Instructions per delivered message on the pub/sub path, counted by callgrind: the
full path, and direct routes (:mod:`broadcaster._routes`) in Python and compiled.

In one process: a hub over the Redis backend's pub/sub reader (not connected), 1,000
fast-path connections over socket pairs (uvloop transports), one subscriber per
channel; the reader is fed ``message`` pushes as Redis sends them (the publish
script's payloads, next offsets), 8 per read, one event-loop pass per read. Each path
runs twice under ``valgrind --tool=callgrind`` (2,000 and 10,000 messages delivered,
the same set-up); the difference over 8,000 is the figure, so start-up and set-up
cancel out. Counts are of user-space instructions (system calls' kernel work is not
in them) and repeat to within a few instructions per message, whatever else the
machine is doing.

    .venv/bin/python -m bench.callgrind_channels            # all three paths
    .venv/bin/python -m bench.callgrind_channels --path compiled
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any

PATHS = ("full", "python", "compiled")
CHANNELS = 1000
PER_READ = 8
SMALL, LARGE = 2000, 10000


async def _deliver(path: str, count: int) -> int:
    import uvloop  # noqa: F401 - the loop the server runs on

    from bench.envelope import EVENT, envelope, session_of
    from broadcaster import _routes, hub
    from broadcaster.backends.redis import resp
    from broadcaster.backends.redis.backend import RedisBackend
    from broadcaster.backends.redis.codec import script_payload
    from broadcaster.backends.redis.layout import publication_channel
    from broadcaster.connection import Connection, Delivery
    from broadcaster.metrics import Metrics
    from broadcaster.publication import Publication
    from broadcaster.settings import AppConfig

    if path == "python":
        resp.deliver = _routes.py_deliver
        hub.Route = _routes.PyRoute  # type: ignore[misc]
    elif path == "compiled" and not _routes.COMPILED:
        raise SystemExit("broadcaster/_routes_c.c is not compiled: run scripts/install")

    class Socket:
        """The parts of the fast WebSocket protocol a connection and a route use."""

        direct_routes = True

        def __init__(self, transport: Any) -> None:
            self.transport = transport
            self.close_sent = self.disconnected = False

        @property
        def closing(self) -> bool:
            return self.close_sent or self.disconnected or self.transport.is_closing()

        def write(self, data: bytes) -> None:
            if not self.closing:
                self.transport.write(data)

        def buffered(self) -> int:
            return int(self.transport.get_write_buffer_size())

    loop = asyncio.get_running_loop()
    backend = RedisBackend("redis://127.0.0.1:1")  # never connected
    if path == "full":
        backend.routes = None  # the hub attaches none

    async def subscribed(app_id: str, channel: str) -> None:
        return None

    backend.subscribe = subscribed  # type: ignore[method-assign]
    metrics = Metrics()
    node_hub = hub.Hub(backend, metrics)
    app = AppConfig(id="bench", key="key", secret="secret")
    delivery = Delivery(1 << 20)
    peers = []
    for i in range(CHANNELS):
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        peers.append(theirs)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        conn = Connection.fast(f"{i}.1", app, delivery, Socket(transport))
        await node_hub.subscribe(conn, f"agent.bench-{i}")
    pushes = []
    for n in range(LARGE):
        channel = f"agent.bench-{n % CHANNELS}"
        offset = str(n // CHANNELS + 1).encode()
        before, after = script_payload(
            Publication(app.id, channel, EVENT, envelope(session_of(channel), n))
        )
        payload = before + offset + b" e1" + after + b"e1:" + offset + b'"}'
        name = publication_channel(backend.prefix, app.id, channel).encode()
        pushes.append(resp.pack_commands([(b"message", name, payload)]))
    # Packed for every count alike, so that the difference of two runs is delivery only.
    reads = [b"".join(pushes[i : i + PER_READ]) for i in range(0, count, PER_READ)]
    reader = resp.PubSubReader(
        lambda reply: None,
        on_message=backend._message,
        routes=None if path == "full" else backend.routes,
    )
    backend._on_encoded = node_hub.deliver_encoded
    for data in reads:
        reader.data_received(data)
        await asyncio.sleep(0)  # the tick's flush
    await asyncio.sleep(0)
    return metrics.messages_out


def _instructions(path: str, count: int) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is missing (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(  # valgrind on this module
            [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                "-m",
                "bench.callgrind_channels",
                "--run",
                path,
                str(count),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the {path} run failed:\n{done.stdout}\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=[*PATHS, "all"], default="all")
    parser.add_argument("--run", nargs=2, metavar=("PATH", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        import uvloop

        path, count = args.run[0], int(args.run[1])
        delivered = uvloop.run(_deliver(path, count))
        if delivered != count:
            raise SystemExit(f"{path}: delivered {delivered} of {count}")
        return
    for path in PATHS if args.path == "all" else (args.path,):
        small, large = _instructions(path, SMALL), _instructions(path, LARGE)
        per = (large - small) / (LARGE - SMALL)
        print(f"{path:9} {per:9,.0f} instructions per delivered message")


if __name__ == "__main__":
    main()
