"""A run's identity cannot be taken over (issue 44).

``POST /run`` accepted a client-chosen ``execution_id``: taking ids from the public
run list, an anonymous client started a run on a victim's public session under the
victim's execution id, turned its completed row into ``failed`` with its own input,
and the victim's trace went from 17 envelopes to 55 with two final statuses. Every
door that starts a run now refuses an execution id that is already a run of the
session, with 409 naming it, and the recorded run is left as it was: ``POST /run``,
AG-UI's ``runId`` (a retry of the thread's run in progress still follows it), the run
queue of the workers. The Vercel AI SDK door and a run that names no id get one from
the server; signed app publishers (the framework helpers) are trusted with theirs."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from agent_core.app.runs import ExecutionTaken, RunRequest, run_claim
from broadcaster.backends.redis import claim_key
from broadcaster.publishers import RedisStateStore
from tests.support.live import StartServer
from tests.support.processes import RedisServer
from tests.support.reliability import eventually
from tests.support.worker import consuming_worker


async def recorded(http: httpx.AsyncClient, session: str, execution: str) -> dict[str, Any]:
    """The run's index row and its trace's envelope count."""
    runs = (await http.get(f"/api/sessions/{session}/runs")).json()["runs"]
    [row] = [run for run in runs if run["execution_id"] == execution]
    trace = await http.get(f"/api/sessions/{session}/trace", params={"execution_id": execution})
    return {**row, "envelopes": len(trace.json()["envelopes"])}


async def test_post_run_refuses_an_execution_id_that_is_a_run_of_the_session(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        victim = await http.post(
            "/run", json={"input": "What is the weather in Oslo?", "wait": True}
        )
        assert victim.status_code == 200, victim.text
        session, execution = victim.json()["session_id"], victim.json()["execution_id"]
        before = await recorded(http, session, execution)
        assert before["status"] == "completed"

        hijack = {"input": "boom", "session_id": session, "execution_id": execution}
        refused = await http.post("/run", json={**hijack, "wait": True})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == (
            f"execution id {execution!r} is already a run of session {session!r}: a new run "
            "needs a new execution id (leave it out and the server assigns one)"
        )
        assert refused.json()["execution_id"] == execution
        assert await recorded(http, session, execution) == before  # row and trace kept

        # The session may go on, under a new id of the client's or the server's.
        fresh = await http.post("/run", json={**hijack, "execution_id": "mine-1", "wait": True})
        assert fresh.status_code == 200, fresh.text
        assert fresh.json()["execution_id"] == "mine-1"
        again = await http.post("/run", json={"input": "and?", "session_id": session})
        assert again.status_code == 202
        assert again.json()["execution_id"] not in (execution, "mine-1")
        assert await recorded(http, session, execution) == before


def agent_input(
    thread: str, run: str, text: str = "What is the weather in Oslo?"
) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run,
        "messages": [{"id": "m1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }


async def test_ag_ui_refuses_a_run_id_that_is_an_earlier_run_of_the_thread(
    start_server: StartServer,
) -> None:
    """The thread's last run was already refused once ended (a client retrying must not
    run the agent twice); an earlier run's id went through and rewrote that run."""
    live = await start_server(demo=True)
    thread, first, second = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        for run in (first, second):
            answer = await http.post("/ag-ui", json=agent_input(thread, run))
            assert answer.status_code == 200, answer.text
            assert "RUN_FINISHED" in answer.text
        before = await recorded(http, thread, first)
        hijack = await http.post("/ag-ui", json=agent_input(thread, first, "boom"))
        assert hijack.status_code == 409, hijack.text
        assert f"execution id {first!r} is already a run of session" in hijack.json()["error"]
        assert await recorded(http, thread, first) == before


@pytest.mark.redis
async def test_the_run_queue_refuses_an_execution_id_that_is_a_run_of_the_session(
    redis_server: RedisServer,
) -> None:
    prefix = f"ident-{uuid.uuid4().hex[:8]}"
    async with consuming_worker(redis_server, prefix) as (redis, queue, _):
        handle = await queue.start(RunRequest(input="What is 6 * 7?", session_id="q-1"))
        index = RedisStateStore(redis, "1", prefix=prefix).runs  # where the web node lists

        async def claimed() -> bool:
            return bool(await redis.exists(claim_key(prefix, "1", run_claim("q-1"))))

        async def ended() -> bool:  # its end recorded, its claim released
            return await index.recorded(handle.channel, handle.execution_id) and not (
                await claimed()
            )

        await eventually(ended, "the worker to finish the run")
        hijack = RunRequest(input="boom", session_id="q-1", execution_id=handle.execution_id)
        with pytest.raises(ExecutionTaken, match="is already a run of session 'q-1'"):
            await queue.start(hijack)
        assert not await claimed(), "the refused start gave the session back"
