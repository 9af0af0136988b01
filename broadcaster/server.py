"""Run the application under uvicorn on a socket we bind ourselves, so that the real
port (also for ``--port 0``) is known and printed before serving."""

from __future__ import annotations

import socket
import sys

import uvicorn

from broadcaster.app import create_app
from broadcaster.settings import Settings

__all__ = ["serve"]


def serve(settings: Settings) -> None:
    """Serve until interrupted (SIGINT/SIGTERM trigger uvicorn's graceful shutdown)."""
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        lifespan="on",
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
    )
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host  # noqa: S104
    shown = f"[{host}]" if ":" in host else host
    print(f"agent-broadcaster listening on http://{shown}:{port}/", flush=True)
    if settings.demo:
        print(f"Open the demo dashboard: http://{shown}:{port}/", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


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
