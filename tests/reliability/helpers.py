"""Helpers of the reliability tests: signed HTTP publishing, /metrics and /proc
readings, and the figures report (printed and merged into artifacts/reliability.json)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from broadcaster.signing import signed_params
from tests.support.live import APP_ID, KEY, SECRET
from tests.support.processes import REPO

ARTIFACT = REPO / "artifacts" / "reliability.json"
WS_PATH = f"/app/{KEY}?protocol=7"


def signed_query(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    key: str = KEY,
    secret: str = SECRET,
    timestamp: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The query parameters of a correctly signed HTTP API request."""
    return signed_params(key, secret, method, path, body, timestamp=timestamp, extra=extra)


def event_body(channel: str, name: str, data: str) -> bytes:
    return json.dumps({"name": name, "channel": channel, "data": data}).encode()


async def publish(
    http: httpx.AsyncClient, base_url: str, channel: str, name: str, data: str
) -> httpx.Response:
    """POST one signed event to ``base_url``'s HTTP API (errors are the caller's)."""
    path = f"/apps/{APP_ID}/events"
    body = event_body(channel, name, data)
    return await http.post(
        f"{base_url}{path}",
        content=body,
        params=signed_query("POST", path, body),
        headers={"content-type": "application/json"},
    )


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition text -> ``{name: value}``, summed over label sets."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            name, value = match.group(1), float(match.group(3))
            values[name] = values.get(name, 0.0) + value
    return values


async def metrics(base_url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{base_url}/metrics", timeout=10)
    response.raise_for_status()
    return parse_metrics(response.text)


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def own_rss() -> int:
    return rss_bytes(os.getpid())


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


def report(section: str, **figures: Any) -> None:
    """Print the figures and merge them into artifacts/reliability.json (the README's
    Reliability figures come from there)."""
    line = ", ".join(f"{k}={v}" for k, v in figures.items())
    print(f"\n[reliability] {section}: {line}")
    ARTIFACT.parent.mkdir(exist_ok=True)
    try:
        current = json.loads(ARTIFACT.read_text())
    except (OSError, ValueError):
        current = {}
    current[section] = {**figures, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    ARTIFACT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


async def eventually(
    predicate: Callable[[], Any], what: str, within: float = 20, every: float = 0.02
) -> None:
    """Poll ``predicate`` (sync or async) until it is true; fail after ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(every)


async def status(base_url: str, path: str) -> int:
    """The status code of GET ``path``, or 0 if the server does not answer."""
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{base_url}{path}", timeout=2)).status_code
    except httpx.HTTPError:
        return 0
