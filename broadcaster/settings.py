"""One validated settings object for the server.

Values come, in rising priority, from defaults, an optional apps file, ``BROADCASTER_*``
environment variables and command-line options. Invalid values stop start-up with a
message that names the bad value (pydantic's validation error, see :func:`load_settings`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from broadcaster.backends.base import DEFAULT_HISTORY_SIZE, DEFAULT_REDIS_PREFIX
from broadcaster.origins import parse_origin_pattern
from broadcaster.proxies import parse_networks

__all__ = ["AppConfig", "Settings", "SettingsError", "load_settings"]


_BACKEND_SCHEMES = (
    *("memory", "redis", "rediss", "redis-cluster", "rediss-cluster"),
    *("redis-sentinel", "rediss-sentinel"),
)


class SettingsError(Exception):
    """Settings could not be loaded; the message says which value is wrong and why."""


class AppConfig(BaseModel):
    """One Pusher application: credentials and per-app limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_\-.]+$")]
    key: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_\-.]+$")]
    secret: Annotated[str, Field(min_length=1, repr=False)]
    enabled: bool = True
    enable_client_messages: bool = False
    max_connections: Annotated[int | None, Field(ge=1)] = None
    allowed_origins: tuple[str, ...] = ("*",)
    max_message_size: Annotated[int, Field(ge=128)] = 10_240
    client_event_rate_limit: Annotated[int, Field(ge=1)] = 10
    max_presence_members: Annotated[int, Field(ge=1)] = 100
    # Centrifugo's default; bounds what one connection can make a node hold.
    max_channels_per_connection: Annotated[int, Field(ge=1)] = 128
    # Subscribes a second per connection, after a burst of max_channels_per_connection
    # plus this rate: bounds the member_added/member_removed storm that one presence
    # member can make every other member hear.
    subscription_rate_limit: Annotated[int, Field(ge=1)] = 10
    # Bytes of a presence member's channel_data (user_id plus user_info).
    max_presence_member_size: Annotated[int, Field(ge=64)] = 2_048
    # HTTP API limits, Pusher's defaults: channels per event, events per batch,
    # bytes of one event's data, characters of an event name.
    max_event_channels: Annotated[int, Field(ge=1)] = 100
    max_batch_size: Annotated[int, Field(ge=1)] = 10
    max_event_data_size: Annotated[int, Field(ge=1)] = 10_240
    max_event_name_length: Annotated[int, Field(ge=1)] = 200

    @field_validator("allowed_origins")
    @classmethod
    def _origin_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if pattern != "*":
                parse_origin_pattern(pattern)  # ValueError: what is wrong with it
        return value

    @property
    def max_frame_size(self) -> int:
        """The largest WebSocket message read from a client of this app, in bytes:
        ``max_message_size`` plus as much again (at least 4 KiB). Messages up to it are
        read and answered with ``pusher:error`` 4302 when over ``max_message_size``;
        larger ones are refused from their frame header with close 1009, before their
        payload is buffered."""
        return self.max_message_size + max(self.max_message_size, 4096)


