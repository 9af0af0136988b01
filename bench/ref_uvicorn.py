"""The bare-uvicorn reference of the ``http`` scenario: the cost of an HTTP request
under the same server stack as ours, with nothing done for it.

A minimal ASGI application under uvicorn with the server's settings (uvloop, httptools,
log level ``warning``, no lifespan work): it reads the whole body of any request and
answers ``200`` with ``{}``. The bench sends it the same signed publish requests as our
server; it checks nothing, publishes nothing, delivers nothing. Our ``POST
/apps/{id}/events`` is held to at most twice its CPU per request (issue 17).

Run as ``python -m bench.ref_uvicorn [--port 0]``; it prints ``uvicorn listening on
http://127.0.0.1:PORT/`` once bound.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

__all__ = ["app", "main"]

Message = MutableMapping[str, Any]
_BODY = b"{}"
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
}
_RESPONSE = {"type": "http.response.body", "body": _BODY}


async def app(
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """Read the body, answer ``{}``."""
    if scope["type"] != "http":
        return  # lifespan is off; nothing else is served
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            break
    await send(_START)
    await send(_RESPONSE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", lifespan="off", log_level="warning"
    )
    print(f"uvicorn listening on http://127.0.0.1:{sock.getsockname()[1]}/", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
