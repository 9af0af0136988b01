"""The Pusher HTTP API (what server-side SDKs call), a shell around the node.

Every request is signed (:func:`broadcaster.signing.verify_request`: key, timestamp
within 600 s, ``body_md5``, constant-time signature) and bodies are validated by
:mod:`broadcaster.http_models`. Errors are JSON ``{"error": ..., "status": ...}`` with
400 (bad request), 401 (authentication), 403 (app disabled), 404 (no such app),
408 (body too slow, ``body_timeout``), 413 (too large) or 503 (the backend is unreachable).

=====  ==============================================  ====================================
POST   ``/apps/{app_id}/events``                       publish one event on 1-100 channels
POST   ``/apps/{app_id}/batch_events``                 publish up to 10 events
GET    ``/apps/{app_id}/channels``                     occupied channels
GET    ``/apps/{app_id}/channels/{channel}``           one channel's state
GET    ``/apps/{app_id}/channels/{channel}/users``     a presence channel's users
POST   ``/apps/{app_id}/users/{user_id}/terminate_connections``  close a user's connections
=====  ==============================================  ====================================

``POST /users/{user_id}/terminate_connections`` (the app found by ``auth_key``) is
accepted too, as the official Python SDK sends it there.

The two publish routes are also served by :class:`PublishFastPath`, a plain ASGI
callable that the application runs before Starlette's middleware and routing for a
``POST`` to ``/apps/<app id>/events`` or ``/batch_events``: the same checks, in the same
order, with the same answers, without a ``Request``, a ``URL`` or a response object.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from broadcaster import http_models
from broadcaster.backends.base import BackendUnavailable
from broadcaster.channels import ChannelKind, channel_kind, validate_channel_name
from broadcaster.exceptions import ApiError, ProtocolError
from broadcaster.http_input import BodyReader, BodyRefused, excerpt, read_body
from broadcaster.http_models import TriggerRequest
from broadcaster.node import Node
from broadcaster.settings import AppConfig
from broadcaster.signing import verify_request

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
                error = {"error": f"the backend is unavailable: {exc}; retry later", "status": 503}
                return JSONResponse(error, 503)

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
        trigger = http_models.parse_trigger(body, app)
        await self._publish(app, trigger)
        if not trigger.info:
            return {}
        return {"channels": await self._infos(app, trigger.channels, trigger.info)}

    async def batch_events(self, app: AppConfig, body: bytes) -> dict[str, Any]:
        batch = http_models.parse_batch(body, app)
        # Started in order at once: the backend sends them together, in order.
        await self.node.publish_batch(
            app.id, [(t.channels, t.name, t.data, t.socket_id) for t in batch]
        )
        results = []
        for trigger in batch:
            infos = await self._infos(app, trigger.channels, trigger.info) if trigger.info else {}
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
        counts = await self.node.channel_counts(app.id)
        result: dict[str, Any] = {"occupied": counts.get(name, 0) > 0}
        result.update((await self._infos(app, [name], info, counts))[name])
        return result

    async def users(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        name = _channel_param(request)
        if channel_kind(name) is not ChannelKind.PRESENCE:
            raise ApiError(400, f"users are only listed for presence channels, not {name!r}")
        members = await self.node.presence_members(app.id, name)
        return {"users": [{"id": member.user_id} for member in members]}

    async def terminate(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        user_id = request.path_params["user_id"]
        if not user_id or len(user_id) > 128:
            raise ApiError(400, "user_id must be 1 to 128 characters")
        await self.node.terminate_user(app.id, user_id)
        return {}

    async def _infos(
        self,
        app: AppConfig,
        names: Iterable[str],
        info: frozenset[str],
        counts: dict[str, int] | None = None,
    ) -> dict[str, dict[str, int]]:
        if "subscription_count" in info and counts is None:
            counts = await self.node.channel_counts(app.id)
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


class PublishFastPath:
    """``POST /apps/{app_id}/events`` and ``/batch_events`` as a plain ASGI callable.

    The same steps as the Starlette routes (:meth:`_Api.wrap`), in the same order and
    with byte-identical answers: the app (404), the body under ``max_request_bytes``
    (413) and ``body_timeout`` (408), the signature (401/403), then validation (400/413)
    and publication (503 when the backend is unreachable).
    """

    def __init__(self, node: Node) -> None:
        self._api = _Api(node)
        self._body = BodyReader(self._api.max_body, self._api.body_timeout)
        self._handlers: dict[str, PublishHandler] = {
            "events": self._api.events,
            "batch_events": self._api.batch_events,
        }

    def match(self, scope: Scope) -> tuple[str, PublishHandler] | None:
        """The app id and handler for an HTTP ``scope`` served here, else None."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        found = _PUBLISH_PATH.fullmatch(scope["path"])
        if found is None:
            return None
        return found.group(1), self._handlers[found.group(2)]

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, app_id: str, handler: PublishHandler
    ) -> None:
        """Answer one request that :meth:`match` accepted."""
        api = self._api
        started = False

        async def respond(status: int, body: bytes) -> None:
            nonlocal started
            started = True
            headers = [(b"content-length", str(len(body)).encode()), *_JSON]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        try:
            try:
                app = api.node.app_by_id(app_id)
                if app is None:
                    raise ApiError(404, f"no app with id {excerpt(app_id)}")
                try:
                    body = await self._body.read(scope["headers"], receive)
                except BodyRefused as exc:
                    raise ApiError(exc.status, exc.message) from None
                query = _query(scope["query_string"])
                verify_request(app, "POST", scope["path"], query, body, time.time())
                result = await handler(app, body)
            except ApiError as exc:
                await respond(exc.status, _dumps(exc.body()))
                return
            except BackendUnavailable as exc:
                error = {"error": f"the backend is unavailable: {exc}; retry later", "status": 503}
                await respond(503, _dumps(error))
                return
            except ClientDisconnect:
                return  # gone before the end of its body: nobody to answer
            await respond(200, _dumps(result) if result else _EMPTY)
        except Exception:
            # As Starlette's ServerErrorMiddleware: a plain 500, and uvicorn logs the error.
            if not started:
                body = b"Internal Server Error"
                headers = [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"text/plain; charset=utf-8"),
                ]
                await send({"type": "http.response.start", "status": 500, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            raise


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
