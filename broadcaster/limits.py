"""Per-client limits of the HTTP endpoints: who a client is, and a token bucket each.

A client is the peer's address, or the one a trusted proxy named (``--trusted-proxies``:
the connection guard puts it in the ASGI scope); an IPv6 client counts as its /64
(:func:`client_address`). :class:`ClientBuckets` lets each client spend ``burst``
requests at once, then ``per_second``; the run starts (``agent_core.app.runs``) and the
run list (``GET /api/sessions``, :mod:`broadcaster.sessions`) count with it.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from starlette.requests import HTTPConnection

__all__ = ["ClientBuckets", "client_address"]


def client_address(request: HTTPConnection) -> str | None:
    """Who the per-client limits count: the peer's address, or the one a trusted proxy
    named. An IPv6 client counts as its /64: one host is commonly given a whole /64, so
    counting each address would multiply every limit by as many as it picks. None: the
    peer is unknown (no per-client limit applies)."""
    if request.client is None:
        return None
    host = request.client.host
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host  # not an address (a test client's name, a Unix socket): as it is
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


@dataclass
class ClientBuckets:
    """What clients may spend: ``burst`` at once, then ``per_second`` (a token bucket
    per client). Remembers at most ``max_clients`` clients: full buckets are forgotten
    first (they are the same as none), then the least recently used.

    Raises:
        ValueError: for a non-positive rate or burst.
    """

    per_second: float
    burst: int
    max_clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.per_second > 0 and self.burst >= 1 and self.max_clients >= 1):
            raise ValueError(
                "need a rate > 0, burst >= 1 and max_clients >= 1, got "
                f"{self.per_second!r} a second, {self.burst!r} and {self.max_clients!r}"
            )

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: str) -> float:
        """Spend one of ``client``'s allowance: 0.0 when it was there, else the seconds
        until one will be (nothing spent)."""
        now = self.clock()
        tokens = self._tokens(client, now)
        if tokens < 1:
            return (1 - tokens) / self.per_second
        self._buckets.pop(client, None)  # re-inserted last: least recently used first
        self._buckets[client] = (tokens - 1, now)
        if len(self._buckets) > self.max_clients:
            self._forget(now)
        return 0.0

    def refund(self, client: str) -> None:
        """Give back one taken by :meth:`take` that was not used."""
        found = self._buckets.get(client)
        if found is not None:
            self._buckets[client] = (min(found[0] + 1, float(self.burst)), found[1])

    def _tokens(self, client: str, now: float) -> float:
        found = self._buckets.get(client)
        if found is None:
            return float(self.burst)
        tokens, stamp = found
        return min(float(self.burst), tokens + (now - stamp) * self.per_second)

    def _forget(self, now: float) -> None:
        for client in [c for c in self._buckets if self._tokens(c, now) >= self.burst]:
            del self._buckets[client]
        if len(self._buckets) > self.max_clients:
            # Down to 90%, so that this scan runs at most once per max_clients/10 takes.
            for client in list(
                islice(self._buckets, len(self._buckets) - self.max_clients * 9 // 10)
            ):
                del self._buckets[client]
