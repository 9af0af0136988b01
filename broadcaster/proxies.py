"""Trusted reverse proxies: who the client is behind them.

Behind a proxy every connection comes from the proxy's address, so per-address limits,
logs and metrics would all see the proxy. A proxy names the client it serves in
``X-Forwarded-For`` (a list each proxy appends its peer to) or ``Forwarded``
(RFC 7239, its ``for=`` parameters). Anyone can send those headers, so they count only
on a connection from a trusted proxy (``trusted_proxies``: addresses or CIDR networks),
and only as far as trusted proxies wrote them: the client is the rightmost hop that is
not a trusted proxy (everything left of it could have been made up by that client).

``X-Forwarded-For`` is read when present, else ``Forwarded``: a proxy must set (append
to) the header it uses and drop the other one (``deploy/nginx.conf`` does). An entry that
is not an address (``unknown``, an obfuscated ``_name``) ends the walk at the last
trusted hop: those clients then share that proxy's address, which only limits them
more.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

__all__ = ["IPNetwork", "TrustedProxies", "parse_networks"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``values`` (addresses or CIDR networks, also comma-separated) as networks.

    Raises:
        ValueError: naming a value that is neither.
    """
    networks = []
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8, ::1)"
                ) from None
    return tuple(networks)


class TrustedProxies:
    """The proxies whose forwarding headers are believed (none: headers are ignored)."""

    __slots__ = ("_networks",)

    def __init__(self, networks: Iterable[str] = ()) -> None:
        self._networks = parse_networks(networks)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusts(self, host: str) -> bool:
        """Whether ``host`` (an address; an IPv4-mapped IPv6 one as its IPv4) is trusted."""
        address = _address(host)
        return address is not None and any(address in network for network in self._networks)

    def client(self, peer: str, headers: Sequence[tuple[bytes, bytes]]) -> str:
        """The client of a request that came from ``peer`` with ``headers`` (lower-case
        names, as the server parsed them): ``peer`` itself unless it is trusted, else
        the rightmost hop of the forwarding header that is not a trusted proxy."""
        if not self.trusts(peer):
            return peer
        hops = _forwarded_for(headers)
        client = peer
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return client  # not an address: stop at the last trusted hop
            client = str(address)
            if not self.trusts(client):
                return client
        return client


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _forwarded_for(headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """The hops named by ``X-Forwarded-For`` (when present), else by ``Forwarded``,
    leftmost first, each without its port."""
    xff = [value for name, value in headers if name == b"x-forwarded-for"]
    if xff:
        text = b",".join(xff).decode("latin-1")
        return [_host(hop) for hop in text.split(",") if hop.strip()]
    forwarded = [value for name, value in headers if name == b"forwarded"]
    hops = []
    for element in b",".join(forwarded).decode("latin-1").split(","):
        for pair in element.split(";"):
            name, _, value = pair.partition("=")
            if name.strip().lower() == "for":
                hops.append(_host(value.strip().strip('"')))
    return hops


def _host(hop: str) -> str:
    """``hop`` without its port: ``1.2.3.4:5`` -> ``1.2.3.4``, ``[::1]:5`` -> ``::1``."""
    hop = hop.strip()
    if hop.startswith("["):
        return hop[1:].partition("]")[0]
    if hop.count(":") == 1:  # IPv4 with a port (a bare IPv6 address has several)
        return hop.partition(":")[0]
    return hop
