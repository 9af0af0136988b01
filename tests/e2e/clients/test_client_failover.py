"""The Python watcher and ``agent-broadcaster tail`` follow a run over Redis through a
server node that is killed (SIGKILL) and replaced mid-run: they reconnect to the new
node, resume from their position, and lose nothing (or would say so)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from broadcaster.client import Resume, create_run_view, reconcile, reduce_run, watch_session
from tests.support.processes import REPO, RedisServer, ServerFactory, ServerProcess, free_port
from tests.support.worker import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PREFIX = "client-failover"


@pytest.fixture
def worker(redis_server: RedisServer) -> Iterator[WorkerProcess]:
    process = WorkerProcess(redis_server.url, prefix=PREFIX).started()
    yield process
    process.stop()


class Edge:
    """A fan-out node on a fixed port that can be killed and replaced on that port."""

    def __init__(self, redis_url: str) -> None:
        self.port = free_port()
        self.args = ("--backend", redis_url, "--redis-prefix", PREFIX)
        self.proc = self._start()

    def _start(self) -> ServerProcess:
        server = ServerProcess(self.args)
        server.args = ["--port", str(self.port), *self.args]
        return server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replace(self) -> None:
        self.proc.kill()
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def shape(
    server_factory: ServerFactory, redis_server: RedisServer, worker: WorkerProcess
) -> Iterator[tuple[ServerProcess, Edge]]:
    """A web node that queues runs (worker runs them) and an edge node to watch through."""
    web = server_factory(
        "--demo",
        "--backend",
        redis_server.url,
        "--redis-prefix",
        PREFIX,
        env={"AGENT_DEMO_RUN_MODE": "queue"},
    )
    edge = Edge(redis_server.url)
    yield web, edge
    edge.stop()


async def start_run(url: str) -> dict[str, Any]:
    body = {"input": "What is the weather in Oslo?", "pace_ms": 60}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{url}/run", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.timeout(120)
async def test_the_watcher_resumes_through_a_replaced_node_with_nothing_lost(
    shape: tuple[ServerProcess, Edge],
) -> None:
    web, edge = shape
    run = await start_run(web.url)
    resumes: list[Resume] = []
    watch = watch_session(
        edge.url,
        run["session_id"],
        since=run["position"],
        key="agent-key",
        on_resume=resumes.append,
    )
    view, positions = create_run_view(run["session_id"]), []
    async with asyncio.timeout(90):
        async for envelope in watch:
            positions.append(watch.position)
            view = reduce_run(view, envelope, watch.position)
            if len(positions) == 3:
                await asyncio.to_thread(edge.replace)
    assert [r.recovered for r in resumes] == [True, True], resumes
    assert resumes[1].after_drop
    assert view["status"] == "completed"
    offsets = [int(str(p).rsplit(":", 1)[1]) for p in positions]
    start = int(run["position"].rsplit(":", 1)[1])
    assert offsets == list(range(start + 1, start + 1 + len(offsets))), "no gap, no repeat"
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{edge.url}{run['state_url']}")).json()
    assert reconcile(view, snapshot) == []


@pytest.mark.timeout(120)
def test_tail_follows_through_a_replaced_node_and_exits_0(
    shape: tuple[ServerProcess, Edge],
) -> None:
    web, edge = shape
    run = asyncio.run(start_run(web.url))
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broadcaster",
            "tail",
            run["session_id"],
            "--url",
            edge.url,
            "--since",
            run["position"],
            "--key",
            "agent-key",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert tail.stdout is not None
    lines = []
    for line in tail.stdout:
        lines.append(line)
        if line.startswith("── step 1"):
            edge.replace()
            break
    rest, errors = tail.communicate(None, 90)
    output = "".join(lines) + rest
    assert tail.returncode == 0, output + errors
    assert "⟲ reconnected: resumed" in output
    assert "■ completed" in output
    assert "reconcile: in sync" in output
