"""Redis fault: SIGKILL redis-server mid-stream and restart it (empty, as a crash
without persistence would leave it) under two server processes.

Every node stays up, ``/ready`` goes false then true, the nodes restore their
subscriptions without any client action, and every publication a publisher was told
was accepted (HTTP 200) reaches every live client exactly once and in order, or the
client is told: a Redis that died may have acknowledged a publication it never wrote to
a node (see ``Backend.breaks``), and the restarted one lost the history that could show
it, so the nodes close the channel's clients with 4100; each resumes from its position
(as pusher-js does) and is answered ``recovered: false``, then reads on in order.
Publications refused during the outage (503 or no answer) are retried by the publisher
and counted. A client that disconnects and resumes from its position gets every
publication it missed when the history still holds it (``recovered: true``); one whose
position is from before the restart is told ``recovered: false`` (the restarted Redis
lost that history: a new epoch), never handed a silent gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.live import Client
from tests.support.processes import RedisServer, ServerFactory, ServerProcess
from tests.support.reliability import (
    WS_PATH,
    Publisher,
    Reader,
    alive,
    becomes,
    deduplicated,
    eventually,
    report,
    resume_the_closed,
    silent_gaps,
    status,
)

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

    live: list[tuple[ServerProcess, Reader]] = []
    for node in nodes:
        for _ in range(3):
            client = await connect(node)
            await subscribe(client)
            live.append((node, Reader(client).start()))
    across = Reader(await connect(nodes[1]))  # resumes across the restart
    await subscribe(across.client)
    across.start()
    within = Reader(await connect(nodes[0]))  # drops and resumes after the restart
    await subscribe(within.client)
    within.start()

    publisher = Publisher([n.url for n in nodes], CHANNEL)
    pub_task = asyncio.create_task(publisher.run(lambda: len(publisher.accepted) >= TOTAL))
    accepted_before_kill = 0
    told: dict[int, Reader] = {}  # live client (then within) -> its resume after the 4100
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
        told = await resume_the_closed([*live, (nodes[0], within)], CHANNEL, mark)
        still = told.get(len(live), within)  # the second leaver, resumed if it was closed
        await eventually(lambda: bool(still.seqs) and still.seqs[-1] >= mark + 10, "reading on")
        await still.stop()
        within_position = still.positions[-1]
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
    current = [told.get(i, reader) for i, (_, reader) in enumerate(live)]
    await eventually(lambda: all(r.seqs and r.seqs[-1] >= last for r in [*current, again]), "all")
    for node in nodes:
        assert alive(node), "a node exited"

    gaps = [
        f"live client {i}: {gap}"
        for i, (_, reader) in enumerate(live)
        for gap in silent_gaps(reader, told.get(i), accepted, publisher.retried)
    ]
    assert gaps == []
    again_closed = [r.ended for i, r in told.items() if i < len(live) and r.ended is not None]
    assert again_closed == [], "closed again after its resume"

    # Resumed within the new epoch: everything it missed, then the live rest.
    assert again.resumes[0]["recovered"] is True
    seen = deduplicated(still.seqs + again.seqs, publisher.retried)
    assert seen == accepted[accepted.index(seen[0]) :]

    # Resumed from before the restart: told the truth, then continues live.
    assert back.resumes[0]["recovered"] is False
    assert back.resumes[0]["reason"]
    before = deduplicated(across.seqs, publisher.retried)
    assert before == accepted[: len(before)]
    tail = deduplicated(back.seqs, publisher.retried)
    assert tail == accepted[accepted.index(tail[0]) :]

    for reader in [*(r for _, r in live), *told.values(), again, back]:
        await reader.stop()
    report(
        "redis_fault",
        accepted=len(accepted),
        refused_attempts=publisher.refused,
        accepted_before_kill=accepted_before_kill,
        live_clients=len(live),
        closed_with_4100=len(told),
        told_recovered=sum(1 for r in told.values() if r.resumes and r.resumes[0]["recovered"]),
        nodes=len(nodes),
        nodes_survived=sum(1 for n in nodes if alive(n)),
        resumed_recovered=again.resumes[0]["recovered"],
        resumed_across_restart_recovered=back.resumes[0]["recovered"],
    )
