"""Command line: ``agent-broadcaster serve`` (same as ``python -m broadcaster serve``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
from broadcaster.settings import SettingsError, load_settings

__all__ = ["main"]


@click.group()
def main() -> None:
    """A Pusher-compatible real-time event server for AI agents."""


@main.command()
@click.option("--host", help="Interface to listen on [env BROADCASTER_HOST; 127.0.0.1].")
@click.option("--port", type=int, help="Port; 0 picks a free one [env BROADCASTER_PORT; 8080].")
@click.option(
    "--backend",
    help="memory://, redis://host:port/db, redis-cluster://host:port,host:port/ or "
    "redis-sentinel://host:port,host:port/<service>/<db> [env BROADCASTER_BACKEND, "
    "else REDIS_URL, else memory://].",
)
@click.option("--app-id", help="Pusher app id [env BROADCASTER_APP_ID].")
@click.option("--app-key", help="Pusher app key [env BROADCASTER_APP_KEY].")
@click.option("--app-secret", help="Pusher app secret [env BROADCASTER_APP_SECRET].")
@click.option(
    "--apps-file",
    type=click.Path(path_type=Path),
    help="JSON or TOML file listing several apps [env BROADCASTER_APPS_FILE].",
)
@click.option("--demo/--no-demo", default=None, help="Serve the demo dashboard and /run.")
@click.option("--extension", "extensions", multiple=True, help="Extra extension to load.")
@click.option("--activity-timeout", type=int, help="Seconds before a ping [120].")
@click.option("--log-level", help="critical|error|warning|info|debug|trace [info].")
@click.option(
    "--enable-client-messages/--no-enable-client-messages",
    default=None,
    help="Allow client-* events for the single app [off].",
)
@click.option(
    "--allowed-origins",
    help="Comma-separated origins (https://app.example.com) or host patterns "
    "(*.example.com) whose pages may connect, read the session routes (CORS) and start "
    "runs; * for any [env BROADCASTER_ALLOWED_ORIGINS; *].",
)
@click.option("--pong-timeout", type=int, help="Seconds to answer our ping before 4201 [30].")
@click.option(
    "--max-buffer-bytes", type=int, help="Unsent bytes before a slow client gets 4100 [1 MiB]."
)
@click.option("--max-request-bytes", type=int, help="Largest HTTP request body [256 KiB].")
@click.option("--body-timeout", type=float, help="Seconds to send a request body [30].")
@click.option(
    "--header-timeout", type=float, help="Seconds to send a request head or upgrade [10]."
)
@click.option(
    "--max-connections-per-ip",
    type=int,
    help="Open connections per client address; 0 for no limit [1000].",
)
@click.option(
    "--trusted-proxies",
    "--forwarded-allow-ips",
    "trusted_proxies",
    help="Comma-separated addresses or CIDR networks of reverse proxies whose "
    "X-Forwarded-For/Forwarded header names the client (for per-address limits and "
    "logs) [env BROADCASTER_TRUSTED_PROXIES; none].",
)
@click.option("--history-size", type=int, help="Publications kept per channel [1000].")
@click.option("--history-ttl", type=int, help="Seconds a channel's history is kept [600].")
@click.option("--max-history-reads", type=int, help="Concurrent resume history reads [32].")
@click.option(
    "--history-read-timeout", type=float, help="Seconds a resume's history read may take [10]."
)
@click.option(
    "--max-session-states",
    type=int,
    help="Session final states an app may store over the HTTP API, per node [10000].",
)
@click.option(
    "--run-list-rate",
    type=float,
    help="GET /api/sessions a second per client address, then 429; 0 is off [5].",
)
@click.option("--run-list-burst", type=int, help="GET /api/sessions in a row per client [20].")
@click.option(
    "--redis-read-delay",
    type=float,
    help="Latency budget: when Redis pub/sub reads come faster than this, seconds it is "
    "left unread after each, to deliver what arrives meanwhile in one pass; 0 is off "
    "[0.002].",
)
@click.option("--redis-prefix", help=f"Prefix of every Redis key [{DEFAULT_REDIS_PREFIX}].")
@click.option(
    "--redis-node-ttl",
    type=float,
    help="Seconds without a heartbeat before a node's presence and counts expire [30].",
)
@click.option(
    "--redis-wait-replicas",
    type=int,
    help="Durable mode: acknowledge a publication only once Redis WAIT confirms this many "
    "replicas keep it, else refuse it with 503 [0: off].",
)
@click.option(
    "--redis-wait-timeout",
    type=float,
    help="Seconds WAIT may wait for the replicas (--redis-wait-replicas) [1].",
)
@click.option("--shutdown-timeout", type=float, help="Seconds a graceful shutdown may take [10].")
@click.option("--metrics/--no-metrics", default=None, help="Serve /metrics [on].")
def serve(**options: Any) -> None:
    """Start the server."""
    if not options["extensions"]:
        options["extensions"] = None
    backend_from = _redis_url(options)
    try:
        settings = load_settings(**options)
    except SettingsError as exc:
        note = f"\n(the backend is REDIS_URL's: {REDIS_URL_PRECEDENCE})" if backend_from else ""
        raise click.ClickException(f"{exc}{note}") from None
    from broadcaster.server import serve as run

    run(settings, backend_from)


REDIS_URL_PRECEDENCE = "--backend, then BROADCASTER_BACKEND, then REDIS_URL, then memory://"


def _redis_url(options: dict[str, Any]) -> str | None:
    """Take ``REDIS_URL`` as the backend when neither ``--backend`` nor
    ``BROADCASTER_BACKEND`` names one, as ``agent-worker`` and the Procfile do; returns
    ``"REDIS_URL"`` when it did."""
    url = os.environ.get("REDIS_URL", "").strip()
    if options["backend"] is not None or os.environ.get("BROADCASTER_BACKEND") or not url:
        return None
    options["backend"] = url
    return "REDIS_URL"


@main.command()
@click.argument("session_id")
@click.option(
    "--url",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar="BROADCASTER_URL",
    help="The server's base URL [env BROADCASTER_URL].",
)
@click.option("--since", help="Start after this position (<epoch>:<offset>, as POST /run gives).")
@click.option("--token", envvar="BROADCASTER_SESSION_TOKEN", help="A private session's token.")
@click.option("--key", help="App key [env BROADCASTER_APP_KEY; else the demo's /api/demo/config].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line instead of a trace.")
def tail(
    session_id: str,
    url: str,
    since: str | None,
    token: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Follow a session's run live: exit 0 completed, 1 failed, 2 could not follow."""
    from broadcaster._tail import tail as follow

    sys.exit(follow(url, session_id, since=since, token=token, key=key, as_json=as_json))
