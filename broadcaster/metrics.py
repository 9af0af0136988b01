"""Prometheus metrics of one node, in a registry of its own.

Each node gets its own :class:`prometheus_client.CollectorRegistry` (never the global
one), so several apps or servers in one process, as in tests, do not collide.

What is counted per message (messages in and out, publications, HTTP publishes, the send
latency) is kept in plain numbers on :class:`Metrics` and read by a collector when
``/metrics`` is scraped: a ``prometheus_client`` counter takes a lock on every increment,
which showed in the fan-out profile.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "LatencyHistogram", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LatencyHistogram:
    """A histogram in plain numbers (one event loop updates it; no lock).

    Attributes:
        bounds: upper bounds of the buckets, in seconds, rising.
        counts: observations per bucket (not cumulative); the last is ``+Inf``.
        total: sum of the observed values.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = _LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Count ``times`` values of ``seconds`` (in the first bucket whose bound is at
        least ``seconds``)."""
        self.counts[bisect_left(self.bounds, seconds)] += times
        self.total += seconds * times

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs in the exposition's order."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            pairs.append((bound, float(running)))
        return pairs


class Metrics:
    """The node's counters and gauges (names start with ``broadcaster_``).

    Attributes:
        messages_in: messages received from clients.
        messages_out: channel events queued to clients (fan-out).
        publications: publications delivered to this node.
        http_publishes: events accepted by the HTTP API (one per channel).
        send_latency: seconds from a publication reaching this node to its frames
            being written to every local subscriber's transport. The publications of
            one event-loop tick are counted from the tick's first one (they are written
            together), so each value is at most that tick's delivery time.
    """

    def __init__(self, backend_reconnects: Callable[[], float] | None = None) -> None:
        self.messages_in = 0
        self.messages_out = 0
        self.publications = 0
        self.http_publishes = 0
        self.send_latency = LatencyHistogram()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(_HotPathCollector(self))
        self.connections = Gauge(
            "broadcaster_connections", "Open WebSocket connections.", ["app_id"], registry=r
        )
        self.subscriptions = Gauge(
            "broadcaster_subscriptions", "Channel subscriptions on this node.", registry=r
        )
        self.channels = Gauge(
            "broadcaster_channels", "Channels with a local subscriber.", registry=r
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


class _HotPathCollector(Collector):
    """Exports the plain-number metrics of :class:`Metrics` when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        yield CounterMetricFamily(
            "broadcaster_messages_in", "Messages received from clients.", value=m.messages_in
        )
        yield CounterMetricFamily(
            "broadcaster_messages_out",
            "Channel events queued to clients (fan-out).",
            value=m.messages_out,
        )
        yield CounterMetricFamily(
            "broadcaster_publications",
            "Publications delivered to this node.",
            value=m.publications,
        )
        yield CounterMetricFamily(
            "broadcaster_http_publishes",
            "Events accepted by the HTTP API.",
            value=m.http_publishes,
        )
        yield HistogramMetricFamily(
            "broadcaster_publish_send_seconds",
            "From a publication reaching this node to its frames being written to every "
            "local subscriber's transport.",
            buckets=m.send_latency.buckets(),
            sum_value=m.send_latency.total,
        )


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # no running loop (scraped from another thread)
        return 0.0
