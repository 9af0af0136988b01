"""The demo extension: the dashboard at ``/`` and the run API behind it.

Loaded by the server through the ``agent_broadcaster.extensions`` entry point named
``demo`` (``agent-broadcaster serve --demo``). This module is the composition root that
wires ``agent_core`` into ``broadcaster``; ``broadcaster`` never imports it.

Routes:
    ``GET /``                      the dashboard (``frontend-demo/``)
    ``GET /api/demo/config``       what the page needs: app key, private sessions, auth URL,
                                   default mode, driver, each mode's default step limit
                                   (readable from the app's allowed origins, as the
                                   session routes: :mod:`broadcaster.cors`)
    ``POST /run``                  ``{input, session_id?, trace?, pace_ms?, mode?}`` -> 202
                                   ``{session_id, execution_id, channel, state_url,
                                   position, auth?}``; subscribe with ``position`` to
                                   receive the whole run however late you subscribe.
                                   With ``wait: true`` (``wait_seconds?``, default 30):
                                   200 when the run ends, plus ``{status, stop_reason,
                                   output, error, result, metadata, waited: true}``
                                   (:mod:`agent_core.app.run_response`); not ended by
                                   then: the 202 answer plus ``waited: false`` and a
                                   ``note`` saying how to follow it
    ``POST /broadcasting/auth``    signs ``private-agent.<session>`` subscriptions for the
                                   holder of that session's token (private sessions only)

Settings come from ``AGENT_DEMO_*`` environment variables (:class:`DemoSettings`). With
``AGENT_DEMO_RUN_MODE=queue`` runs are queued in Redis for ``agent-worker`` processes
(:mod:`agent_core.app.worker`) and this web process only fans out.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl

import orjson
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agent_core.app import agui, vercel_ai
from agent_core.app._gate import GATED_METHODS, run_gate
from agent_core.app._streams import start_run
from agent_core.app.demo_routing import demo_parts
from agent_core.app.run_response import run_response, wait_or_note
from agent_core.app.runs import (
    BackendClaims,
    ClientRateLimit,
    RunManager,
    RunRequest,
    RunStarter,
    new_session_id,
    run_claim,
)
from agent_core.app.worker import RunQueue
from agent_core.builder import DEFAULT_MAX_STEPS
from agent_core.integrations._extras import missing_extra
from agent_core.orchestrators.routing.router import ROUTING_MAX_STEPS
from broadcaster._text import excerpt
from broadcaster.backends import BackendUnavailable
from broadcaster.backends.base import DEFAULT_HISTORY_META_TTL as BACKEND_META_TTL
from broadcaster.cors import READ_METHODS, cross_origin
from broadcaster.extensions import ExtensionContext, ExtensionError
from broadcaster.http_input import BodyRefused, describe_validation, read_body, validation_details
from broadcaster.node import Node
from broadcaster.publishers import BackendStateStore, InProcessPublisher, state_key
from broadcaster.sessions import (
    RUN_LIVENESS,
    SESSION_ID,
    TRACE_FORMATS,
    FormatUnavailable,
    private_channel,
    public_channel,
    session_token,
    token_grants,
)
from broadcaster.settings import AppConfig
from broadcaster.signing import InvalidSocketId, channel_auth, check_socket_id

__all__ = ["FRONTEND_DIR", "DemoSettings", "install", "private_channel", "session_token"]

FRONTEND_DIR = Path(__file__).resolve().parents[2] / "frontend-demo"
AUTH_PATH = "/broadcasting/auth"


class DemoSettings(BaseSettings):
    """Settings of the demo extension (``AGENT_DEMO_<FIELD>``)."""

    model_config = SettingsConfigDict(env_prefix="AGENT_DEMO_", extra="forbid")

    private_sessions: bool = Field(
        default=False,
        description="runs publish on private-agent.<session>, authorised per session",
    )
    driver: Literal["scripted", "openai"] = "scripted"
    state_ttl: float = Field(default=86_400.0, gt=0)
    agui_path: str = Field(default=agui.AGUI_PATH, pattern=r"^/[A-Za-z0-9_\-./]*$")
    vercel_ai_path: str = Field(
        default=vercel_ai.VERCEL_AI_PATH,
        pattern=r"^/[A-Za-z0-9_\-./]*$",
        description="the Vercel AI SDK UI message stream (useChat's api)",
    )
    run_mode: Literal["local", "queue"] = Field(
        default="local",
        description="local: runs execute in this process; queue: they are queued in "
        "Redis for agent-worker processes (needs a Redis backend: redis://, "
        "redis-sentinel:// or redis-cluster://)",
    )
    run_default_mode: Literal["agent", "route"] = Field(
        default="agent",
        description="the mode of a POST /run that names none: agent (the tool-using "
        "agent) or route (the capability router)",
    )
    max_runs: int = Field(
        default=1000, ge=1, description="runs at once on this node (local mode); more: 503"
    )
    max_run_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="seconds a run may last (local mode); one that reaches it is stopped "
        "and ends failed, which frees its session and its run slots",
    )
    run_lease: float = Field(
        default=15.0,
        ge=0.3,
        le=3600,
        description="seconds a running session's claim lasts unless renewed (every third "
        "of it); a dead node's sessions are free again after it. Queue mode: this node "
        "looks for runs of dead workers every third of it",
    )
    client_runs: int = Field(
        default=10, ge=0, description="runs at once per client address (0: no limit); more: 429"
    )
    client_run_rate: float = Field(
        default=60.0, ge=0, description="runs a minute per client address (0: no limit)"
    )
    client_run_burst: int = Field(
        default=30, ge=1, description="runs a client address may start in a row"
    )
    queue_max: int = Field(
        default=1000, ge=1, description="runs waiting for a worker (queue mode); more: 503"
    )
    queue_timeout: float = Field(
        default=600.0,
        gt=0,
        description="seconds a queued run may wait for a worker before it ends failed",
    )


@dataclass
class _Demo:
    node: Node
    app: AppConfig
    settings: DemoSettings
    runs: RunStarter | None = None

    @property
    def channel_for_session(self) -> Callable[[str], str]:
        return private_channel if self.settings.private_sessions else public_channel

    async def _position(self, channel: str) -> str | None:
        return str(await self.node.backend.position(self.app.id, channel))

    @property
    def claim_ttl(self) -> float:
        """Seconds a private session's claim lasts after its last run started: longer
        than anything the session keeps (its stored state, ``state_ttl``; its channel's
        position, a day), plus the longest a run may wait and last, so a claim never
        ends while its session's data is kept."""
        kept = max(self.settings.state_ttl, BACKEND_META_TTL, self.node.settings.history_ttl)
        waits = self.settings.queue_timeout if self.settings.run_mode == "queue" else 0.0
        return kept + waits + self.settings.max_run_seconds

    def start(self) -> RunStarter:
        self.runs = self._queue() if self.settings.run_mode == "queue" else self._local()
        return self.runs

    async def running(self, app_id: str, session_id: str) -> bool:
        """Whether a run of the session is being run now, on any node or worker: its
        run claim is held (renewed while the run goes, so a dead node's lapses within
        ``run_lease``). The run index's answer uses it (``RUN_LIVENESS``)."""
        holder = await self.node.backend.claim_holder(app_id, run_claim(session_id))
        return holder is not None

    def check(self) -> None:
        """Refuse settings that cannot work together.

        Raises:
            ExtensionError: queue mode without the Redis backend.
        """
        backend = self.node.settings.backend
        if self.settings.run_mode == "queue" and not backend.startswith(("redis", "rediss")):
            raise ExtensionError(
                "AGENT_DEMO_RUN_MODE=queue needs the Redis backend (--backend redis://...): "
                f"workers reach the web nodes through Redis, not {backend!r}"
            )

    def _queue(self) -> RunQueue:
        from broadcaster.backends.clients import redis_client

        settings, demo = self.node.settings, self.settings
        queue = RunQueue(
            redis_client(settings.backend),
            self.app.id,
            self._position,
            prefix=settings.redis_prefix,
            channel_for_session=self.channel_for_session,
            default_mode=self.settings.run_default_mode,
            queue_max=demo.queue_max,
            queue_timeout=demo.queue_timeout,
            lease=demo.run_lease,
            client_runs=demo.client_runs,
            client_rate=self._client_rate(),
            state_ttl=demo.state_ttl,
        )
        queue.start_reaping()
        return queue

    def _client_rate(self) -> ClientRateLimit | None:
        rate = self.settings.client_run_rate
        return ClientRateLimit(rate, self.settings.client_run_burst) if rate else None

    def _local(self) -> RunManager:
        backend, app_id = self.node.backend, self.app.id

        async def load(channel: str) -> bytes | None:
            return await backend.load_value(app_id, state_key(channel))

        parts = demo_parts(self.settings.driver)
        return RunManager(
            publisher=InProcessPublisher(self.node, app_id),
            state_store=BackendStateStore(backend, app_id, self.settings.state_ttl),
            driver_factory=parts.driver_factory,
            tools=parts.tools,
            router_factory=parts.router_factory,
            default_mode=self.settings.run_default_mode,
            load_snapshot=load,
            position_of=self._position,
            channel_for_session=self.channel_for_session,
            max_runs=self.settings.max_runs,
            max_duration=self.settings.max_run_seconds,
            max_duration_name="AGENT_DEMO_MAX_RUN_SECONDS",
            claims=BackendClaims(backend, app_id),
            lease=self.settings.run_lease,
            client_runs=self.settings.client_runs,
            client_rate=self._client_rate(),
        )


