"""The plain-``websockets`` reference: the Python floor that the server must beat.

The least a Python broadcast server can do: one ``PSUBSCRIBE bench:*`` on Redis, and
each message (a ready frame) is handed as is to :func:`websockets.asyncio.server.broadcast`
for the connections subscribed to its channel. Clients speak just enough of the Pusher
protocol for the load generator: ``pusher:connection_established``, ``pusher:subscribe``
answered by ``pusher_internal:subscription_succeeded``, and ``pusher:ping``.

No authentication, history, limits, slow-consumer policy or metrics: it is a floor, not
a server. Run as ``python -m bench.ref_websockets --redis URL [--port 0] [--loop uvloop]``;
it prints ``websockets listening on http://127.0.0.1:PORT/`` once bound and subscribed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import Redis
from websockets.asyncio.server import ServerConnection, broadcast, serve

__all__ = ["main"]

_ESTABLISHED = json.dumps(
    {
        "event": "pusher:connection_established",
        "data": json.dumps({"socket_id": "1.1", "activity_timeout": 120}),
    }
)

channels: dict[str, set[ServerConnection]] = {}


async def _handler(ws: ServerConnection) -> None:
    mine: set[str] = set()
    await ws.send(_ESTABLISHED)
    try:
        async for message in ws:
            msg = json.loads(message)
            event = msg.get("event")
            if event == "pusher:subscribe":
                channel = msg["data"]["channel"]
                channels.setdefault(channel, set()).add(ws)
                mine.add(channel)
                reply = {"event": "pusher_internal:subscription_succeeded", "channel": channel}
                await ws.send(json.dumps({**reply, "data": "{}"}))
            elif event == "pusher:ping":
                await ws.send('{"event":"pusher:pong","data":"{}"}')
    finally:
        for channel in mine:
            members = channels.get(channel)
            if members is not None:
                members.discard(ws)
                if not members:
                    del channels[channel]


async def _pump(redis_url: str, subscribed: asyncio.Event) -> None:
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.psubscribe("bench:*")
    subscribed.set()
    async for message in pubsub.listen():
        if message["type"] != "pmessage":
            continue
        members = channels.get(message["channel"][6:].decode())
        if members:
            broadcast(members, message["data"].decode())


async def _serve(args: argparse.Namespace) -> None:
    subscribed = asyncio.Event()
    pump = asyncio.create_task(_pump(args.redis, subscribed))
    async with serve(
        _handler, "127.0.0.1", args.port, compression=None, max_queue=None, backlog=4096
    ) as server:
        await subscribed.wait()
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"websockets listening on http://127.0.0.1:{port}/", flush=True)
        stop = asyncio.get_running_loop().create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set_result, None)
        await stop
    pump.cancel()


def _run(main: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.ref_websockets --redis URL``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="redis://host:port/db")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    _run(_serve(args), args.loop)


if __name__ == "__main__":
    main()
