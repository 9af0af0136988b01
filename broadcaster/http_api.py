"""The Pusher HTTP API (what server-side SDKs call), a shell around the node.

Every request is signed (:func:`broadcaster.signing.verify_request`: key, timestamp
within 600 s, ``body_md5``, constant-time signature) and bodies are validated by
:mod:`broadcaster.http_models`. Errors are JSON ``{"error": ..., "status": ...}`` with
400 (bad request), 401 (authentication), 403 (app disabled), 404 (no such app),
408 (body too slow, ``body_timeout``), 409 (a state as new or newer is stored), 413 (too
large), 422 (not a session state), 429 (too many stored states) or 503 (the backend is
unreachable).

``PUT .../channels/{channel}/state`` stores the final slim snapshot of the session
publishing on ``channel`` (``agent.<id>`` or ``private-agent.<id>``) where ``GET
/api/sessions/{id}/state`` reads it (:mod:`broadcaster.sessions`), for
:data:`~broadcaster.publishers.STATE_TTL`; so an agent outside the server (a framework
adapter through :class:`~broadcaster.publishers.PusherHTTPPublisher`) can be reconciled
on any backend. At most ``max_session_states`` live states per app and node. A state
replaces the stored one only when its ``execution.updated_at`` is later (409 otherwise),
so a replayed PUT (a signed request is valid for 600 s) never moves a state back.

=====  ==============================================  ====================================
POST   ``/apps/{app_id}/events``                       publish one event on 1-100 channels
POST   ``/apps/{app_id}/batch_events``                 publish up to 10 events
GET    ``/apps/{app_id}/channels``                     occupied channels
GET    ``/apps/{app_id}/channels/{channel}``           one channel's state
GET    ``/apps/{app_id}/channels/{channel}/users``     a presence channel's users
PUT    ``/apps/{app_id}/channels/{channel}/state``     store a session's final state
POST   ``/apps/{app_id}/users/{user_id}/terminate_connections``  close a user's connections
=====  ==============================================  ====================================

``POST /users/{user_id}/terminate_connections`` (the app found by ``auth_key``) is
accepted too, as the official Python SDK sends it there.

The two publish routes are also served by :class:`PublishFastPath`, a plain ASGI
callable that the application runs before Starlette's middleware and routing for a
``POST`` to ``/apps/<app id>/events`` or ``/batch_events``: the same checks, in the same
order, with the same answers, without a ``Request``, a ``URL`` or a response object.
Under the server's own HTTP protocol (:mod:`broadcaster._guard`) it serves them without
ASGI at all: the protocol gets it as :class:`~broadcaster.transport.NativePosts` and
takes the same steps as the request arrives, writing each answer itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from broadcaster import http_models
from broadcaster.backends.base import BackendUnavailable, PublishUnconfirmed
from broadcaster.channels import ChannelKind, channel_kind, validate_channel_name
from broadcaster.exceptions import ApiError, ProtocolError
from broadcaster.http_input import BodyReader, BodyRefused, excerpt, read_body
from broadcaster.http_models import TriggerRequest
from broadcaster.node import Node
from broadcaster.publishers import STATE_TTL, BackendStateStore, state_key
from broadcaster.sessions import SESSION_ID
from broadcaster.settings import AppConfig
from broadcaster.signing import verify_request, verify_sdk_query
from broadcaster.transport import SERVER_ERROR, Answer

__all__ = ["PublishFastPath", "api_routes"]

Handler = Callable[[Request, AppConfig, bytes], Awaitable[Any]]
PublishHandler = Callable[[AppConfig, bytes], Awaitable[dict[str, Any]]]


def api_routes(node: Node) -> list[BaseRoute]:
    """The HTTP API routes served by ``node``."""
    api = _Api(node)
    apps = "/apps/{app_id}"
    return [
        Route(f"{apps}/events", api.wrap(_with_request(api.events)), methods=["POST"]),
        Route(f"{apps}/batch_events", api.wrap(_with_request(api.batch_events)), methods=["POST"]),
        Route(f"{apps}/channels", api.wrap(api.channels), methods=["GET"]),
        Route(f"{apps}/channels/{{channel}}", api.wrap(api.channel), methods=["GET"]),
        Route(f"{apps}/channels/{{channel}}/users", api.wrap(api.users), methods=["GET"]),
        Route(f"{apps}/channels/{{channel}}/state", api.wrap(api.store_state), methods=["PUT"]),
        Route(
            f"{apps}/users/{{user_id}}/terminate_connections",
            api.wrap(api.terminate),
            methods=["POST"],
        ),
        Route("/users/{user_id}/terminate_connections", api.wrap(api.terminate), methods=["POST"]),
    ]


def _with_request(handler: PublishHandler) -> Handler:
    async def endpoint(request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        return await handler(app, body)

    return endpoint


class _Api:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.max_body = node.settings.max_request_bytes
        self.body_timeout = node.settings.body_timeout
        self.max_states = node.settings.max_session_states
        self._states: dict[str, dict[str, float]] = {}  # app id -> channel -> expiry

    def wrap(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """Authenticate, run ``handler`` and turn errors into JSON responses."""

        async def endpoint(request: Request) -> Response:
            try:
                app = self._app(request)
                body = await self._body(request)
                query = dict(request.query_params)
                verify_request(app, request.method, request.url.path, query, body, time.time())
                return JSONResponse(await handler(request, app, body))
            except ApiError as exc:
                return JSONResponse(exc.body(), exc.status)
            except BackendUnavailable as exc:
                status, error = _unavailable_error(exc)
                return JSONResponse(error, status)

        return endpoint

    def _app(self, request: Request) -> AppConfig:
        app_id = request.path_params.get("app_id")
        if app_id is None:
            key = request.query_params.get("auth_key", "")
            app = self.node.app_by_key(key)
            if app is None:
                raise ApiError(401, f"unknown auth_key {excerpt(key)}")
            return app
        app = self.node.app_by_id(app_id)
        if app is None:
            raise ApiError(404, f"no app with id {excerpt(app_id)}")
        return app

    async def _body(self, request: Request) -> bytes:
        try:
            return await read_body(request, self.max_body, self.body_timeout)
        except BodyRefused as exc:
            raise ApiError(exc.status, exc.message) from None

    async def events(self, app: AppConfig, body: bytes) -> dict[str, Any]:
        return await self.trigger(app, http_models.parse_trigger(body, app))

    async def trigger(self, app: AppConfig, trigger: TriggerRequest) -> dict[str, Any]:
        await self._publish(app, trigger)
        if not trigger.info:
            return {}
        return {"channels": await self._infos(app, trigger.channels, trigger.info)}

    async def batch_events(self, app: AppConfig, body: bytes) -> dict[str, Any]:
        return await self.batch(app, http_models.parse_batch(body, app))

    async def batch(self, app: AppConfig, batch: list[TriggerRequest]) -> dict[str, Any]:
        # Started in order at once: the backend sends them together, in order.
        await self.node.publish_batch(
            app.id, [(t.channels, t.name, t.data, t.socket_id) for t in batch]
        )
        counted = {c for t in batch if "subscription_count" in t.info for c in t.channels}
        # One read for the whole batch, of its own channels only.
        counts = await self.node.channel_counts(app.id, counted) if counted else None
        results = []
        for trigger in batch:
            if trigger.info:
                infos = await self._infos(app, trigger.channels, trigger.info, counts)
            else:
                infos = {}
            results.append(next(iter(infos.values()), {}))
        return {"batch": results}

    async def _publish(self, app: AppConfig, trigger: TriggerRequest) -> None:
        await self.node.publish(
            app.id, trigger.channels, trigger.name, trigger.data, trigger.socket_id
        )

    async def channels(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        prefix = request.query_params.get("filter_by_prefix", "")
        info = http_models.parse_info(request.query_params.get("info"))
        if "user_count" in info and not prefix.startswith("presence-"):
            raise ApiError(
                400, "info=user_count needs filter_by_prefix=presence- (presence channels only)"
            )
        counts = await self.node.channel_counts(app.id)
        names = sorted(name for name in counts if name.startswith(prefix))
        return {"channels": await self._infos(app, names, info, counts)}

    async def channel(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        name = _channel_param(request)
        info = http_models.parse_info(request.query_params.get("info"))
        if "user_count" in info and channel_kind(name) is not ChannelKind.PRESENCE:
            raise ApiError(400, f"info=user_count is only for presence channels, not {name!r}")
        counts = await self.node.channel_counts(app.id, (name,))
        result: dict[str, Any] = {"occupied": counts.get(name, 0) > 0}
        result.update((await self._infos(app, [name], info, counts))[name])
        return result

    async def users(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        name = _channel_param(request)
        if channel_kind(name) is not ChannelKind.PRESENCE:
            raise ApiError(400, f"users are only listed for presence channels, not {name!r}")
        members = await self.node.presence_members(app.id, name)
        return {"users": [{"id": member.user_id} for member in members]}

    async def store_state(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        channel = _channel_param(request)
        if not _SESSION_CHANNEL.fullmatch(channel):
            raise ApiError(
                422, f"{channel!r} is not a session channel: agent.<id> or private-agent.<id>"
            )
        version = http_models.parse_state(body).version
        backend, owner = self.node.backend, secrets.token_hex(8)
        # One PUT of a session's state at a time, on every node: the version check and
        # the store are one step.
        if not await backend.claim_value(app.id, f"state-put:{channel}", owner, 10):
            raise ApiError(409, f"a state of {channel!r} is being stored by another request")
        try:
            stored = await backend.load_value(app.id, state_key(channel))
            _check_newer(channel, version, stored)
            self._admit_state(app, channel)
            # Through the store that also indexes the run the snapshot names (its
            # summary and trace), as a run on the server would be.
            await BackendStateStore(backend, app.id, STATE_TTL).save(channel, body)
        finally:
            with contextlib.suppress(BackendUnavailable):
                await backend.release_value(app.id, f"state-put:{channel}", owner)
        return {}

    def _admit_state(self, app: AppConfig, channel: str) -> None:
        """Count ``channel``'s state among the app's live ones, unless that is one too many.

        Raises:
            ApiError: 429, the app keeps ``max_session_states`` states already.
        """
        now = time.monotonic()
        states = self._states.setdefault(app.id, {})
        if channel not in states and len(states) >= self.max_states:
            for name, expiry in list(states.items()):
                if expiry <= now:
                    del states[name]
            if len(states) >= self.max_states:
                raise ApiError(
                    429,
                    f"app {app.id!r} keeps {len(states)} session states already "
                    f"(max_session_states); each expires {STATE_TTL:.0f} s after it was stored",
                )
        states[channel] = now + STATE_TTL

    async def terminate(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        user_id = request.path_params["user_id"]
        if not user_id or len(user_id) > 128:
            raise ApiError(400, "user_id must be 1 to 128 characters")
        await self.node.terminate_user(app.id, user_id)
        return {}

    async def _infos(
        self,
        app: AppConfig,
        names: Sequence[str],
        info: frozenset[str],
        counts: dict[str, int] | None = None,
    ) -> dict[str, dict[str, int]]:
        if "subscription_count" in info and counts is None:
            counts = await self.node.channel_counts(app.id, names)
        result: dict[str, dict[str, int]] = {}
        for name in names:
            entry: dict[str, int] = {}
            if "subscription_count" in info:
                assert counts is not None
                entry["subscription_count"] = counts.get(name, 0)
            if "user_count" in info and channel_kind(name) is ChannelKind.PRESENCE:
                entry["user_count"] = len(await self.node.presence_members(app.id, name))
            result[name] = entry
        return result


_SESSION_CHANNEL = re.compile(r"(?:private-)?agent\." + SESSION_ID.pattern.strip("^$"))


def _channel_param(request: Request) -> str:
    try:
        return validate_channel_name(request.path_params["channel"])
    except ProtocolError as exc:
        raise ApiError(400, exc.message) from None


# -- the publish fast path ----------------------------------------------------------------

# Only paths whose app id can be an app's (AppConfig.id): for them the path Starlette's
# request.url.path gives (and the client signed) is the scope's path as is. Any other
# path goes through Starlette, as before.
_PUBLISH_PATH = re.compile(r"/apps/([A-Za-z0-9_.\-]+)/(events|batch_events)")
_JSON = [(b"content-type", b"application/json")]
_EMPTY = b"{}"
_OK_EMPTY = Answer(200, _EMPTY)  # built once: a NamedTuple's __new__ is a Python call
_EVENTS = "events"


class PublishFastPath:
    """``POST /apps/{app_id}/events`` and ``/batch_events`` without Starlette.

    The same steps as the Starlette routes (:meth:`_Api.wrap`), in the same order and
    with byte-identical answers: the app (404), the body under ``max_request_bytes``
    (413) and ``body_timeout`` (408), the signature (401/403), then validation (400/413)
    and publication (503 when the backend is unreachable).

    Served two ways: as a plain ASGI callable (:meth:`serve`, which the application runs
    before Starlette), and as :class:`~broadcaster.transport.NativePosts`, through which
    the HTTP protocol (:mod:`broadcaster._guard`) serves these requests without ASGI.
    Both take the steps of :meth:`answer`. A publication without ``info`` waits for the
    backend with a callback (a Redis publish is a future), not a task.
    """

    def __init__(self, node: Node) -> None:
        self._api = _Api(node)
        self._body = BodyReader(self._api.max_body, self._api.body_timeout)
        self._batch_answers: dict[int, Answer] = {}

    @property
    def body_timeout(self) -> float:
        """Seconds a request body may take to arrive (``body_timeout``)."""
        return self._api.body_timeout

    def match(self, scope: Scope) -> tuple[str, str] | None:
        """The app id and route (``"events"`` or ``"batch_events"``) of an HTTP
        ``scope`` served here, else None."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        found = _PUBLISH_PATH.fullmatch(scope["path"])
        if found is None:
            return None
        return found.group(1), found.group(2)

    def route(self, path: str) -> _Post | None:
        """The ``POST`` to ``path`` if served here (see
        :class:`~broadcaster.transport.NativePosts`)."""
        found = _PUBLISH_PATH.fullmatch(path)
        if found is None:
            return None
        return _Post(self, found.group(1), found.group(2), path)

    def too_slow(self) -> Answer:
        """The 408 answer to a body that did not arrive within ``body_timeout``."""
        refused = self._body.too_slow()
        return _refused(ApiError(refused.status, refused.message))

    def app(self, app_id: str) -> AppConfig:
        """The app named in the path.

        Raises:
            ApiError: 404, no such app.
        """
        app = self._api.node.app_by_id(app_id)
        if app is None:
            raise ApiError(404, f"no app with id {excerpt(app_id)}")
        return app

    def check_length(self, declared: str) -> None:
        """Refuse a declared body over ``max_request_bytes`` before reading it.

        Raises:
            ApiError: 413.
        """
        try:
            self._body.check_length(declared)
        except BodyRefused as exc:
            raise ApiError(exc.status, exc.message) from None

    def answer(
        self, app: AppConfig, route: str, path: str, query: bytes, body: bytes
    ) -> Answer | _Publishing:
        """The answer to a whole request, or the publication it waits for: the
        signature (401/403), validation (400/413), then publication (503)."""
        try:
            now = time.time()
            if not verify_sdk_query(app, "POST", path, query, body, now):
                verify_request(app, "POST", path, _query(query), body, now)
            if route == _EVENTS:
                return self._events(app, body)
            return self._batch(app, body)
        except ApiError as exc:
            return _refused(exc)
        except BackendUnavailable as exc:
            return _unavailable(exc)

    def _events(self, app: AppConfig, body: bytes) -> _Publishing:
        trigger = http_models.parse_trigger(body, app)
        if trigger.info:  # asks for channel counts: more round trips, in a task
            return _Publishing(asyncio.ensure_future(self._api.trigger(app, trigger)))
        event = (trigger.channels, trigger.name, trigger.data, trigger.socket_id)
        return _Publishing(self._api.node.start_publish_batch(app.id, [event]), _OK_EMPTY)

    def _batch(self, app: AppConfig, body: bytes) -> _Publishing:
        batch = http_models.parse_batch(body, app)
        if any(trigger.info for trigger in batch):
            return _Publishing(asyncio.ensure_future(self._api.batch(app, batch)))
        events = [(t.channels, t.name, t.data, t.socket_id) for t in batch]
        done = self._api.node.start_publish_batch(app.id, events)
        return _Publishing(done, self._batch_answer(len(batch)))

    def _batch_answer(self, size: int) -> Answer:
        known = self._batch_answers.get(size)
        if known is None:
            known = self._batch_answers[size] = Answer(200, _dumps({"batch": [{}] * size}))
        return known

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, app_id: str, route: str
    ) -> None:
        """Answer one request that :meth:`match` accepted, as an ASGI application."""
        started = False

        async def respond(answer: Answer) -> None:
            nonlocal started
            started = True
            headers = [(b"content-length", str(len(answer.body)).encode()), *_JSON]
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body})

        try:
            try:
                app = self.app(app_id)
                try:
                    body = await self._body.read(scope["headers"], receive)
                except BodyRefused as exc:
                    raise ApiError(exc.status, exc.message) from None
            except ApiError as exc:
                await respond(_refused(exc))
                return
            except ClientDisconnect:
                return  # gone before the end of its body: nobody to answer
            outcome = self.answer(app, route, scope["path"], scope["query_string"], body)
            if isinstance(outcome, _Publishing):
                with contextlib.suppress(Exception):  # the answer says how it ended
                    await outcome.done
                outcome = outcome.answer()
            await respond(outcome)
        except Exception:
            # As Starlette's ServerErrorMiddleware: a plain 500, and uvicorn logs the error.
            if not started:
                body = SERVER_ERROR.body
                headers = [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", SERVER_ERROR.content_type),
                ]
                await send({"type": "http.response.start", "status": 500, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            raise


class _Post:
    """One ``POST`` to a publish route, as the HTTP protocol serves it natively
    (:class:`~broadcaster.transport.NativePost`)."""

    __slots__ = ("_app", "_app_id", "_fast", "_path", "_route")

    def __init__(self, fast: PublishFastPath, app_id: str, route: str, path: str) -> None:
        self._fast = fast
        self._app_id = app_id
        self._route = route
        self._path = path
        self._app: AppConfig | None = None

    @property
    def body_timeout(self) -> float:
        return self._fast.body_timeout

    def refusal(self, content_length: str) -> Answer | None:
        try:
            self._app = self._fast.app(self._app_id)
            self._fast.check_length(content_length)
        except ApiError as exc:
            return _refused(exc)
        return None

    def too_slow(self) -> Answer:
        return self._fast.too_slow()

    def answer(self, query: bytes, body: bytes) -> Answer | _Publishing:
        assert self._app is not None, "refusal() first"
        return self._fast.answer(self._app, self._route, self._path, query, body)


class _Publishing:
    """A publication handed to the backend, and the answer once it is done
    (:class:`~broadcaster.transport.Pending`): ``ok`` for success, or the JSON of the
    future's result."""

    __slots__ = ("_ok", "done")

    def __init__(self, done: asyncio.Future[Any], ok: Answer | None = None) -> None:
        self.done = done
        self._ok = ok

    def answer(self) -> Answer:
        try:
            result = self.done.result()
        except ApiError as exc:
            return _refused(exc)
        except BackendUnavailable as exc:
            return _unavailable(exc)
        if self._ok is not None:
            return self._ok
        return Answer(200, _dumps(result)) if result else _OK_EMPTY


def _refused(exc: ApiError) -> Answer:
    return Answer(exc.status, _dumps(exc.body()))


def _unavailable(exc: BackendUnavailable) -> Answer:
    status, error = _unavailable_error(exc)
    return Answer(status, _dumps(error))


def _check_newer(channel: str, version: datetime, stored: bytes | None) -> None:
    """Refuse a state that is not newer than the one stored (its ``execution.
    updated_at``): a replayed or late PUT (a signed request is valid for 600 s) never
    moves a session's state back.

    Raises:
        ApiError: 409 saying both versions.
    """
    if stored is None:
        return
    try:
        execution = json.loads(stored).get("execution")
    except (ValueError, AttributeError):
        return  # not a snapshot: anything replaces it
    updated = execution.get("updated_at") if isinstance(execution, dict) else None
    older = http_models.state_version(updated)
    if older is not None and version <= older:
        raise ApiError(
            409,
            f"the state of {channel!r} stored already is as new or newer (execution."
            f"updated_at {older.isoformat()}, this one {version.isoformat()}): a state is "
            "replaced only by a newer one, so a replayed PUT never moves it back",
        )


def _unavailable_error(exc: BackendUnavailable) -> tuple[int, dict[str, object]]:
    """503 when nothing was published (retry at will); 504 when a publication was sent
    and not confirmed: it may have gone out, and a retry may deliver it twice."""
    if isinstance(exc, PublishUnconfirmed):
        message = f"the publication is unconfirmed: {exc}; a retry may deliver it twice"
        return 504, {"error": message, "status": 504}
    return 503, {"error": f"the backend is unavailable: {exc}; retry later", "status": 503}


def _query(raw: bytes) -> dict[str, str]:
    """``dict(request.query_params)``: the last value of each name."""
    text = raw.decode("latin-1")
    if "%" in text or "+" in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    query: dict[str, str] = {}
    for part in text.split("&"):
        if part:
            name, _, value = part.partition("=")
            query[name] = value
    return query


def _dumps(content: Any) -> bytes:
    # As starlette.responses.JSONResponse.render.
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")