class Settings(BaseSettings):
    """Server settings. Every field is also ``BROADCASTER_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(
        env_prefix="BROADCASTER_", extra="forbid", validate_default=True
    )

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    backend: str = "memory://"
    # Numeric, because the official Pusher server SDKs (e.g. Python's) accept only that.
    app_id: Annotated[str, Field(min_length=1)] = "1"
    app_key: Annotated[str, Field(min_length=1)] = "agent-key"
    # Development defaults so the demo runs with no set-up; production sets its own.
    app_secret: Annotated[str, Field(min_length=1, repr=False)] = "agent-secret"  # noqa: S105
    apps_file: Path | None = None
    demo: bool = False
    extensions: tuple[str, ...] = ()
    activity_timeout: Annotated[int, Field(ge=1, le=3600)] = 120
    log_level: str = "info"
    # The single app's client events (apps files set this per app).
    enable_client_messages: bool = False
    # The single app's allowed origins (an apps file sets them per app): the pages whose
    # WebSocket connections are admitted, which may read the session routes (CORS) and
    # start runs. Whole origins (https://app.example.com) or host names, either with *
    # wildcards (*.example.com); "*" admits any. Comma-separated in the environment.
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = ("*",)
    # Seconds a client has to answer our inactivity ``pusher:ping`` before close 4201.
    pong_timeout: Annotated[int, Field(ge=1, le=600)] = 30
    # Slow-consumer limit: unsent bytes per connection before it is closed with 4100.
    max_buffer_bytes: Annotated[int, Field(ge=4096, le=1 << 30)] = 1 << 20
    # Largest HTTP request body, for every endpoint that reads one (413 above it).
    max_request_bytes: Annotated[int, Field(ge=1024, le=64 << 20)] = 256 << 10
    # Session final states an app may store over the HTTP API (PUT .../channels/{c}/state)
    # and keep at once, counted per node; each is kept 24 h (429 above it).
    max_session_states: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    # GET /api/sessions per client address (an IPv6 client: its /64): this many a
    # second after a burst of run_list_burst, then 429 with Retry-After. 0: no limit.
    run_list_rate: Annotated[float, Field(ge=0, le=10_000)] = 5.0
    run_list_burst: Annotated[int, Field(ge=1, le=100_000)] = 20
    # Seconds a client has to send a whole request body once its head is in (408).
    body_timeout: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # Seconds a client has to send a whole request head (a WebSocket upgrade request
    # too), from connecting or from the end of the previous response; then it is closed.
    header_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    # Open TCP connections per client address (WebSocket, SSE and plain HTTP count
    # together); above it a new connection is answered 429 and closed. 0: no limit.
    # Behind a reverse proxy every client has the proxy's address: raise it or use 0.
    max_connections_per_ip: Annotated[int, Field(ge=0)] = 1000
    # Reverse proxies (addresses or CIDR networks; comma-separated in the environment)
    # whose X-Forwarded-For or Forwarded header names the client: a connection from one
    # is counted, limited and logged as the rightmost hop that is not a trusted proxy.
    # None by default: the headers are then ignored.
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = ()
    # Channel history kept for resume: publications per channel and seconds kept.
    history_size: Annotated[int, Field(ge=1, le=100_000)] = DEFAULT_HISTORY_SIZE
    history_ttl: Annotated[int, Field(ge=1, le=7 * 86400)] = 600
    # Resumes: history reads at a time per node (others wait their turn, first come
    # first served) and seconds a read may wait and take before the client is closed
    # with 4100 (pusher-js reconnects after a back-off and resumes again).
    max_history_reads: Annotated[int, Field(ge=1, le=10_000)] = 32
    history_read_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    # The latency budget of Redis delivery: seconds the pub/sub connection is left unread
    # after each read, so that the publications arriving meanwhile are delivered in one
    # pass (less CPU per message under load, at most this much more latency). 0: off.
    redis_read_delay: Annotated[float, Field(ge=0, le=0.1)] = 0.002
    # Key prefix of everything the Redis backend stores (several deployments per Redis).
    redis_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-.:]{1,64}$")] = DEFAULT_REDIS_PREFIX
    # Seconds after its last heartbeat (every third of it) when a node counts as dead:
    # its presence members, subscription counts and connection counts stop counting.
    redis_node_ttl: Annotated[float, Field(ge=0.3, le=3600)] = 30.0
    # The durable mode: a publication is acknowledged only once Redis WAIT confirms that
    # this many replicas keep it, else refused with 503 (0: acknowledged when the
    # primary took it; Redis replicates asynchronously). Seconds WAIT may wait.
    redis_wait_replicas: Annotated[int, Field(ge=0, le=100)] = 0
    redis_wait_timeout: Annotated[float, Field(gt=0, le=60)] = 1.0
    # Seconds a graceful shutdown may take before remaining work is cancelled.
    shutdown_timeout: Annotated[float, Field(gt=0, le=300)] = 10.0
    metrics: bool = True
    # Seconds of silence after which an SSE stream gets a ": ping" comment line.
    sse_heartbeat: Annotated[float, Field(gt=0, le=300)] = 15.0

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in _BACKEND_SCHEMES:
            raise ValueError(
                f"unsupported backend URL {value[:60]!r}: use memory://, redis://host:port/db, "
                "redis-cluster://host:port,host:port/ or "
                "redis-sentinel://host:port,host:port/<service>/<db>"
            )
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: object) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError("expected addresses or CIDR networks, comma-separated")
        return tuple(str(network) for network in parse_networks(str(item) for item in items))

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError("expected origins or patterns, comma-separated")
        origins = tuple(str(item).strip() for item in items if str(item).strip())
        if not origins:
            raise ValueError("name at least one origin (https://app.example.com), or * for any")
        return origins

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if value.lower() not in levels:
            raise ValueError(f"unknown log level {value!r}: use one of {', '.join(levels)}")
        return value.lower()

    def apps(self) -> tuple[AppConfig, ...]:
        """The configured apps: those of ``apps_file`` if given, else the single app
        described by ``app_id``/``app_key``/``app_secret``."""
        if self.apps_file is not None:
            return _read_apps_file(self.apps_file)
        return (
            AppConfig(
                id=self.app_id,
                key=self.app_key,
                secret=self.app_secret,
                enable_client_messages=self.enable_client_messages,
                allowed_origins=self.allowed_origins,
            ),
        )


def _read_apps_file(path: Path) -> tuple[AppConfig, ...]:
    text = path.read_text(encoding="utf-8")
    raw: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    entries = raw.get("apps") if isinstance(raw, dict) else raw
    if not isinstance(entries, list) or not entries:
        raise SettingsError(f"{path}: expected a non-empty list of apps (or {{'apps': [...]}})")
    apps = tuple(AppConfig.model_validate(entry) for entry in entries)
    _check_unique(apps, path)
    return apps


def _check_unique(apps: tuple[AppConfig, ...], path: Path) -> None:
    for attr in ("id", "key"):
        values = [getattr(app, attr) for app in apps]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise SettingsError(f"{path}: duplicate app {attr}(s): {', '.join(dupes)}")


def load_settings(**overrides: Any) -> Settings:
    """Build and validate the settings; ``overrides`` are command-line values (``None``
    means "not given").

    Raises:
        SettingsError: with one line per bad value, naming it.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**given)
        settings.apps()
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except (OSError, ValueError) as exc:
        raise SettingsError(f"apps file: {exc}") from None
    if settings.apps_file is not None and "allowed_origins" in settings.model_fields_set:
        raise SettingsError(
            "allowed origins (--allowed-origins, BROADCASTER_ALLOWED_ORIGINS) are those of "
            f"the single app; with an apps file ({settings.apps_file}) set allowed_origins "
            "per app in it"
        )
    return settings


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        shown = "<hidden>" if "secret" in where else repr(err.get("input"))
        lines.append(f"invalid setting {where}={shown}: {err['msg']}")
    return "\n".join(lines)
