"""CORS: what a page on another origin may read from the server and send to it.

A page served from another origin (an app built on the client kit, a dashboard on
another host) reads a session's stored state, its events (SSE), a run's trace, the run
list and the demo's config, asks ``/broadcasting/auth`` to sign a private channel, and
starts runs. The browser hands it an answer only when the answer names its origin
(``Access-Control-Allow-Origin``), and sends a request with a header beyond the
safelisted ones (``Authorization: Bearer <session token>``, a JSON body) only once a
preflight (``OPTIONS``) has allowed it.

The origins come from the app's ``allowed_origins``, the rule WebSocket connections
follow (:func:`broadcaster.protocol.check_origin`): ``--allowed-origins`` /
``BROADCASTER_ALLOWED_ORIGINS`` for the single app, or per app in the apps file (``*``,
the default, admits any origin).

- An admitted origin gets the CORS headers on every answer of these routes, errors
  included, so that a page can read why it was refused; its preflight is answered 204.
- Any other origin gets no CORS headers, and its preflight is refused with 403 saying
  why.
- CORS grants nothing by itself: a private session still needs its token, sent as a
  header (allowed by the preflight) or a query parameter. Cookies are not used, so
  credentialed requests are not allowed (no ``Access-Control-Allow-Credentials``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from broadcaster._text import excerpt
from broadcaster.exceptions import ProtocolError
from broadcaster.protocol import AppRules, check_origin

__all__ = [
    "ALLOW_HEADERS",
    "EXPOSE_HEADERS",
    "READ_METHODS",
    "AppOf",
    "Endpoint",
    "WithHeaders",
    "admitted",
    "cors_headers",
    "cross_origin",
    "preflight",
]

Endpoint = Callable[[Request], Awaitable[Response]]
AppOf = Callable[[Request], AppRules | None]
"""The app whose ``allowed_origins`` rule a request (None: no such app: no CORS)."""

READ_METHODS = ["GET", "OPTIONS"]
"""The methods of a route that pages read: the request, and its preflight."""

ALLOW_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID, Cache-Control"
"""What a page may send: a session token, a JSON body, an event stream's resume point."""
EXPOSE_HEADERS = "Retry-After, X-Session-Token, ETag, Content-Disposition"
PREFLIGHT_MAX_AGE = "600"


def admitted(app: AppRules | None, origin: str | None) -> bool:
    """Whether a page on ``origin`` may read ``app``'s answers."""
    if app is None or origin is None:
        return False
    try:
        check_origin(app, origin)
    except ProtocolError:
        return False
    return True


def cors_headers(origin: str) -> dict[str, str]:
    """What lets a page on ``origin`` (admitted) read an answer."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": EXPOSE_HEADERS,
        "Vary": "Origin",
    }


def preflight(app: AppRules | None, request: Request, methods: Sequence[str]) -> Response:
    """The answer to ``OPTIONS``: 204 allowing ``methods`` and :data:`ALLOW_HEADERS` to
    an admitted origin; 204 with ``Allow`` alone without ``Origin`` (not a browser's
    preflight); 403, without CORS headers, to any other origin."""
    origin = request.headers.get("origin")
    headers = {"Allow": ", ".join([*methods, "OPTIONS"])}
    if origin is None:
        return Response(status_code=204, headers=headers)
    if not admitted(app, origin):
        shown = excerpt(origin, 100)
        return JSONResponse(
            {
                "error": f"origin {shown} is not in allowed_origins: pages there may not "
                f"read or call {request.url.path}"
            },
            status_code=403,
            headers={"Vary": "Origin"},
        )
    headers |= cors_headers(origin) | {
        "Access-Control-Allow-Methods": ", ".join(methods),
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
    }
    return Response(status_code=204, headers=headers)


def cross_origin(endpoint: Endpoint, app_of: AppOf, methods: Sequence[str] = ("GET",)) -> Endpoint:
    """``endpoint`` readable by pages on the origins :data:`AppOf` admits; route it with
    ``methods`` plus ``OPTIONS`` (:data:`READ_METHODS` for a ``GET``)."""

    async def shared(request: Request) -> Response:
        if request.method == "OPTIONS":
            return preflight(app_of(request), request, methods)
        response = await endpoint(request)
        origin = request.headers.get("origin")
        if admitted(app_of(request), origin):
            assert origin is not None
            return WithHeaders(response, cors_headers(origin))
        return WithHeaders(response, {"Vary": "Origin"})

    return shared


class WithHeaders(Response):
    """``inner``, answered with ``headers`` added to its head (also a streaming answer
    that builds its head only when it is sent)."""

    def __init__(self, inner: Response, headers: dict[str, str]) -> None:
        self.inner = inner
        self.extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *self.extra]}
            await send(message)

        await self.inner(scope, receive, sending)
