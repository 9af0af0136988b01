"""The ASGI application: the composition of routes, backend and extensions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broadcaster.extensions import ExtensionContext, load_extension
from broadcaster.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings) -> Starlette:
    """Build the server application for ``settings`` (with its extensions installed)."""
    ctx = ExtensionContext(settings=settings)
    for name in _extension_names(settings):
        load_extension(name)(ctx)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for hook in ctx.lifespans:
                await stack.enter_async_context(hook())
            yield

    routes = [Route("/up", _up), Route("/ready", _ready), *ctx.routes]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.settings = settings
    app.state.extensions = ctx.state
    return app


def _extension_names(settings: Settings) -> list[str]:
    names = list(settings.extensions)
    if settings.demo and "demo" not in names:
        names.append("demo")
    return names


async def _up(request: Request) -> Response:
    """Liveness: the process answers."""
    return JSONResponse({"status": "up"})


async def _ready(request: Request) -> Response:
    """Readiness: the process can deliver publications."""
    return JSONResponse({"status": "ready"})
