"""Helpers of the reliability tests: signed HTTP publishing, /metrics and /proc
readings, the figures report (printed and merged into artifacts/reliability.json), and
the numbered stream the Redis fault tests account with (``Publisher``, ``Reader``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broadcaster.signing import signed_params
from tests.support.live import APP_ID, KEY, SECRET, Client
from tests.support.processes import REPO, ServerProcess

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


def publish_sync(base_url: str, channel: str, name: str, data: str) -> httpx.Response:
    """:func:`publish` for synchronous tests (Playwright's, click's runner)."""
    path = f"/apps/{APP_ID}/events"
    body = event_body(channel, name, data)
    return httpx.post(
        f"{base_url}{path}",
        content=body,
        params=signed_query("POST", path, body),
        headers={"content-type": "application/json"},
        timeout=10,
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


# -- a stream of numbered publications under faults (the Redis fault tests) ---------------


@dataclass
class Reader:
    """A client reading a channel in the background: the seq numbers, positions and
    arrival times (monotonic) of the ``seq`` events it got, the resume answers, and
    how its reading ended (``None`` while it reads)."""

    client: Client
    seqs: list[int] = field(default_factory=list)
    positions: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    ended: str | None = None
    task: asyncio.Task[None] | None = None

    def start(self) -> Reader:
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            while True:
                message = await self.client.recv(within=60)
                if message["event"] == "broadcaster:resume":
                    self.resumes.append(message["data"])
                elif message["event"] == "seq":
                    self.seqs.append(int(message["data"]))
                    self.positions.append(message["position"])
                    self.times.append(time.monotonic())
        except Exception as exc:  # closed by the server, or silent for a minute
            self.ended = f"{type(exc).__name__}: {exc}"

    async def stop(self) -> None:
        await self.client.close()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@dataclass
class Publisher:
    """Publishes seq 0, 1, 2, ... on ``channel``, alternating between nodes; a refused
    attempt (any answer but 200, or none) is retried with the same seq on the other
    node. ``sent_at`` is when the accepted attempt of each seq was sent (monotonic)."""

    urls: list[str]
    channel: str
    accepted: list[int] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    refused: int = 0
    unreplicated: int = 0  # refusals of the durable mode (--redis-wait-replicas)
    retried: set[int] = field(default_factory=set)

    async def run(self, until: Callable[[], bool]) -> None:
        attempt = 0
        async with httpx.AsyncClient(timeout=5) as http:
            while not until():
                seq = len(self.accepted)
                url = self.urls[attempt % len(self.urls)]
                attempt += 1
                sent = time.monotonic()
                try:
                    response = await publish(http, url, self.channel, "seq", str(seq))
                    ok = response.status_code == 200
                    if response.status_code == 503 and "not acknowledged" in response.text:
                        self.unreplicated += 1
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.accepted.append(seq)
                    self.sent_at.append(sent)
                    await asyncio.sleep(0.004)
                else:
                    self.refused += 1
                    self.retried.add(seq)
                    await asyncio.sleep(0.02)


def deduplicated(seqs: list[int], retried: set[int]) -> list[int]:
    """``seqs`` without the repeats of a retried seq (a refused attempt whose outcome
    was unknown may have been published: at-least-once for retries)."""
    out: list[int] = []
    for seq in seqs:
        if out and out[-1] == seq and seq in retried:
            continue
        out.append(seq)
    return out


def silent_gaps(
    reader: Reader, again: Reader | None, accepted: list[int], retried: set[int]
) -> list[str]:
    """What a live client missed without being told. Not resumed (``again`` None): it
    stayed connected and got every accepted publication. Closed with 4100 and resumed
    from its last position (as pusher-js does): in order up to the close; then either
    ``recovered: true`` and everything across both, or ``recovered: false`` (told: it
    reloads its state) and in order from where it reads on."""
    got = deduplicated(reader.seqs, retried)
    if again is None:
        if reader.ended is not None:
            return [f"disconnected: {reader.ended}"]
        if got != accepted:
            missing = sorted(set(accepted) - set(got))
            return [f"missing {missing[:10]}, got {len(got)}/{len(accepted)}"]
        return []
    gaps = []
    if reader.ended is None or "4100" not in reader.ended:
        gaps.append(f"resumed, but not closed with 4100: {reader.ended}")
    if got != accepted[: len(got)]:
        missing = sorted(set(accepted[: len(got)]) - set(got))
        gaps.append(f"missing {missing[:10]} before it was closed")
    if not again.resumes:
        return [*gaps, "no answer to its resume"]
    if again.resumes[0]["recovered"]:
        seen = deduplicated(reader.seqs + again.seqs, retried)
        if seen != accepted:
            missing = sorted(set(accepted) - set(seen))
            gaps.append(f"resume said recovered: true but missed {missing[:10]}")
    else:
        tail = deduplicated(again.seqs, retried)
        if not tail or tail != accepted[accepted.index(tail[0]) :]:
            gaps.append(f"after recovered: false it did not read on in order: {tail[:5]}")
    return gaps


async def subscribed(node: ServerProcess, channel: str, position: str | None = None) -> Client:
    """A client of ``node`` subscribed to ``channel`` (resuming from ``position``)."""
    client = await Client.connect(node.ws_url + WS_PATH)
    fields = {} if position is None else {"position": position}
    answer = await client.subscribe(channel, **fields)
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer
    return client


async def resume_the_closed(
    clients: Sequence[tuple[ServerProcess, Reader]], channel: str, mark: int
) -> dict[int, Reader]:
    """Wait until each client is closed or has read a publication accepted after
    ``mark``, then resume each closed one on its node from its last position, as
    pusher-js does after a 4100. Returns the resumed readers by the index of the client
    each one replaces."""

    def settled(reader: Reader) -> bool:
        return reader.ended is not None or bool(reader.seqs and reader.seqs[-1] >= mark)

    await eventually(lambda: all(settled(r) for _, r in clients), "each client to settle")
    resumed: dict[int, Reader] = {}
    for i, (node, reader) in enumerate(clients):
        if reader.ended is not None and reader.positions:
            resumed[i] = Reader(await subscribed(node, channel, reader.positions[-1])).start()
    return resumed


def alive(node: ServerProcess) -> bool:
    return node.proc is not None and node.proc.poll() is None


async def becomes(node: ServerProcess, code: int, within: float = 20) -> None:
    """Wait until the node's /ready answers ``code``."""

    async def answers() -> bool:
        return await status(node.url, "/ready") == code

    await eventually(answers, f"{node.url}/ready to answer {code}", within=within)