def install(ctx: ExtensionContext) -> None:
    """Add the dashboard and the run API to the server.

    Raises:
        RuntimeError: the dashboard files are missing or there is no node.
        ExtensionError: the demo settings cannot work with the server's settings.
    """
    if not (FRONTEND_DIR / "index.html").is_file():
        raise RuntimeError(f"demo dashboard not found: {FRONTEND_DIR / 'index.html'} is missing")
    if ctx.node is None:
        raise RuntimeError("the demo extension needs the server's node")
    demo = _Demo(ctx.node, ctx.node.apps[0], DemoSettings())
    demo.check()

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        manager = demo.start()
        try:
            yield
        finally:
            await manager.aclose()

    ctx.lifespans.append(lifespan)
    static = StaticFiles(directory=FRONTEND_DIR, html=True)

    def app_of(request: Request) -> AppConfig:
        return demo.app

    ctx.routes += [
        Route("/", static, name="dashboard"),
        Route("/api/demo/config", cross_origin(_config(demo), app_of), methods=READ_METHODS),
        Route("/run", run_gate(demo, _run(demo)), methods=GATED_METHODS),
        Route(AUTH_PATH, cross_origin(_auth(demo), app_of, ["POST"]), methods=["POST", "OPTIONS"]),
        Mount("/demo", static, name="demo-assets"),
    ]
    ctx.routes += agui.routes(demo)
    ctx.routes += vercel_ai.routes(demo)
    ctx.state["demo"] = demo
    ctx.state[RUN_LIVENESS] = demo.running  # runs listed as running that nothing runs
    _register_otlp(ctx)


