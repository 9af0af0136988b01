"""Agent sessions: who may see a session, and its stored final state.

A session ``<id>`` publishes on ``agent.<id>`` (public) or ``private-agent.<id>``
(private). Everything that serves a session over HTTP (the state endpoint, SSE, AG-UI,
the demo's ``POST /run``) resolves the channel here, with one rule: a private session is
reached only with its session token (``Authorization: Bearer`` or ``?token=``) or a
signed ``?auth=`` for its channel.

``GET /api/sessions/{session_id}/state`` serves the session's final slim snapshot,
stored under its channel by whoever ran the agent
(:class:`broadcaster.publishers.StateStore`), so a UI can reconcile what it built from
events with the final state.
"""

from __future__ import annotations

import hmac
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broadcaster._text import excerpt
from broadcaster.backends.base import BackendUnavailable
from broadcaster.node import Node
from broadcaster.publishers import state_key
from broadcaster.settings import AppConfig
from broadcaster.signing import (
    SESSION_TOKEN,
    purpose_signature,
    stream_auth,
    verify_stream_auth,
)

__all__ = [
    "SESSION_ID",
    "SessionRefused",
    "bearer_token",
    "private_channel",
    "private_session_exists",
    "public_channel",
    "request_app",
    "routes",
    "session_channel",
    "session_token",
    "stream_auth",
    "token_grants",
]

SESSION_ID = re.compile(r"^[A-Za-z0-9_\-=@,.;]{1,128}$")
"""Session ids are what may follow ``agent.`` in a channel name."""


class SessionRefused(Exception):
    """The request may not see the session; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def public_channel(session_id: str) -> str:
    return f"agent.{session_id}"


def private_channel(session_id: str) -> str:
    return f"private-agent.{session_id}"


def session_token(app: AppConfig, session_id: str) -> str:
    """The bearer token of one private session: the hex HMAC-SHA256 of its id under the
    app's :data:`~broadcaster.signing.SESSION_TOKEN` key (derived from the secret, so a
    token is never a Pusher signature nor a stream authorization)."""
    return purpose_signature(app.secret, SESSION_TOKEN, session_id)


def token_grants(app: AppConfig, token: str | None, session_id: str) -> bool:
    """Whether ``token`` is the session's token (constant-time)."""
    expected = session_token(app, session_id).encode()
    return bool(token) and hmac.compare_digest(str(token).encode(), expected)


def bearer_token(request: Request) -> str | None:
    """``Authorization: Bearer <token>``, else ``?token=``."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query_params.get("token")


def request_app(node: Node, request: Request) -> AppConfig:
    """The app named by ``?app_id=`` (default: the first one).

    Raises:
        SessionRefused: 404 unknown app, 403 disabled app.
    """
    app_id = request.query_params.get("app_id") or node.apps[0].id
    app = node.app_by_id(app_id)
    if app is None:
        raise SessionRefused(404, f"unknown app {excerpt(app_id)}")
    if not app.enabled:
        raise SessionRefused(403, f"app {excerpt(app_id)} is disabled")
    return app


async def private_session_exists(node: Node, app: AppConfig, session_id: str) -> bool:
    """Whether ``private-agent.<id>`` has events or a stored state.

    Raises:
        BackendUnavailable: the backend cannot be read now.
    """
    channel = private_channel(session_id)
    if await node.backend.load_value(app.id, state_key(channel)) is not None:
        return True
    latest = await node.backend.latest(app.id, channel)
    return latest is not None and latest.offset > 0


async def session_channel(node: Node, app: AppConfig, request: Request, session_id: str) -> str:
    """The channel this request may see: ``private-agent.<id>`` when it carries the
    session's token or a valid ``?auth=``, else ``agent.<id>`` unless the session is
    private.

    Raises:
        SessionRefused: 400 invalid id; 403 wrong credentials or a private session
            asked for without any.
        BackendUnavailable: the backend cannot be read now.
    """
    if not SESSION_ID.fullmatch(session_id):
        raise SessionRefused(400, f"invalid session id {excerpt(session_id)}: {SESSION_ID.pattern}")
    private = private_channel(session_id)
    token, auth = bearer_token(request), request.query_params.get("auth")
    if token is not None or auth is not None:
        if token_grants(app, token, session_id) or verify_stream_auth(
            app.key, app.secret, auth, private
        ):
            return private
        raise SessionRefused(403, f"the token or auth given does not grant session {session_id!r}")
    if await private_session_exists(node, app, session_id):
        raise SessionRefused(
            403,
            f"session {session_id!r} is private: pass ?token=<session token> "
            "(or Authorization: Bearer <token>) or ?auth=<signature of the channel>",
        )
    return public_channel(session_id)


def routes(node: Node) -> list[Route]:
    """The session state route, reading through ``node``'s backend."""

    async def state(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            app = request_app(node, request)
            channel = await session_channel(node, app, request, session_id)
            snapshot = await node.backend.load_value(app.id, state_key(channel))
        except SessionRefused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        if snapshot is None:
            return _error(
                404,
                f"no final state for session {session_id!r}: unknown session, run still "
                "in progress, or its state expired",
            )
        return Response(snapshot, media_type="application/json")

    return [Route("/api/sessions/{session_id}/state", state, methods=["GET"])]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
