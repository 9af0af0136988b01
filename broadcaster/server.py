"""Run the application under uvicorn on a socket we bind ourselves, so that the real
port (also for ``--port 0``) is known and printed before serving.

Graceful shutdown (SIGINT/SIGTERM), in uvicorn's stages: stop accepting, close every
WebSocket client with 4200 ("server closing, reconnect now"; clients that do not answer
within half of ``shutdown_timeout`` are dropped), wait for the connections to finish for
at most ``shutdown_timeout`` seconds, then close the node and backend (lifespan).

Below the application, every connection is held to a request-head deadline
(``header_timeout``) and size, and to a number of open connections per client address
(``max_connections_per_ip``): :mod:`broadcaster._guard`. WebSocket messages are limited
from their frame header to the app's ``max_frame_size``."""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import sys
from typing import Any, Literal

import uvicorn

from broadcaster._compat import fast_path_problems, guard_problems, warn_fallback
from broadcaster.app import create_app
from broadcaster.backends import describe_backend
from broadcaster.extensions import ExtensionError
from broadcaster.node import Node
from broadcaster.settings import Settings

__all__ = ["http_protocol", "proxy_options", "serve", "ws_max_size", "ws_protocol"]


def serve(settings: Settings, backend_from: str | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM trigger uvicorn's graceful shutdown).

    Args:
        settings: validated settings.
        backend_from: where the backend URL came from when it was not the settings'
            own (``REDIS_URL``), for the banner.
    """
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    try:
        app = create_app(settings)
    except (ValueError, ExtensionError) as exc:  # e.g. an invalid Redis URL, named
        sys.exit(f"agent-broadcaster: {exc}")
    config = uvicorn.Config(
        app,
        http=http_protocol(settings),
        # The fast path writes pre-built frames, so frames must never be compressed.
        ws=ws_protocol(settings),
        ws_per_message_deflate=False,
        ws_max_size=ws_max_size(settings),
        lifespan="on",
        log_level=settings.log_level,
        **proxy_options(settings),
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout),
    )
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host  # noqa: S104
    shown = f"[{host}]" if ":" in host else host
    source = f" (from {backend_from})" if backend_from else ""
    print(f"agent-broadcaster backend: {describe_backend(settings.backend)}{source}", flush=True)
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


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy-header options: off, as the connection guard names the client of
    a trusted proxy's requests itself (``trusted_proxies``, see :mod:`broadcaster._guard`);
    with uvicorn's own HTTP protocol (the guard does not fit), uvicorn's
    ``X-Forwarded-For`` handling for the same proxies, and none for none."""
    if settings.trusted_proxies and guard_problems():
        return {"proxy_headers": True, "forwarded_allow_ips": list(settings.trusted_proxies)}
    return {"proxy_headers": False}


def http_protocol(settings: Settings) -> type[asyncio.Protocol] | Literal["auto"]:
    """uvicorn's ``http`` for ``settings``: request-head deadline and size limit, and
    the per-client-address connection limit (see :mod:`broadcaster._guard`); uvicorn's
    own, with a warning, when the installed uvicorn fails the compatibility check
    (:mod:`broadcaster._compat`)."""
    problems = guard_problems()
    if problems:
        warn_fallback("the connection guard", problems, "uvicorn's own HTTP protocol")
        return "auto"
    from broadcaster._guard import http_class  # imported only once known to fit

    return http_class(
        settings.max_connections_per_ip, settings.header_timeout, settings.trusted_proxies
    )


def ws_protocol(settings: Settings) -> type[asyncio.Protocol] | Literal["auto"]:
    """uvicorn's ``ws`` for ``settings``: the fast path (:mod:`broadcaster._uvicorn`),
    which drops clients that do not answer the 4200 shutdown close frame within half
    of ``shutdown_timeout``; uvicorn's own WebSocket protocol (the plain ASGI path),
    with a warning, when the installed uvicorn fails the compatibility check."""
    problems = fast_path_problems()
    if problems:
        warn_fallback(
            "the fast WebSocket path", problems, "uvicorn's own WebSocket protocol (ASGI)"
        )
        return "auto"
    from broadcaster._uvicorn import protocol_class  # imported only once known to fit

    return protocol_class(shutdown_abort_after=settings.shutdown_timeout / 2)


def ws_max_size(settings: Settings) -> int:
    """uvicorn's ``ws_max_size``: the largest app's frame limit (``max_frame_size``).
    Natively served connections narrow it to their own app's once admitted; messages
    over it are refused from the frame header with close 1009, before being buffered."""
    return max(app.max_frame_size for app in settings.apps())


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
