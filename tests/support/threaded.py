"""An ASGI app served by uvicorn in a background thread: a local stand-in for a remote
HTTP API (a model provider) that a test's client talks to over a real socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp


@contextmanager
def served_in_thread(app: ASGIApp, what: str) -> Iterator[int]:
    """Serve ``app`` on a free loopback port, yielded once it listens, until the block
    ends. ``what`` names it in a start-up failure."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, ws="none", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive(), f"{what} thread died while starting"
            assert time.monotonic() < deadline, f"{what} did not start within 10s"
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
