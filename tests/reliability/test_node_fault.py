"""Node fault: two server processes on one Redis; the node a client reads a run from
is SIGKILLed mid-run. The client reconnects to the other node, resumes from its last
position and ends with exactly the sequence a reference client read without a fault."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.live import Client
from tests.support.processes import RedisServer, ServerFactory
from tests.support.reliability import WS_PATH, report
from tests.support.runs import offsets, read_run, start_run, stream, subscribe

pytestmark = [pytest.mark.redis, pytest.mark.slow]


async def test_a_client_on_a_killed_node_resumes_on_the_other_one_and_misses_nothing(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    args = ("--backend", redis.url, "--redis-prefix", "node-fault", "--log-level", "warning")
    runner = server_factory("--demo", *args)  # runs the agent and stays up
    doomed = server_factory(*args)
    runner.wait_ready()
    doomed.wait_ready()

    reference = await Client.connect(runner.ws_url + WS_PATH)
    client = await Client.connect(doomed.ws_url + WS_PATH)
    run = await start_run(runner.url, pace_ms=40, trace=True)
    await subscribe(reference, run["channel"], run["position"])
    await subscribe(client, run["channel"], run["position"])

    before = await read_run(client, stop_after=6)
    doomed.kill()  # SIGKILL: no close frame, no goodbye to Redis
    assert await client.closed_with() in (None, 1006)  # no close frame from a dead node

    again = await Client.connect(runner.ws_url + WS_PATH)
    await subscribe(again, run["channel"], before[-1][0])
    after = await read_run(again)
    everything = await read_run(reference)

    assert offsets(before + after) == offsets(everything)
    assert stream(before + after) == stream(everything)
    assert everything[-1][2]["status"] == "completed"
    assert runner.proc is not None
    assert runner.proc.poll() is None
    for open_client in (reference, again):
        await open_client.close()
    report(
        "node_fault",
        events=len(everything),
        read_before_kill=len(before),
        resumed_after_kill=len(after),
        lost=len(everything) - len(before + after),
        equal_to_reference=stream(before + after) == stream(everything),
    )
