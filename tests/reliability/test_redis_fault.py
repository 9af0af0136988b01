"""Redis fault: SIGKILL redis-server mid-stream and restart it (empty, as a crash
without persistence would leave it) under two server processes.

Every node stays up, ``/ready`` goes false then true, the nodes restore their
subscriptions without any client action, and every publication a publisher was told
was accepted (HTTP 200) reaches every client that stayed connected, exactly once and in
order. Publications refused during the outage (503 or no answer) are retried by the
publisher and counted. A client that disconnects and resumes from its position gets
every publication it missed when the history still holds it (``recovered: true``); one
whose position is from before the restart is told ``recovered: false`` (the restarted
Redis lost that history: a new epoch), never handed a silent gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.reliability.helpers import (
    WS_PATH,
    Publisher,
    Reader,
    alive,
    becomes,
    deduplicated,
    eventually,
    report,
    status,
)
from tests.support.live import Client
from tests.support.processes import RedisServer, ServerFactory, ServerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHANNEL = "agent.redis-fault"
TOTAL = 300  # accepted publications in the run


async def connect(server: ServerProcess) -> Client:
    return await Client.connect(server.ws_url + WS_PATH)


async def subscribe(client: Client, position: str | None = None) -> dict[str, Any]:
    fields = {} if position is None else {"position": position}
    answer = await client.subscribe(CHANNEL, **fields)
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer
    return answer


async def test_nothing_accepted_is_lost_when_redis_is_killed_and_restarted(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    args = ("--backend", redis.url, "--redis-prefix", "fault", "--log-level", "warning")
    nodes = [server_factory(*args), server_factory(*args)]
    for node in nodes:
        node.wait_ready()

    live: list[Reader] = []
    for node in nodes:
        for _ in range(3):
            client = await connect(node)
            await subscribe(client)
            live.append(Reader(client).start())
    across = Reader(await connect(nodes[1]))  # resumes across the restart
    await subscribe(across.client)
    across.start()
    within = Reader(await connect(nodes[0]))  # drops and resumes after the restart
    await subscribe(within.client)
    within.start()

    publisher = Publisher([n.url for n in nodes], CHANNEL)
    pub_task = asyncio.create_task(publisher.run(lambda: len(publisher.accepted) >= TOTAL))
    accepted_before_kill = 0
    try:
        await eventually(lambda: len(publisher.accepted) >= TOTAL // 3, "a third of the run")
        redis.kill()
        accepted_before_kill = len(publisher.accepted)
        for node in nodes:
            await becomes(node, 503)
        await across.stop()  # a client leaves during the outage
        for node in nodes:
            assert await status(node.url, "/up") == 200, "a node went down with Redis"
        redis.start()
        for node in nodes:
            await becomes(node, 200)
        mark = len(publisher.accepted)
        await eventually(lambda: len(publisher.accepted) >= mark + 20, "publishing resumes")
        await eventually(lambda: len(within.seqs) >= mark + 10, "the second leaver to read on")
        await within.stop()
        within_position = within.positions[-1]
        await eventually(lambda: len(publisher.accepted) >= mark + 60, "more publications")

        back = Reader(await connect(nodes[0]))
        await subscribe(back.client, across.positions[-1])
        back.start()
        again = Reader(await connect(nodes[1]))
        await subscribe(again.client, within_position)
        again.start()
        await pub_task
    finally:
        pub_task.cancel()

    accepted = publisher.accepted
    last = accepted[-1]
    readers = [*live, again]
    await eventually(lambda: all(r.seqs and r.seqs[-1] >= last for r in readers), "delivery")
    for node in nodes:
        assert alive(node), "a node exited"

    lost = 0
    for reader in live:
        got = deduplicated(reader.seqs, publisher.retried)
        lost += len(set(accepted) - set(got))
        assert got == accepted, (
            live.index(reader),
            set(accepted) - set(got),
            reader.positions[95:105],
            publisher.refused,
        )

    # Resumed within the new epoch: everything it missed, then the live rest.
    seen = deduplicated(within.seqs + again.seqs, publisher.retried)
    assert again.resumes[0]["recovered"] is True
    assert seen == accepted

    # Resumed from before the restart: told the truth, then continues live.
    assert back.resumes[0]["recovered"] is False
    assert back.resumes[0]["reason"]
    before = deduplicated(across.seqs, publisher.retried)
    assert before == accepted[: len(before)]
    tail = deduplicated(back.seqs, publisher.retried)
    assert tail == accepted[accepted.index(tail[0]) :]

    for reader in [*readers, back]:
        await reader.stop()
    report(
        "redis_fault",
        accepted=len(accepted),
        refused_attempts=publisher.refused,
        accepted_before_kill=accepted_before_kill,
        lost=lost,
        live_clients=len(live),
        nodes=len(nodes),
        nodes_survived=sum(1 for n in nodes if alive(n)),
        resumed_recovered=again.resumes[0]["recovered"],
        resumed_across_restart_recovered=back.resumes[0]["recovered"],
    )
