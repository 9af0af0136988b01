"""Agent sessions: who may see a session, and its stored final state.

A session ``<id>`` publishes on ``agent.<id>`` (public) or ``private-agent.<id>``
(private). Everything that serves a session over HTTP (the state endpoint, SSE, AG-UI,
the demo's ``POST /run``) resolves the channel here, with one rule: a private session is
reached only with its session token (``Authorization: Bearer`` or ``?token=``) or a
signed ``?auth=`` for its channel.

A session token belongs to one claim of the session (:func:`claim_session`): the first
run of a private session claims its id with a random nonce, kept in the backend (memory
or Redis) for ``ttl`` seconds and renewed by every run its token starts. The token is
the HMAC of the id and that nonce, so once the claim has expired and someone else
claims the id, the new claimant gets a new token and the old one grants nothing.

``GET /api/sessions/{session_id}/state`` serves the session's final slim snapshot,
stored under its channel by whoever ran the agent
(:class:`broadcaster.publishers.StateStore`), so a UI can reconcile what it built from
events with the final state.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass

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
    "SessionClaim",
    "SessionRefused",
    "bearer_token",
    "claim_key",
    "claim_session",
    "private_channel",
    "private_session_exists",
    "public_channel",
    "release_claim",
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


def claim_key(session_id: str) -> str:
    """The backend claim key of a private session (its owner: the claim's nonce)."""
    return f"session:{session_id}"


def session_token(app: AppConfig, session_id: str, nonce: str) -> str:
    """The bearer token of one claim of a private session: the hex HMAC-SHA256 of its id
    and the claim's nonce under the app's :data:`~broadcaster.signing.SESSION_TOKEN` key
    (derived from the secret, so a token is never a Pusher signature nor a stream
    authorization). Session ids hold no newline, so no other pair signs the same text."""
    return purpose_signature(app.secret, SESSION_TOKEN, f"{session_id}\n{nonce}")


def _grants(app: AppConfig, token: str | None, session_id: str, nonce: str) -> bool:
    expected = session_token(app, session_id, nonce).encode()
    return bool(token) and hmac.compare_digest(str(token).encode(), expected)


async def token_grants(node: Node, app: AppConfig, token: str | None, session_id: str) -> bool:
    """Whether ``token`` is the token of the session's current claim (constant-time).

    Raises:
        BackendUnavailable: the claim cannot be read now.
    """
    if not token:
        return False
    nonce = await node.backend.claim_holder(app.id, claim_key(session_id))
    return nonce is not None and _grants(app, token, session_id, nonce)


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """A claim on a private session id; ``new``: made by this request."""

    session_id: str
    nonce: str
    new: bool

    def token(self, app: AppConfig) -> str:
        """The session token of this claim."""
        return session_token(app, self.session_id, self.nonce)


async def claim_session(
    node: Node, app: AppConfig, token: str | None, session_id: str, ttl: float
) -> SessionClaim | None:
    """The claim a run on private session ``session_id`` goes under: the current one,
    renewed for ``ttl`` seconds, when ``token`` is its token; a new one when nobody
    holds the id and nothing of it is kept (:func:`private_session_exists`). None: the
    session is someone else's.

    Raises:
        BackendUnavailable: the backend cannot be read or written now.
    """
    key = claim_key(session_id)
    nonce = await node.backend.claim_holder(app.id, key)
    if nonce is not None:
        if not _grants(app, token, session_id, nonce):
            return None
        renewed = await node.backend.claim_value(app.id, key, nonce, ttl)
        return SessionClaim(session_id, nonce, new=False) if renewed else None
    if await private_session_exists(node, app, session_id):
        return None  # an expired claim's events or state are still kept: not anyone's yet
    nonce = secrets.token_hex(16)
    if not await node.backend.claim_value(app.id, key, nonce, ttl):
        return None  # claimed by another request meanwhile
    return SessionClaim(session_id, nonce, new=True)


async def release_claim(node: Node, app: AppConfig, claim: SessionClaim) -> None:
    """Give up a claim this request made (``new``) when its run did not start, so that
    the id is not held for nobody. Raises what the backend raises."""
    if claim.new:
        await node.backend.release_value(app.id, claim_key(claim.session_id), claim.nonce)


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
        if await token_grants(node, app, token, session_id) or verify_stream_auth(
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