def _register_otlp(ctx: ExtensionContext) -> None:
    """Serve ``GET /api/sessions/{id}/trace?format=otlp`` through the OpenTelemetry
    mapping. Its packages are an extra (``agent-broadcaster[otel]``): they are imported
    on first use, and without them the route answers 501 naming the extra."""
    ctx.state.setdefault(TRACE_FORMATS, {})["otlp"] = _otlp


def _otlp(envelopes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    try:
        from agent_core.integrations.otel import otlp_json  # imported on first use

        return otlp_json(envelopes)
    except ModuleNotFoundError as exc:  # [otel] missing, or only part of it installed
        raise FormatUnavailable(str(missing_extra(exc, "otel", "format=otlp"))) from None


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _config(demo: _Demo) -> Any:
    async def config(request: Request) -> Response:
        return JSONResponse(
            {
                "app_key": demo.app.key,
                "private_sessions": demo.settings.private_sessions,
                "auth_endpoint": AUTH_PATH,
                "run_default_mode": demo.settings.run_default_mode,
                "driver": demo.settings.driver,
                "default_max_steps": {"agent": DEFAULT_MAX_STEPS, "route": ROUTING_MAX_STEPS},
            }
        )

    return config


def _run(demo: _Demo) -> Any:
    async def run(request: Request) -> Response:
        try:
            body = orjson.loads(await _body(demo.node, request))
        except BodyRefused as exc:
            return _error(exc.status, exc.message)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the body must be JSON: {exc}")
        try:
            run_request = RunRequest.model_validate(body)
        except ValidationError as exc:
            message = describe_validation(exc, "run request")
            return _error(422, message, details=validation_details(exc))
        began = time.monotonic()
        session_id = run_request.session_id or new_session_id()
        wanted = run_request.model_copy(update={"session_id": session_id})
        started = await start_run(demo, request, session_id, wanted, "session")
        if isinstance(started, Response):
            return started
        handle = started.handle
        assert demo.runs is not None, "the lifespan starts the run manager"
        answer: dict[str, Any] = {
            "session_id": handle.session_id,
            "execution_id": handle.execution_id,
            "channel": handle.channel,
            "state_url": demo.runs.state_url(handle.session_id),
            "position": handle.position,
        }
        if started.token is not None:
            answer["auth"] = {"endpoint": AUTH_PATH, "token": started.token}
        if not run_request.wait:
            return JSONResponse(answer, status_code=202)
        timeout = run_request.wait_seconds
        status, note = await wait_or_note(demo.node, demo.app, handle, timeout)
        if status is None:
            return JSONResponse({**answer, **(note or {})}, status_code=202)
        mode = run_request.mode or demo.settings.run_default_mode
        ended = await run_response(demo.node, demo.app, handle, mode, status, began)
        return JSONResponse({**answer, **ended, "waited": True}, status_code=200)

    return run


def _auth(demo: _Demo) -> Any:
    """``POST /broadcasting/auth``: the channel signature of ``private-agent.<session>``
    for the holder of that session's token, for a real socket id only (``<digits>.
    <digits>``): the app secret also signs the HTTP API, so signing caller-chosen text
    would hand out signatures of requests nobody authorized."""

    async def auth(request: Request) -> Response:
        try:
            fields = await _fields(demo.node, request)
        except BodyRefused as exc:
            return _error(exc.status, exc.message)
        socket_id = fields.get("socket_id", "")
        channel = fields.get("channel_name", "")
        token = fields.get("session_token", "")
        if not socket_id or not channel:
            return _error(400, "socket_id and channel_name are required")
        try:
            check_socket_id(socket_id)
        except InvalidSocketId as exc:
            return _error(400, str(exc))
        session_id = channel.removeprefix("private-agent.")
        if not channel.startswith("private-agent.") or not SESSION_ID.fullmatch(session_id):
            return _error(403, f"{excerpt(channel)} is not a private agent session channel")
        try:
            granted = await token_grants(demo.node, demo.app, token, session_id)
        except BackendUnavailable as exc:
            return _error(503, f"cannot check the session token now: {exc}")
        if not granted:
            return _error(403, f"the session token does not grant {channel!r}")
        return JSONResponse(
            {"auth": channel_auth(demo.app.key, demo.app.secret, socket_id, channel)}
        )

    return auth


async def _body(node: Node, request: Request) -> bytes:
    """The request body, under the server's ``max_request_bytes`` and ``body_timeout``.

    Raises:
        BodyRefused: 413 too large, 408 too slow.
    """
    settings = node.settings
    return await read_body(request, settings.max_request_bytes, settings.body_timeout)


async def _fields(node: Node, request: Request) -> dict[str, str]:
    """URL-encoded form fields (pusher-js's default) or a JSON object.

    Raises:
        BodyRefused: see :func:`_body`.
    """
    body = await _body(node, request)
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return {}
        if not isinstance(data, dict):
            return {}
        # Strings only, as a form sends them: str() of a value nested 1,000 deep raised
        # RecursionError (a 500); another type is a missing field.
        return {k: v for k, v in data.items() if isinstance(v, str)}
    return dict(parse_qsl(body.decode("utf-8", "replace")))
