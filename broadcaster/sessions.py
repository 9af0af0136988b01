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

import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broadcaster._text import excerpt
from broadcaster.backends.base import BackendUnavailable
from broadcaster.cors import READ_METHODS, AppOf, Endpoint, cross_origin
from broadcaster.exceptions import ApiError
from broadcaster.limits import ClientBuckets, client_address
from broadcaster.node import Node
from broadcaster.publishers import state_key
from broadcaster.run_index import (
    MAX_QUERY,
    RunFilter,
    RunIndex,
    build_trace,
    decode_cursor,
    encode_cursor,
    encode_trace,
)
from broadcaster.settings import AppConfig
from broadcaster.signing import (
    SESSION_TOKEN,
    purpose_signature,
    stream_auth,
    verify_request,
    verify_stream_auth,
)

__all__ = [
    "RUN_LIVENESS",
    "SCAN_BUDGET",
    "SESSION_ID",
    "TRACE_FORMATS",
    "FormatUnavailable",
    "SessionClaim",
    "SessionRefused",
    "asked_app",
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

_N = TypeVar("_N", int, float)

SESSION_ID = re.compile(r"^[A-Za-z0-9_\-=@,.;]{1,128}$")
"""Session ids are what may follow ``agent.`` in a channel name."""


class FormatUnavailable(Exception):
    """Raised by a trace exporter (:data:`TRACE_FORMATS`) that cannot work here, e.g. its
    optional packages are not installed; the trace route answers 501 with the message."""


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


def _listed_app(node: Node, request: Request) -> AppConfig:
    """The app whose runs ``GET /api/sessions`` lists: the first one, or the one named
    by ``?app_key=`` (or, signed, ``auth_key``). Another app named by ``?app_id=`` alone
    is refused: its runs are listed only to whoever has its key, as its channels are
    read (the key is in its own pages, not guessable like a small app id).

    Raises:
        SessionRefused: 404 unknown key, 403 another app without its key or a disabled
            app.
    """
    params = request.query_params
    key = params.get("app_key") or params.get("auth_key")
    app_id = params.get("app_id")
    if key is None:
        if app_id is not None and app_id != node.apps[0].id:
            raise SessionRefused(
                403,
                f"listing the runs of app {excerpt(app_id)} needs its key: add "
                "app_key=<its key>, or sign the request as the app",
            )
        app = node.apps[0]
    else:
        found = node.app_by_key(key)
        if found is None or (app_id is not None and app_id != found.id):
            raise SessionRefused(404, f"no app with key {excerpt(key)} (and that app_id)")
        app = found
    if not app.enabled:
        raise SessionRefused(403, f"app {excerpt(app.id)} is disabled")
    return app


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


def asked_app(node: Node, request: Request) -> AppConfig | None:
    """The app named by ``?app_id=`` (default: the first one), None when there is none:
    whose ``allowed_origins`` decide who may read the answer (:mod:`broadcaster.cors`)."""
    return node.app_by_id(request.query_params.get("app_id") or node.apps[0].id)


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
    """The session routes (state, the run index, traces), reading through ``node``'s
    backend."""

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

    settings = node.settings
    rate, burst = settings.run_list_rate, settings.run_list_burst
    listing = ClientBuckets(rate, burst) if rate else None

    async def sessions(request: Request) -> Response:
        client = client_address(request)
        wait = 0.0 if listing is None or client is None else listing.take(client)
        if wait:
            retry = max(1, math.ceil(wait))
            message = (
                f"too many run list requests from {client}: at most {burst} in a row, then "
                f"{rate:g} a second (run_list_rate); retry in {retry} s"
            )
            return _error(429, message, headers={"Retry-After": str(retry)})
        try:
            app = _listed_app(node, request)
            query = _list_query(app, request)
            body = await _list(node.backend.runs, app, query)
        except SessionRefused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        etag = '"' + hashlib.sha1(body, usedforsecurity=False).hexdigest()[:20] + '"'
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    async def runs(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            app = request_app(node, request)
            channel = await session_channel(node, app, request, session_id)
            found = await node.backend.runs.session_runs(app.id, channel)
        except SessionRefused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        if not found:
            return _error(404, f"no runs of session {session_id!r} (unknown, or expired)")
        liveness = request.app.state.extensions.get(RUN_LIVENESS)
        if liveness is not None and any(_RUNNING in raw for raw in found):
            try:
                found = _mark_abandoned(found, await liveness(app.id, session_id))
            except BackendUnavailable as exc:
                return _error(503, str(exc))
        body = b'{"session_id":' + orjson.dumps(session_id) + b',"runs":['
        return Response(body + b",".join(found) + b"]}", media_type="application/json")

    async def trace(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        params = request.query_params
        execution_id, kind = params.get("execution_id"), params.get("format", "json")
        exporter = None
        if kind != "json":
            exporter = request.app.state.extensions.get(TRACE_FORMATS, {}).get(kind)
        try:
            if not execution_id or len(execution_id) > 128:
                raise SessionRefused(400, "execution_id is required (1 to 128 characters)")
            if kind not in ("json", "otlp"):
                raise SessionRefused(400, f"format must be json or otlp, not {excerpt(kind)}")
            if exporter is None and kind != "json":
                raise SessionRefused(
                    501,
                    "format=otlp needs the OpenTelemetry mapping of agent_core: install "
                    "agent-broadcaster[otel] and serve with --demo (format=json works here)",
                )
            app = request_app(node, request)
            channel = await session_channel(node, app, request, session_id)
            found = await _trace(node.backend.runs, app.id, channel, execution_id)
        except SessionRefused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        if found is None:
            return _error(404, f"no run {execution_id!r} in session {session_id!r}")
        summary, stored = found
        name = _filename(f"{session_id}-{execution_id}")
        if exporter is not None:
            envelopes = [entry["envelope"] for entry in stored["envelopes"]]
            # Up to 2 MiB of envelopes through the OpenTelemetry SDK: not on the loop.
            try:
                body = orjson.dumps(await run_in_threadpool(exporter, envelopes))
            except FormatUnavailable as exc:
                return _error(501, str(exc))
            name += ".otlp"
        else:
            answer = {
                "session_id": session_id,
                "execution_id": execution_id,
                "trimmed": stored["trimmed"],
                "summary": summary,
                "envelopes": stored["envelopes"],
            }
            body = orjson.dumps(answer)
        headers = {"Content-Disposition": f'attachment; filename="{name}.json"'}
        return Response(body, media_type="application/json", headers=headers)

    def read(path: str, endpoint: Endpoint, app_of: AppOf | None = None) -> Route:
        app_of = app_of or (lambda request: asked_app(node, request))
        return Route(path, cross_origin(endpoint, app_of), methods=READ_METHODS)

    def listed_app(request: Request) -> AppConfig | None:
        """The list's app (``app_key``, else as every route: :func:`asked_app`): its
        ``allowed_origins`` decide who may read the answer."""
        key = request.query_params.get("app_key") or request.query_params.get("auth_key")
        return node.app_by_key(key) if key else asked_app(node, request)

    return [
        read("/api/sessions", sessions, listed_app),
        read("/api/sessions/{session_id}/state", state),
        read("/api/sessions/{session_id}/runs", runs),
        read("/api/sessions/{session_id}/trace", trace),
    ]


RUN_LIVENESS = "run_liveness"
"""The key, in the extensions' shared state, of ``async (app_id, session_id) -> bool``:
whether a run of the session is being run now (by whoever runs the session's runs one
at a time: the agent_core extension registers one that reads the session's run claim).
With it, ``GET /api/sessions/{id}/runs`` marks the runs the index lists as running but
nothing runs any more (their server went away before they ended) ``"abandoned": true``."""

_RUNNING = b'"status":"running"'


def _mark_abandoned(found: list[bytes], active: bool) -> list[bytes]:
    """``found`` (stored summaries, oldest first) with ``"abandoned":true`` added to each
    run still listed as running that nothing runs: any but the session's latest (a
    session runs one run at a time: a later one started), and the latest when
    ``active`` is False. Summaries are compact JSON objects, so the field goes before
    the closing brace."""
    latest = len(found) - 1
    return [
        raw[:-1] + b',"abandoned":true}' if _RUNNING in raw and (i < latest or not active) else raw
        for i, raw in enumerate(found)
    ]


TRACE_FORMATS = "trace_formats"
"""The key, in the extensions' shared state, of a ``{format: exporter}`` dict: an
exporter turns a run's envelopes (dicts, in order) into a JSON-able document, or raises
:class:`FormatUnavailable` (answered 501). The agent_core extension registers ``otlp``
(:mod:`agent_core.integrations.otel`, which needs the ``[otel]`` extra)."""

MAX_PAGE = 200
DEFAULT_PAGE = 50
SCAN_BUDGET = 1000
"""The most index entries one list request reads: a filter that matches little gets a
partial page and a ``next_cursor`` to go on from (a few milliseconds of the event loop
per request, not the whole index's 50)."""
_STATUSES = ("running", "completed", "failed")


@dataclass(frozen=True, slots=True)
class _ListQuery:
    limit: int
    before: tuple[int, str] | None
    start_min: int | None
    start_max: int | None
    accepts: RunFilter


def _list_query(app: AppConfig, request: Request) -> _ListQuery:
    """The parameters of ``GET /api/sessions``, checked.

    Raises:
        SessionRefused: 400 naming a bad parameter; 401 a bad app signature.
    """
    params = request.query_params
    limit = _number(params, "limit", int, DEFAULT_PAGE)
    if not 1 <= limit <= MAX_PAGE:
        raise SessionRefused(400, f"limit must be 1 to {MAX_PAGE}, not {limit}")
    before = None
    if params.get("cursor"):
        try:
            before = decode_cursor(params["cursor"], app.secret)
        except ValueError as exc:
            raise SessionRefused(400, str(exc)) from None
    status = params.get("status") or None
    if status is not None and status not in _STATUSES:
        raise SessionRefused(
            400, f"status must be one of {', '.join(_STATUSES)}, not {excerpt(status)}"
        )
    q = params.get("q") or None
    if q is not None and len(q) > MAX_QUERY:
        raise SessionRefused(400, f"q may hold at most {MAX_QUERY} characters, not {len(q)}")
    for name in ("stop_reason", "resolved_by"):
        if len(params.get(name) or "") > MAX_QUERY:
            raise SessionRefused(400, f"{name} may hold at most {MAX_QUERY} characters")
    start = _number(params, "from", float, None)
    end = _number(params, "to", float, None)
    if start is not None and end is not None and start > end:
        raise SessionRefused(400, f"from ({start:g}) is after to ({end:g})")
    signed = any(name in params for name in ("auth_key", "auth_signature"))
    if signed:
        try:
            verify_request(app, "GET", request.url.path, dict(params), b"", time.time())
        except ApiError as exc:
            raise SessionRefused(exc.status, str(exc)) from None
    accepts = RunFilter(
        status=status,
        stop_reason=params.get("stop_reason") or None,
        resolved_by=params.get("resolved_by") or None,
        q=q,
        private=signed,
    )
    return _ListQuery(
        limit,
        before,
        None if start is None else math.ceil(start * 1000),
        None if end is None else math.floor(end * 1000),
        accepts,
    )


def _number(params: Mapping[str, str], name: str, kind: type[_N], default: _N | None) -> _N:
    text = params.get(name)
    if text is None or text == "":
        return default  # type: ignore[return-value]
    try:
        value = kind(text)
    except ValueError:
        raise SessionRefused(400, f"{name} must be a number, not {excerpt(text)}") from None
    if not math.isfinite(value) or abs(value) > 1e12:
        raise SessionRefused(400, f"{name} must be a finite number of reasonable size")
    return value


async def _list(index: RunIndex, app: AppConfig, query: _ListQuery) -> bytes:
    """One page of the index, newest first: ``{"runs": [...], "next_cursor": ...}``."""
    app_id = app.id
    found: list[bytes] = []
    key_of_last: tuple[int, str] | None = None
    before, scanned, more = query.before, 0, True
    window = query.limit + 1  # the first page of an unfiltered list: one read
    while more and len(found) <= query.limit and scanned < SCAN_BUDGET:
        count = min(window, SCAN_BUDGET - scanned)
        page, next_key = await index.page(
            app_id,
            before=before,
            start_min=query.start_min,
            start_max=query.start_max,
            count=count,
        )
        scanned += count
        window = min(window * 4, 2000)  # a filter that matches little: read more at once
        for entry in page:
            if query.accepts.accepts(entry.summary):
                if len(found) == query.limit:
                    found.append(b"")  # one more: there is a next page
                    break
                found.append(entry.summary)
                key_of_last = (entry.started_ms, entry.member)
        more, before = next_key is not None, next_key
    if len(found) > query.limit:
        cursor: str | None = None if key_of_last is None else encode_cursor(key_of_last, app.secret)
        found = found[: query.limit]
    elif more and before is not None:
        cursor = encode_cursor(before, app.secret)  # the scan budget ran out: go on from here
    else:
        cursor = None
    return b'{"runs":[' + b",".join(found) + b'],"next_cursor":' + orjson.dumps(cursor) + b"}"


async def _trace(
    index: RunIndex, app_id: str, channel: str, execution_id: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The run's summary and trace (stored at its end; read from the channel's history
    while it runs), or None for an unknown run."""
    summary = await index.load_run(app_id, channel, execution_id)
    if summary is None:
        return None
    stored = await index.load_trace(app_id, channel, execution_id)
    if stored is None:
        found = build_trace(await index.kept(app_id, channel), execution_id)
        stored = encode_trace(found.entries, found.trimmed)
    return orjson.loads(summary), orjson.loads(stored)


def _filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-=@,;]", "_", name)[:200]


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)
