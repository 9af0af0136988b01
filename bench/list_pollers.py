"""``/up`` while anonymous clients poll the run list (issue 44): one run, three phases.

``scripts/bench --list-pollers [--runs 10000] [--pollers 16] [--seconds 8]`` fills the
run index of a private Redis with ``--runs`` finished runs (one in twenty private),
then, against a server process on that Redis, measures ``GET /up`` (one request every
10 ms, its wall time as a client sees it) in three phases of ``--seconds`` each, in the
same run (same machine load):

- ``alone``: nobody else;
- ``pollers``: ``--pollers`` clients of one address (another process) loop on
  ``GET /api/sessions?q=zz-no-match`` (a filter that matches nothing: the most
  expensive page), the server's defaults (the scan budget and the per-client rate,
  ``run_list_rate``);
- ``pollers, no rate limit``: the same with ``--run-list-rate 0``: the scan budget
  alone (each page reads at most 1,000 index entries).

Before issue 44 a page read up to the whole index (10,000 entries, 50-60 ms of event
loop) with no per-client limit, and 16 such pollers pushed ``/up`` to 1.5 s.

Target: ``/up`` p95 under 50 ms with the pollers and the server's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from bench._proc import Child, cpu_seconds
from bench._redis import PrivateRedis
from bench.run_index import fill
from bench.servers import APP, SERVERS, RunningServer, start_server
from broadcaster.node import Node
from broadcaster.settings import load_settings

__all__ = ["main", "measure"]

TARGET_P95_MS = 50.0
PHASES = {
    "alone": (0, {}),
    "with pollers": (None, {}),
    "with pollers, no rate limit": (None, {"BROADCASTER_RUN_LIST_RATE": "0"}),
}
"""Phase -> (pollers: 0 or None for ``--pollers``, the server's extra environment)."""


async def _fill(redis_url: str, runs: int) -> float:
    settings = load_settings(
        port=0, log_level="warning", backend=redis_url, app_id=APP["id"], app_key=APP["key"]
    )
    node = Node(settings)
    async with node.running():
        return await fill(node, APP["id"], runs)


async def _up_latencies(url: str, seconds: float) -> list[float]:
    """Milliseconds of ``GET /up``, one request every 10 ms for ``seconds``."""
    times: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await http.get("/up")  # the connection is open before timing starts
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.perf_counter()
            answer = await http.get("/up")
            times.append((time.perf_counter() - began) * 1000)
            assert answer.status_code == 200, answer.text
            await asyncio.sleep(0.01)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median": round(statistics.median(ordered), 2),
        "p95": round(ordered[max(0, int(len(ordered) * 0.95) - 1)], 2),
        "max": round(ordered[-1], 2),
    }


async def _phase(
    redis_url: str, pollers: int, env: dict[str, str], seconds: float
) -> dict[str, Any]:
    server: RunningServer = await start_server(SERVERS["broadcaster"], redis_url, env=env)
    polling: Child | None = None
    try:
        if pollers:
            argv = [sys.executable, "-m", "bench.list_pollers", "--poll", server.url]
            polling = await Child("pollers", [*argv, "--pollers", str(pollers)]).start()
            await polling.expect("polling", 20)
        cpu = cpu_seconds(server.pid)
        times = await _up_latencies(server.url, seconds)
        used = cpu_seconds(server.pid) - cpu
        result: dict[str, Any] = {
            "up_ms": _summary(times),
            "samples": len(times),
            "server_cpu_share": round(used / seconds, 2),
        }
        if polling is not None:
            polling.send({"type": "stop"})
            counts = await polling.expect("counts", 30)
            answers = counts["answers"]
            result["list_answers_per_s"] = {
                status: round(n / counts["seconds"], 1) for status, n in answers.items()
            }
            # What one answer costs the server (its whole CPU over the answers given).
            per_answer = used * 1000 / max(1, sum(answers.values()))
            result["server_cpu_ms_per_answer"] = round(per_answer, 2)
        return result
    finally:
        if polling is not None:
            await polling.stop()
        await server.child.stop()


async def measure(runs: int, pollers: int, seconds: float) -> dict[str, Any]:
    """The three phases (see the module's docstring) on one private Redis."""
    redis = await PrivateRedis().start()
    try:
        results: dict[str, Any] = {"runs": runs, "pollers": pollers, "seconds": seconds}
        results["fill_s"] = round(await _fill(redis.url, runs), 2)
        for name, (count, env) in PHASES.items():
            results[name] = await _phase(redis.url, pollers if count is None else 0, env, seconds)
        return results
    finally:
        await redis.stop()


# -- the pollers' process -------------------------------------------------------------


async def _poll(url: str, pollers: int) -> None:
    """``pollers`` clients looping on a list page that matches nothing, until a ``stop``
    line on stdin; then one ``counts`` line (answers by status). Plain HTTP/1.1 on
    keep-alive sockets: the pollers' own CPU (an HTTP client's per request) competes
    with the server on the same machine, so they take as little as they can."""
    answers: Counter[str] = Counter()
    stop = asyncio.Event()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    request = f"GET /api/sessions?q=zz-no-match HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

    async def poller() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while not stop.is_set():
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            answers[head.split(b" ", 2)[1].decode()] += 1
        writer.close()

    tasks = [asyncio.create_task(poller()) for _ in range(pollers)]
    began = time.monotonic()
    print(json.dumps({"type": "polling"}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await asyncio.gather(*tasks)
    counts = {"answers": dict(answers), "seconds": time.monotonic() - began}
    print(json.dumps({"type": "counts", **counts}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench --list-pollers",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--runs", type=int, default=10_000, help="runs indexed [10000]")
    parser.add_argument("--pollers", type=int, default=16, help="looping list clients [16]")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per phase [8]")
    parser.add_argument("--poll", help=argparse.SUPPRESS)  # the pollers' child process
    args = parser.parse_args(argv)
    if args.poll:
        asyncio.run(_poll(args.poll, args.pollers))
        return 0
    result = asyncio.run(measure(args.runs, args.pollers, args.seconds))
    print(json.dumps(result))
    for name in PHASES:
        phase = result[name]
        up = phase["up_ms"]
        rates = phase.get("list_answers_per_s", {})
        print(
            f"{name:>28}: /up median {up['median']} ms, p95 {up['p95']} ms, max {up['max']} "
            f"ms; server CPU {phase['server_cpu_share']:.0%}"
            + (f"; list answers/s {rates}" if rates else "")
            + (f", {phase['server_cpu_ms_per_answer']} ms of CPU each" if rates else "")
        )
    p95 = result["with pollers"]["up_ms"]["p95"]
    verdict = "ok" if p95 < TARGET_P95_MS else "MISSED"
    print(
        f"/up p95 with {args.pollers} pollers: {p95} ms (target < {TARGET_P95_MS:g} ms: {verdict})"
    )
    return 0 if p95 < TARGET_P95_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
