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
  dashboard served from another allowed origin can start and follow runs
  (:mod:`broadcaster.cors`).
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broadcaster._text import excerpt
from broadcaster.cors import Endpoint, WithHeaders, cors_headers, preflight
from broadcaster.exceptions import ProtocolError
from broadcaster.protocol import check_origin
from broadcaster.settings import AppConfig

__all__ = ["GATED_METHODS", "Endpoint", "content_type_refusal", "origin_refusal", "run_gate"]

GATED_METHODS = ["POST", "OPTIONS"]
"""The methods of a gated route: the request, and its CORS preflight."""


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
            return preflight(host.app, request, ["POST"])
        refused = refused or content_type_refusal(request)
        if refused is not None:
            return refused
        response = await endpoint(request)
        return response if origin is None else WithHeaders(response, cors_headers(origin))

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


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
