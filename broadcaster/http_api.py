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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from broadcaster import http_models
from broadcaster.backends.base import BackendUnavailable
from broadcaster.channels import ChannelKind, channel_kind, validate_channel_name
from broadcaster.exceptions import ApiError, ProtocolError
from broadcaster.http_input import BodyRefused, excerpt, read_body
from broadcaster.http_models import TriggerRequest
from broadcaster.node import Node
from broadcaster.settings import AppConfig
from broadcaster.signing import verify_request

__all__ = ["api_routes"]

Handler = Callable[[Request, AppConfig, bytes], Awaitable[Any]]


def api_routes(node: Node) -> list[BaseRoute]:
    """The HTTP API routes served by ``node``."""
    api = _Api(node)
    apps = "/apps/{app_id}"
    return [
        Route(f"{apps}/events", api.wrap(api.events), methods=["POST"]),
        Route(f"{apps}/batch_events", api.wrap(api.batch_events), methods=["POST"]),
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

    async def events(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        trigger = http_models.parse_trigger(body, app)
        await self._publish(app, trigger)
        if not trigger.info:
            return {}
        return {"channels": await self._infos(app, trigger.channels, trigger.info)}

    async def batch_events(self, request: Request, app: AppConfig, body: bytes) -> dict[str, Any]:
        batch = http_models.parse_batch(body, app)
        # Started in order within one tick: the backend sends them together, in order.
        await asyncio.gather(*(self._publish(app, trigger) for trigger in batch))
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
