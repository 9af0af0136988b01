"""The gate of the endpoints that start runs (``POST /run``, AG-UI, the Vercel AI SDK
chat): what a request must be before its body is read.

A browser sends a cross-site "simple" request (``Content-Type: text/plain``, a form)
without asking first, so a page on any site could make its visitors start runs, on the
visitor's per-address budget and the operator's model bill. The gate closes that door:

- the body must be declared JSON (``application/json``, UTF-8 if a charset is named),
  else 415: a browser sends such a request cross-site only after a CORS preflight;
- a request whose ``Origin`` the app's ``allowed_origins`` does not admit is refused
  with 403 (the rule WebSocket connections follow, :func:`broadcaster.protocol.check_origin`;
  a request without ``Origin`` does not come from a page and passes);
- a preflight (``OPTIONS``) is answered, with the CORS headers a page needs, for an
  admitted origin only, and every answer to an admitted origin carries them, so that a
  dashboard served from another allowed origin can start and follow runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from broadcaster._text import excerpt
from broadcaster.exceptions import ProtocolError
from broadcaster.protocol import check_origin
from broadcaster.settings import AppConfig

__all__ = ["GATED_METHODS", "Endpoint", "content_type_refusal", "origin_refusal", "run_gate"]

Endpoint = Callable[[Request], Awaitable[Response]]
GATED_METHODS = ["POST", "OPTIONS"]
"""The methods of a gated route: the request, and its CORS preflight."""

_ALLOW_HEADERS = "Authorization, Content-Type, Accept"
_EXPOSE_HEADERS = "Retry-After, X-Session-Token"
_PREFLIGHT_MAX_AGE = "600"


class _Host(Protocol):
    @property
    def app(self) -> AppConfig: ...


def run_gate(host: _Host, endpoint: Endpoint) -> Endpoint:
    """``endpoint`` (a run-starting ``POST``) behind the gate of the module doc; route
    it with :data:`GATED_METHODS`."""

    async def gated(request: Request) -> Response:
        origin = request.headers.get("origin")
        refused = origin_refusal(host.app, origin)
        if refused is None and request.method == "OPTIONS":
            return _preflight(origin)
        refused = refused or content_type_refusal(request)
        if refused is not None:
            return refused
        response = await endpoint(request)
        return response if origin is None else _WithHeaders(response, _cors(origin))

    return gated


def origin_refusal(app: AppConfig, origin: str | None) -> Response | None:
    """403 for a request from a page whose origin ``app`` does not admit; None to go on."""
    if origin is None:
        return None  # not sent by a page: a server, a script, an SDK
    try:
        check_origin(app, origin)
    except ProtocolError as exc:
        return _error(403, f"{exc} (allowed_origins): this origin may not start runs")
    return None


def content_type_refusal(request: Request) -> Response | None:
    """415 unless the body is declared ``application/json`` (charset UTF-8 if named)."""
    given = request.headers.get("content-type", "")
    media, _, parameters = given.partition(";")
    if media.strip().lower() == "application/json" and _utf8(parameters):
        return None
    shown = excerpt(given) if given else "none"
    return _error(
        415,
        f"{request.method} {request.url.path} takes a JSON body: send it with "
        f"'Content-Type: application/json' (got {shown})",
    )


def _utf8(parameters: str) -> bool:
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower() in ("utf-8", "utf8")
    return True


def _preflight(origin: str | None) -> Response:
    headers = {"Allow": ", ".join(GATED_METHODS)}
    if origin is not None:
        headers |= _cors(origin) | {
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": _ALLOW_HEADERS,
            "Access-Control-Max-Age": _PREFLIGHT_MAX_AGE,
        }
    return Response(status_code=204, headers=headers)


def _cors(origin: str) -> dict[str, str]:
    """What lets a page on ``origin`` (admitted) read the answer."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": _EXPOSE_HEADERS,
        "Vary": "Origin",
    }


class _WithHeaders(Response):
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


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
