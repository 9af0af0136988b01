"""What the HTTP streaming doors (AG-UI, the Vercel AI SDK stream) share: starting a run
for a request with every refusal mapped to its status, and a streaming response that
opens its channel feed before answering."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from agent_core.app.runs import ExecutionTaken, RunHandle, RunRefused, RunRequest, SessionBusy
from broadcaster import envelope as env
from broadcaster.backends.base import Backend, BackendUnavailable
from broadcaster.limits import client_address
from broadcaster.node import Node
from broadcaster.publication import Position
from broadcaster.sessions import SessionClaim, bearer_token, claim_session, release_claim
from broadcaster.settings import AppConfig
from broadcaster.sse import ChannelFeed, stream_feed

__all__ = [
    "FeedResponse",
    "LastRun",
    "RunHost",
    "Started",
    "client_address",
    "envelope_of",
    "json_error",
    "last_run",
    "start_run",
]

logger = logging.getLogger(__name__)

_SCAN_PAGE = 100  # publications per history read when looking for the last run
_FINAL = ("completed", "failed")


class _Runs(Protocol):
    async def start(self, request: RunRequest, client: str | None = None) -> RunHandle: ...


class _Settings(Protocol):
    @property
    def private_sessions(self) -> bool: ...


class RunHost(Protocol):
    """What starting a run needs from the extension that serves the door (the demo)."""

    @property
    def node(self) -> Node: ...

    @property
    def app(self) -> AppConfig: ...

    @property
    def settings(self) -> _Settings: ...

    @property
    def runs(self) -> _Runs | None: ...

    @property
    def claim_ttl(self) -> float:
        """Seconds a private session's claim (and so its token) lasts after its last run
        started (:func:`broadcaster.sessions.claim_session`)."""
        ...


@dataclass(frozen=True, slots=True)
class Started:
    """A run this request started; ``token``: the session token it hands out (private
    sessions), the token of the claim the run went under."""

    handle: RunHandle
    token: str | None = None


def json_error(status: int, message: str, **extra: Any) -> JSONResponse:
    """A JSON error answer: ``{"error": message, ...extra}``."""
    return JSONResponse({"error": message, **extra}, status_code=status)


async def start_run(
    host: RunHost, request: Request, session_id: str, wanted: RunRequest, kind: str
) -> Started | Response:
    """Start ``wanted`` on ``session_id`` for ``request``; the refusal to answer instead:
    403 (someone else's private session; ``kind`` names it, e.g. "thread"), 409 (busy,
    or an execution id that is already a run of the session),
    429/503 with ``Retry-After`` (limits), 503 (backend down)."""
    try:
        claim = await _claim(host, request, session_id, kind)
        if isinstance(claim, Response):
            return claim
        assert host.runs is not None, "the lifespan starts the runs"
        try:
            handle = await host.runs.start(wanted, client_address(request))
        except BaseException:
            await _give_up(host, claim)
            raise
    except SessionBusy as exc:
        return json_error(409, str(exc), session_id=exc.session_id)
    except ExecutionTaken as exc:
        return json_error(409, str(exc), execution_id=exc.execution_id)
    except RunRefused as exc:  # per-client limits, a full node or queue
        return JSONResponse(exc.answer, status_code=exc.status, headers=exc.headers)
    except (BackendUnavailable, RedisError, OSError) as exc:
        return json_error(503, f"cannot start the run now: {exc}")
    return Started(handle, None if claim is None else claim.token(host.app))


async def _claim(
    host: RunHost, request: Request, session_id: str, kind: str
) -> SessionClaim | Response | None:
    """The claim a run on a private session goes under; 403 when the session is
    someone else's (None: sessions are public)."""
    if not host.settings.private_sessions:
        return None
    claim = await claim_session(
        host.node, host.app, bearer_token(request), session_id, host.claim_ttl
    )
    if claim is not None:
        return claim
    return json_error(
        403,
        f"{kind} {session_id!r} is a private session: send its session token "
        "as 'Authorization: Bearer <token>' (the token the run that claimed it was given)",
    )


async def _give_up(host: RunHost, claim: SessionClaim | None) -> None:
    """Release a claim made for a run that did not start (it would hold the id for
    nobody until it expired)."""
    if claim is None:
        return
    try:
        await release_claim(host.node, host.app, claim)
    except Exception as exc:  # it expires after the claim's ttl anyway
        logger.warning("cannot release the claim on session %s: %s", claim.session_id, exc)


class FeedResponse(Response):
    """Opens the feed before answering (503, saying ``what`` cannot be followed, if it
    cannot), streams ``body``, and closes the feed at the end; a client that stops
    reading is dropped as an SSE stream's is (:func:`broadcaster.sse.stream_feed`)."""

    def __init__(
        self,
        feed: ChannelFeed,
        body: AsyncIterator[bytes],
        headers: dict[str, str],
        what: str,
    ) -> None:
        super().__init__(media_type="text/event-stream")
        self.feed = feed
        self.body_iterator = body
        self.stream_headers = headers
        self.what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.feed.__aenter__()
        except BackendUnavailable as exc:
            message = f"{self.what} cannot be followed now: {exc}"
            await json_error(503, message)(scope, receive, send)
            return
        response = StreamingResponse(
            self.body_iterator, 200, self.stream_headers, "text/event-stream"
        )
        await stream_feed(self.feed, response, scope, receive, send)


@dataclass(frozen=True, slots=True)
class LastRun:
    """A session's last run as its channel history tells: its execution id, whether it
    is still going, and (going) the position just before its ``in_progress`` status,
    None when the history no longer reaches back to it."""

    execution_id: str
    going: bool
    start: Position | None = None


async def last_run(
    backend: Backend, app_id: str, channel: str, reach: int, until: Position | None = None
) -> LastRun | None:
    """The last run on ``channel`` (as of ``until``, when given), read from its history
    backwards page by page (at most ``reach`` publications): the last ``agent.status``
    decides. None when the channel has no agent envelopes at all (or ``until`` is of
    another epoch: its stream will say so).

    Raises:
        BackendUnavailable: the history cannot be read now.
    """
    latest = await backend.latest(app_id, channel)
    if latest is None:
        return None
    if until is not None:
        if until.epoch != latest.epoch:
            return None
        latest = Position(min(until.offset, latest.offset), latest.epoch)
    top, lowest, newest = latest.offset, max(0, latest.offset - reach), None
    while top > lowest:
        low = max(lowest, top - _SCAN_PAGE)
        page = await backend.history(app_id, channel, Position(low, latest.epoch), top - low)
        if not page.recovered:
            break
        for publication in reversed(page.publications):
            envelope = envelope_of(publication.event, publication.data)
            if envelope is None or envelope.payload.parent_execution_id is not None:
                continue  # not ours, or a nested run's (a capability's inner agent)
            newest = newest or envelope.execution_id
            if not isinstance(envelope, env.AgentStatus) or envelope.payload.status == "pending":
                continue
            if envelope.payload.status in _FINAL:
                return LastRun(envelope.execution_id, going=False)
            at = publication.position or latest
            return LastRun(envelope.execution_id, True, Position(at.offset - 1, at.epoch))
        top = low
    return None if newest is None else LastRun(newest, True)


def envelope_of(event: str, data: str) -> env.Envelope | None:
    """The envelope a channel message carries; None for another kind of message (logged
    when it is named like one of ours)."""
    if not event.startswith("agent."):
        return None
    try:
        return env.parse_envelope(data)
    except ValueError as exc:  # not ours: published on the channel by someone else
        logger.warning("skipping %s: not an envelope: %s", event, exc)
        return None
