"""Allowed origins: an app's ``allowed_origins`` patterns, parsed, and the ``Origin``
header a browser sends, parsed, matched as scheme, host and port.

A pattern is ``*`` (any origin, also none), or ``[scheme://]host[:port]``:

- the scheme is ``https`` unless the pattern names another (``http://localhost:3000``);
- the host is a name or an address, or ``*.`` and a domain: any name under that domain
  (``*.partner.example`` admits ``a.partner.example`` and ``a.b.partner.example``, not
  ``partner.example``); no other wildcard;
- the port is the scheme's default (443, 80) unless the pattern names one, or ``*``
  for any (``http://localhost:*``).

An ``Origin`` is exactly ``scheme://host[:port]`` (RFC 6454); anything else (a path,
user info, ``null``) matches no pattern. Before, a pattern was matched with ``fnmatch``
against the whole Origin string and its host alone: ``*.partner.example`` admitted
``http://`` and any port, and ``https://evil.com/.partner.example``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["ANY_PORT", "OriginPattern", "origin_allowed", "parse_origin", "parse_origin_pattern"]

ANY_PORT = -1
"""The port of a pattern that admits any (``:*``)."""
_DEFAULT_PORTS = {"https": 443, "http": 80, "wss": 443, "ws": 80}
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?")


@dataclass(frozen=True, slots=True)
class OriginPattern:
    """One parsed ``allowed_origins`` entry (see the module's docstring)."""

    scheme: str
    host: str
    """A host, or with ``subdomains`` the domain whose names are admitted."""
    port: int | None
    """The port, :data:`ANY_PORT`, or None for a scheme without a default port."""
    subdomains: bool = False

    def admits(self, origin: tuple[str, str, int | None]) -> bool:
        """Whether a parsed origin (:func:`parse_origin`) matches."""
        scheme, host, port = origin
        if scheme != self.scheme or (self.port != ANY_PORT and port != self.port):
            return False
        if self.subdomains:
            return host.endswith("." + self.host)
        return host == self.host


def _host_and_port(scheme: str, netloc: str, what: str) -> tuple[str, int | None]:
    """The lower-case host and the port (default: the scheme's) of ``netloc``.

    Raises:
        ValueError: naming ``what`` is wrong.
    """
    if "@" in netloc:
        raise ValueError(f"{what} holds user info")
    parts = urlsplit(f"{scheme}://{netloc}")
    host = parts.hostname or ""
    if not host:
        raise ValueError(f"{what} has no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{what} has a port that is not 1-65535")
    return host, _DEFAULT_PORTS.get(scheme) if port is None else port


def parse_origin(origin: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of an ``Origin`` header (host lower case, port the
    scheme's default when not given).

    Raises:
        ValueError: it is not ``scheme://host[:port]`` (a path, a query, user info, no
            host, ``null``).
    """
    scheme, sep, rest = origin.partition("://")
    scheme = scheme.lower()
    if not sep or not _SCHEME.fullmatch(scheme):
        raise ValueError("an origin is scheme://host[:port]")
    if any(c in rest for c in "/?#\\") or not rest.isascii() or not rest.isprintable():
        raise ValueError("an origin is scheme://host[:port], with no path")
    host, port = _host_and_port(scheme, rest, "the origin")
    return scheme, host, port


@functools.lru_cache(maxsize=1024)  # an app's few patterns, checked on every connection
def parse_origin_pattern(pattern: str) -> OriginPattern:
    """One ``allowed_origins`` entry other than ``*``, parsed.

    Raises:
        ValueError: saying what is wrong with it.
    """
    what = f"origin pattern {pattern!r}"
    scheme, sep, rest = pattern.strip().partition("://")
    if not sep:
        scheme, rest = "https", pattern.strip()
    scheme = scheme.lower()
    if not _SCHEME.fullmatch(scheme):
        raise ValueError(f"{what}: {scheme!r} is not a scheme")
    if any(c in rest for c in "/?#@\\") or not rest.isascii() or not rest.isprintable():
        raise ValueError(f"{what}: write [scheme://]host[:port], with no path")
    any_port = rest.endswith(":*")
    if any_port:
        rest = rest[:-2]
    subdomains = rest.startswith("*.")
    if subdomains:
        rest = rest[2:]
    if "*" in rest:
        raise ValueError(f"{what}: a wildcard may only be the first label (*.example.com)")
    host, port = _host_and_port(scheme, rest, what)
    if ":" not in host:  # a name (an IPv6 address has colons)
        labels = host.rstrip(".").split(".")
        if not all(_LABEL.fullmatch(label) for label in labels):
            raise ValueError(f"{what}: {host!r} is not a host name")
    return OriginPattern(scheme, host, ANY_PORT if any_port else port, subdomains)


def origin_allowed(origin: str | None, patterns: Iterable[str]) -> bool:
    """Whether ``origin`` (an ``Origin`` header; None: none was sent) is admitted by
    ``patterns`` (an app's ``allowed_origins``): ``*`` admits any, also none; another
    pattern admits an origin of its scheme, host and port only. A pattern that does not
    parse admits nothing (the settings refuse them at start-up)."""
    listed = list(patterns)
    if "*" in listed:
        return True
    if origin is None:
        return False
    try:
        parsed = parse_origin(origin)
    except ValueError:
        return False
    for pattern in listed:
        try:
            if parse_origin_pattern(pattern).admits(parsed):
                return True
        except ValueError:
            continue
    return False
