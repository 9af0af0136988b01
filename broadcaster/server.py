"""Run the application under uvicorn on a socket we bind ourselves, so that the real
port (also for ``--port 0``) is known and printed before serving.

Graceful shutdown (SIGINT/SIGTERM), in uvicorn's stages: stop accepting, close every
WebSocket client with 4200 ("server closing, reconnect now"; clients that do not answer
within half of ``shutdown_timeout`` are dropped), wait for the connections to finish for
at most ``shutdown_timeout`` seconds, then close the node and backend (lifespan)."""

from __future__ import annotations

import gc
import math
import socket
import sys

import uvicorn

from broadcaster._uvicorn import protocol_class
from broadcaster.app import create_app
from broadcaster.extensions import ExtensionError
from broadcaster.node import Node
from broadcaster.settings import Settings

__all__ = ["serve"]


def serve(settings: Settings) -> None:
    """Serve until interrupted (SIGINT/SIGTERM trigger uvicorn's graceful shutdown)."""
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    try:
        app = create_app(settings)
    except (ValueError, ExtensionError) as exc:  # e.g. an invalid Redis URL, named
        sys.exit(f"agent-broadcaster: {exc}")
    config = uvicorn.Config(
        app,
        # The fast path writes pre-built frames, so frames must never be compressed.
        ws=protocol_class(shutdown_abort_after=settings.shutdown_timeout / 2),
        ws_per_message_deflate=False,
        ws_max_size=_ws_max_size(settings),
        lifespan="on",
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout),
    )
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host  # noqa: S104
    shown = f"[{host}]" if ":" in host else host
    print(f"agent-broadcaster listening on http://{shown}:{port}/", flush=True)
    if settings.demo:
        print(f"Open the demo dashboard: http://{shown}:{port}/", flush=True)
    _tune_gc()
    _Server(config, app.state.node).run(sockets=[sock])


def _tune_gc() -> None:
    # What exists now (modules, settings, the app) lives as long as the process:
    # freeze it so that collections stop scanning it. (A larger first-generation
    # threshold was faster still, but let closed connections' garbage linger, so
    # memory no longer returned near its baseline after churn: not done.)
    gc.collect()
    gc.freeze()


class _Server(uvicorn.Server):
    """uvicorn's server, ending HTTP streams as its graceful shutdown starts (uvicorn
    gives a streaming response no signal of its own)."""

    def __init__(self, config: uvicorn.Config, node: Node) -> None:
        super().__init__(config)
        self._node = node

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._node.close_streams()
        await super().shutdown(sockets)


def _ws_max_size(settings: Settings) -> int:
    # Messages up to this size reach the app, which answers oversize ones (above the
    # app's max_message_size) with pusher:error 4302; larger ones are closed with 1009.
    largest = max(app.max_message_size for app in settings.apps())
    return max(1 << 20, 4 * largest)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sys.exit(f"agent-broadcaster: cannot listen on {host}:{port}: {exc.strerror}")
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
