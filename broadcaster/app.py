"""The ASGI application: the composition of node, routes and extensions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from broadcaster.extensions import ExtensionContext, load_extension
from broadcaster.http_api import PublishFastPath, api_routes
from broadcaster.metrics import CONTENT_TYPE
from broadcaster.node import Node
from broadcaster.sessions import routes as session_routes
from broadcaster.settings import Settings
from broadcaster.sse import routes as sse_routes
from broadcaster.transport import HANDLERS_STATE, POSTS_STATE
from broadcaster.websocket import BadPathEndpoint, NativeAppEndpoint, WebSocketEndpoint

__all__ = ["create_app"]


def create_app(settings: Settings, node: Node | None = None) -> Starlette:
    """Build the server application for ``settings`` (with its extensions installed).

    Args:
        settings: validated settings.
        node: the node to serve (default: a new one for ``settings``); the lifespan
            starts and stops it.
    """
    node = node or Node(settings)
    fast = PublishFastPath(node)
    ctx = ExtensionContext(settings=settings, node=node)
    for name in _extension_names(settings):
        load_extension(name)(ctx)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(node.running())
            for hook in ctx.lifespans:
                await stack.enter_async_context(hook())
            # Lifespan state reaches the server's protocols: the fast path serves
            # /app/{key} natively through it (see broadcaster._uvicorn), and the HTTP
            # protocol the publish routes (see broadcaster._guard).
            yield {HANDLERS_STATE: NativeAppEndpoint(node), POSTS_STATE: fast}

    app = _Application(fast, routes=_routes(node, settings, ctx.routes), lifespan=lifespan)
    app.state.settings = settings
    app.state.node = node
    app.state.extensions = ctx.state
    return app


class _Application(Starlette):
    """Starlette, with the HTTP API's publish routes served before its middleware and
    routing (:class:`broadcaster.http_api.PublishFastPath`): they are the requests an
    agent deployment sends most."""

    def __init__(self, fast: PublishFastPath, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fast = fast

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = self._fast.match(scope)
            if found is not None:
                await self._fast.serve(scope, receive, send, *found)
                return
        await super().__call__(scope, receive, send)


def _routes(node: Node, settings: Settings, extra: list[BaseRoute]) -> list[BaseRoute]:
    async def ready(request: Request) -> Response:
        """Readiness: 200 while the backend is connected and takes writes, else 503
        saying why (``disconnected``, ``refuses writes (READONLY ...)``, ``stopped``)."""
        if node.ready:
            return JSONResponse({"status": "ready"})
        problem = node.backend.problem or "disconnected"
        return JSONResponse({"status": "unavailable", "backend": problem}, 503)

    async def metrics(request: Request) -> Response:
        return Response(node.metrics.render(), media_type=CONTENT_TYPE)

    routes: list[BaseRoute] = [
        Route("/up", _up),
        Route("/ready", ready),
        WebSocketRoute("/app/{key}", WebSocketEndpoint(node)),
        *api_routes(node),
        *session_routes(node),
        *sse_routes(node),
    ]
    if settings.metrics:
        routes.append(Route("/metrics", metrics))
    routes += extra
    routes.append(WebSocketRoute("/{path:path}", BadPathEndpoint()))
    return routes


def _extension_names(settings: Settings) -> list[str]:
    names = list(settings.extensions)
    if settings.demo and "demo" not in names:
        names.append("demo")
    return names


async def _up(request: Request) -> Response:
    """Liveness: the process answers."""
    return JSONResponse({"status": "up"})
