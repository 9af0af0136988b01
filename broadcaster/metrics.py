"""Prometheus metrics of one node, in a registry of its own.

Each node gets its own :class:`prometheus_client.CollectorRegistry` (never the global
one), so several apps or servers in one process, as in tests, do not collide.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The node's counters and gauges (names start with ``broadcaster_``)."""

    def __init__(self, backend_reconnects: Callable[[], float] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections = Gauge(
            "broadcaster_connections", "Open WebSocket connections.", ["app_id"], registry=r
        )
        self.subscriptions = Gauge(
            "broadcaster_subscriptions", "Channel subscriptions on this node.", registry=r
        )
        self.channels = Gauge(
            "broadcaster_channels", "Channels with a local subscriber.", registry=r
        )
        self.messages_in = Counter(
            "broadcaster_messages_in", "Messages received from clients.", registry=r
        )
        self.messages_out = Counter(
            "broadcaster_messages_out", "Channel events queued to clients (fan-out).", registry=r
        )
        self.publications = Counter(
            "broadcaster_publications", "Publications delivered to this node.", registry=r
        )
        self.http_publishes = Counter(
            "broadcaster_http_publishes", "Events accepted by the HTTP API.", registry=r
        )
        self.send_latency = Histogram(
            "broadcaster_publish_send_seconds",
            "From a publication reaching this node to its frames being written to every "
            "local subscriber's transport.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.slow_consumers = Counter(
            "broadcaster_slow_consumer_disconnects",
            "Connections closed with 4100 because their outgoing buffer was full.",
            registry=r,
        )
        reconnects = Gauge(
            "broadcaster_backend_reconnects",
            "Times the backend reconnected (e.g. to Redis) since start.",
            registry=r,
        )
        reconnects.set_function(backend_reconnects or (lambda: 0.0))
        tasks = Gauge(
            "broadcaster_asyncio_tasks", "asyncio tasks alive in the server loop.", registry=r
        )
        tasks.set_function(_task_count)

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # no running loop (scraped from another thread)
        return 0.0
