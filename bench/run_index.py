"""The run index's list (issue 31): the first page of ``GET /api/sessions`` over 10,000
indexed runs, in server time, on the memory backend and on Redis.

``scripts/bench --run-index [--runs 10000] [--requests 300] [--backends memory,redis]``
fills the index of one app with ``--runs`` finished runs (one in ten failed, one in
twenty private, 2,500 sessions), then asks for the first page (the default 50 runs)
``--requests`` times, and for two filtered first pages (``status=failed``, and ``q``
that matches one run in a hundred). Each request goes through the server's ASGI
application (routing, parameters, the index read: one script on Redis, JSON) in this
process, without a network between client and server: the time is the server's. On
Redis the index lives in a private ``redis-server`` on a free port.

Target: the median first page within 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench._redis import PrivateRedis
from broadcaster.app import create_app
from broadcaster.node import Node
from broadcaster.run_index import RunSummary
from broadcaster.settings import load_settings

__all__ = ["fill", "main", "measure"]

TARGET_MS = 50.0


def _summary(i: int, now: float) -> tuple[str, RunSummary]:
    private = i % 20 == 7
    session = f"s{i % 2500}"
    channel = f"{'private-' if private else ''}agent.{session}"
    failed = i % 10 == 3
    started = now - 86_000 + i * 8.0
    summary = RunSummary(
        session_id=session,
        execution_id=f"exec-{i:06d}",
        started_at=started,
        ended_at=started + 3.5,
        status="failed" if failed else "completed",
        stop_reason="error" if failed else "completed",
        resolved_by="MaxSteps" if i % 7 == 0 else "NoToolCalls",
        steps=1 + i % 6,
        tool_calls=i % 4,
        tokens={"input": 400 + i % 97, "output": 120 + i % 31, "total": 520 + i % 128},
        capability="weather" if i % 5 == 0 else None,
        error="the tool timed out after 30 s" if failed else None,
        input_preview=f"Run {i}: what is the weather in city number {i % 100} tomorrow?"[:200],
        private=private,
        first_position=f"abcd1234:{1 + (i % 50) * 30}",
        last_position=f"abcd1234:{30 + (i % 50) * 30}",
    )
    return channel, summary


async def fill(node: Node, app_id: str, runs: int) -> float:
    """Index ``runs`` finished runs of ``app_id`` (see the module's docstring); seconds."""
    index = node.backend.runs
    now = time.time()
    began = time.perf_counter()
    batch: list[Any] = []
    for i in range(runs):
        channel, summary = _summary(i, now)
        put = index.put_run(
            app_id,
            channel,
            summary.execution_id,
            int(summary.started_at * 1000),
            summary.to_json(),
            86_400.0,
        )
        batch.append(put)
        if len(batch) == 200:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)
    return time.perf_counter() - began


async def measure(backend: str, runs: int, requests: int) -> dict[str, Any]:
    """Fill an index on ``backend`` (``memory`` or a Redis URL) and time list requests."""
    settings = load_settings(port=0, log_level="warning", backend=backend)
    node = Node(settings)
    app = create_app(settings, node)
    async with node.running():
        app_id = node.apps[0].id
        fill_s = await fill(node, app_id, runs)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            results: dict[str, Any] = {"backend": backend.split(":")[0], "runs": runs}
            results["fill_s"] = round(fill_s, 2)
            cases = {
                "first_page": {},
                "failed_first_page": {"status": "failed"},
                "q_first_page": {"q": "city number 42 "},
            }
            for name, query in cases.items():
                times: list[float] = []
                for n in range(requests if name == "first_page" else max(requests // 3, 10)):
                    began = time.perf_counter()
                    answer = await http.get("/api/sessions", params=query)
                    times.append((time.perf_counter() - began) * 1000)
                    if n == 0:
                        body = answer.json()
                        assert answer.status_code == 200, answer.text
                        results[f"{name}_runs"] = len(body["runs"])
                times.sort()
                results[f"{name}_ms"] = {
                    "median": round(statistics.median(times), 2),
                    "p95": round(times[int(len(times) * 0.95) - 1], 2),
                    "max": round(times[-1], 2),
                }
    return results


async def _run(backends: Sequence[str], runs: int, requests: int) -> list[dict[str, Any]]:
    results = []
    for kind in backends:
        if kind == "memory":
            results.append(await measure("memory://", runs, requests))
            continue
        redis = await PrivateRedis().start()
        try:
            results.append(await measure(redis.url, runs, requests))
        finally:
            await redis.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench --run-index", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    parser.add_argument("--runs", type=int, default=10_000, help="runs indexed [10000]")
    parser.add_argument("--requests", type=int, default=300, help="first pages timed [300]")
    parser.add_argument("--backends", default="memory,redis", help="memory,redis [both]")
    args = parser.parse_args(argv)
    results = asyncio.run(_run(args.backends.split(","), args.runs, args.requests))
    ok = True
    for result in results:
        print(json.dumps(result))
        median = result["first_page_ms"]["median"]
        verdict = "ok" if median <= TARGET_MS else "MISSED"
        ok = ok and median <= TARGET_MS
        print(
            f"{result['backend']:>6}: first page of {result['runs']:,} runs: median {median} ms, "
            f"p95 {result['first_page_ms']['p95']} ms (target {TARGET_MS:g} ms: {verdict})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
