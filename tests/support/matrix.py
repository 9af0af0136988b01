"""The conformance matrix's rows: run kinds, produced once per backend on real servers,
and read back by every surface (tests/support/surfaces.py; the test modules are in
tests/e2e/conformance/).

Each kind's run is produced the way a user starts it: the demo agent's runs through
AG-UI with ``@ag-ui/client``'s own ``HttpAgent`` (its stream is the AG-UI surface),
the framework runs by their adapters over the Pusher HTTP API. Its expected facts are
then read from the channel with a plain Pusher WebSocket client (the envelopes as
published, folded by :func:`tests.support.facts.facts_from_envelopes`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.facts import Record, RunFacts, facts_from_envelopes
from tests.support.live import APP_ID, KEY, SECRET, Client
from tests.support.node import run_node_script
from tests.support.openai_api import API_KEY, FakeChatAPI, Reply, chunk, sse, text, usage
from tests.support.processes import ServerProcess

__all__ = [
    "BACKENDS",
    "KINDS",
    "LONG_ANSWER",
    "NODE_WITHIN",
    "Kind",
    "ProducedRun",
    "RunInput",
    "Servers",
    "kind_named",
    "produce",
    "start_servers",
]

BACKENDS = ("memory", "redis")
NODE_WITHIN = 120.0
"""Seconds a Node client has for its runs: starting node on a loaded 2-core machine
(the other xdist worker producing its own runs) takes most of it."""

LONG_ANSWER = "".join(
    f'Paragraph {n}: the model says "hello" — grüße, 😀, and goes on at length.\n' * 20
    for n in range(30)
)
"""A long answer (about 40,000 characters, multibyte), streamed in deltas of 4,000: more
than one ``agent.stream.chunk`` (8 KiB each at most) and past every 2,000-character cut."""


@dataclass(frozen=True)
class RunInput:
    """One run of a kind's session: the user's text and AG-UI ``forwardedProps``."""

    text: str
    props: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Kind:
    """A row of the matrix.

    Args:
        name: its id in test names.
        title: its row in docs/protocol.md.
        runs: the session's runs, in order (a kind about a later run has earlier ones).
        expect: what its expected facts must be (a check of the row itself).
        which: the index of the kind's run among ``runs``.
        session: kinds with the same session share one produced session.
        framework: the adapter that publishes it (else the demo agent through AG-UI).
        driver: the demo's driver (``openai``: a chat-completions server on loopback).
        backends: where it is produced.
        latest: whether it is its session's latest run (the stored state is that one's).
    """

    name: str
    title: str
    runs: tuple[RunInput, ...]
    expect: Mapping[str, Any]
    which: int = 0
    session: str = ""
    framework: str | None = None
    driver: str = "scripted"
    backends: tuple[str, ...] = ("memory",)

    @property
    def group(self) -> str:
        return self.session or self.name

    @property
    def latest(self) -> bool:
        return self.which == len(self.runs) - 1


WEATHER = RunInput("What is the weather in Oslo?")
SESSION = (WEATHER, RunInput("What is 6 * 7?"), RunInput("What is the weather in Lima?"))

KINDS: tuple[Kind, ...] = (
    Kind(
        "completed",
        "completed (two tool calls, three steps)",
        (WEATHER,),
        {"status": "completed", "stop_reason": "completed", "steps": 3, "tool_calls": 2},
        backends=BACKENDS,
    ),
    Kind(
        "failed-last-step",
        "failed on its last allowed step",
        (RunInput("What is the weather in Oslo? [fail:tool]", {"max_steps": 2}),),
        {"status": "failed", "stop_reason": "error", "steps": 2, "tool_calls": 2},
    ),
    Kind(
        "steps-limit",
        "steps limit",
        (RunInput("What is the weather in Oslo?", {"max_steps": 1}),),
        {"status": "completed", "stop_reason": "steps_limit", "steps": 1, "tool_calls": 1},
    ),
    Kind(
        "routed",
        "routed, with a nested run",
        (RunInput("What is the weather in Oslo?", {"mode": "route"}),),
        {"status": "completed", "steps": 1, "tool_calls": 1, "routing_phases": 3, "nested": 1},
        backends=BACKENDS,
    ),
    Kind(
        "routed-failing",
        "routed, its capability failing",
        (RunInput("What is the weather in Oslo? [fail:tool]", {"mode": "route"}),),
        {
            "status": "failed",
            "stop_reason": "error",
            "tool_calls": 1,
            "routing_phases": 3,
            "nested": 1,
        },
        backends=BACKENDS,
    ),
    Kind(
        "second-run",
        "the second run of a session",
        SESSION,
        {"status": "completed", "steps": 2, "tool_calls": 1, "final_text": "6 * 7 = 42."},
        which=1,
        session="session",
        backends=BACKENDS,
    ),
    Kind(
        "third-run",
        "the third run of a session",
        SESSION,
        {"status": "completed", "steps": 3, "tool_calls": 2},
        which=2,
        session="session",
        backends=BACKENDS,
    ),
    *(
        Kind(
            name,
            f"{name} adapter",
            (RunInput("What is the weather in Oslo?"),),
            {"status": "completed", "stop_reason": "completed"},
            framework=name,
        )
        for name in ("pydantic-ai", "openai-agents", "langgraph")
    ),
    Kind(
        "long-answer",
        "a long streamed answer (chunked)",
        (RunInput("Say a lot."),),
        {"status": "completed", "steps": 1, "tool_calls": 0, "final_text": LONG_ANSWER},
        driver="openai",
    ),
)


def kind_named(name: str) -> Kind:
    return next(kind for kind in KINDS if kind.name == name)


# -- servers --------------------------------------------------------------------------------


@dataclass
class Servers:
    """The servers of one backend: the demo with its scripted agent, and (memory only)
    one whose demo agent talks to a chat-completions server on loopback."""

    backend: str
    demo: ServerProcess
    openai: ServerProcess | None = None

    def for_kind(self, kind: Kind) -> ServerProcess:
        if kind.driver == "openai":
            assert self.openai is not None, f"{kind.name} needs the openai driver's server"
            return self.openai
        return self.demo

    def stop(self) -> None:
        for server in (self.demo, self.openai):
            if server is not None:
                server.stop()


def start_servers(backend: str, redis_url: str | None, api: FakeChatAPI | None) -> Servers:
    """The servers for ``backend`` (``redis_url`` for redis; ``api``: the fake model of
    the long answer)."""
    args = ["--demo", "--log-level", "warning"]
    if backend == "redis":
        assert redis_url is not None
        args += ["--backend", redis_url, "--redis-prefix", f"matrix-{secrets.token_hex(4)}"]
    demo = ServerProcess(args).start()
    if api is None:
        return Servers(backend, demo)
    try:
        deltas = [LONG_ANSWER[n : n + 4000] for n in range(0, len(LONG_ANSWER), 4000)]
        reply = sse(*(text(d) for d in deltas), chunk(finish="stop"), usage(21, len(deltas)))
        script = api.script(Reply(reply))
        env = {
            "AGENT_DEMO_DRIVER": "openai",
            "AGENT_OPENAI_BASE_URL": script.base_url,
            "AGENT_OPENAI_API_KEY": API_KEY,
            "AGENT_OPENAI_MODEL": "fake-model",
        }
        return Servers(backend, demo, ServerProcess(args, env=env).start())
    except BaseException:
        demo.stop()
        raise


# -- producing the runs ---------------------------------------------------------------------


@dataclass
class ProducedRun:
    """One kind's run, as produced on one backend.

    ``since`` is the position just before the run's first envelope: what a follower of
    that run starts from. ``records`` are the session's envelopes as the channel
    delivered them; ``expected`` the run's facts folded from them. ``agui`` is the
    report of ``@ag-ui/client`` when the run was started through AG-UI."""

    kind: Kind
    backend: str
    url: str
    session_id: str
    execution_id: str
    since: str
    records: list[Record]
    expected: RunFacts
    agui: dict[str, Any] | None = None


async def produce(servers: Servers, kinds: Sequence[Kind]) -> dict[str, ProducedRun]:
    """Produce ``kinds`` (once per session) on ``servers``; by kind name."""
    groups: dict[str, list[Kind]] = {}
    for kind in kinds:
        groups.setdefault(kind.group, []).append(kind)
    slots = asyncio.Semaphore(2)  # node clients at once, on a 2-core machine

    async def one(group: list[Kind]) -> dict[str, ProducedRun]:
        async with slots:
            return await _produce_session(servers, group)

    produced: dict[str, ProducedRun] = {}
    for found in await asyncio.gather(*(one(group) for group in groups.values())):
        produced.update(found)
    return produced


async def _produce_session(servers: Servers, group: list[Kind]) -> dict[str, ProducedRun]:
    first = group[0]
    server = servers.for_kind(first)
    session = f"m-{first.group}-{secrets.token_hex(4)}"
    reports: list[dict[str, Any] | None] = []
    if first.framework is not None:
        await _publish_framework_run(server.url, first.framework, session)
        reports.append(None)
    else:
        for given in first.runs:
            reports.append(await _agui_run(server.url, session, given))
    records = await channel_records(server.ws_url, f"agent.{session}", len(first.runs))
    starts = _run_starts(records)
    assert len(starts) == len(first.runs), f"{session}: {len(starts)} runs on the channel"
    produced = {}
    for kind in group:
        index, execution = starts[kind.which]
        position = records[index][0]
        assert position is not None
        epoch, _, offset = position.rpartition(":")
        produced[kind.name] = ProducedRun(
            kind,
            servers.backend,
            server.url,
            session,
            execution,
            f"{epoch}:{int(offset) - 1}",
            records,
            facts_from_envelopes(records[index:], execution),
            reports[kind.which],
        )
    return produced


def _run_starts(records: Sequence[Record]) -> list[tuple[int, str]]:
    """(index in ``records``, execution id) of each run that is not nested."""
    return [
        (i, str(envelope["execution_id"]))
        for i, (_, envelope) in enumerate(records)
        if envelope["type"] == "agent.status"
        and envelope["payload"]["status"] == "in_progress"
        and envelope["payload"].get("parent_execution_id") is None
    ]


async def _agui_run(url: str, session: str, given: RunInput) -> dict[str, Any]:
    """Run ``given`` on thread ``session`` with ``@ag-ui/client``'s HttpAgent: its
    report (events, messages, state; ``ok`` false when it ended with ``RUN_ERROR``)."""
    run_id = f"x-{uuid.uuid4().hex[:16]}"
    props = json.dumps(dict(given.props))
    report, err = await run_node_script(
        "agui_client.mjs",
        f"{url}/ag-ui",
        session,
        run_id,
        given.text,
        "0",
        props,
        package="@ag-ui/client",
        within=NODE_WITHIN,
    )
    events = report.get("events") or []
    ended = events[-1]["type"] if events else None
    assert report["ok"] or ended == "RUN_ERROR", (report.get("error"), err)
    report["run_id"] = run_id
    return report


async def _publish_framework_run(url: str, framework: str, session: str) -> None:
    from broadcaster.publishers import PusherHTTPPublisher
    from tests.support.framework_runs import RUNS

    async with PusherHTTPPublisher(url, APP_ID, KEY, SECRET) as publisher:
        await RUNS[framework](publisher, session)


async def channel_records(ws_url: str, channel: str, runs: int) -> list[Record]:
    """Every envelope on ``channel`` from its first, with positions, up to the final
    status of its ``runs``-th run (not nested), read by a plain Pusher client."""
    client = await Client.connect(f"{ws_url}/app/{KEY}?protocol=7")
    try:
        # A position that cannot match: the answer names the channel's epoch.
        probe = await client.subscribe(channel, position="start:0")
        assert probe["event"] == "pusher_internal:subscription_succeeded", probe
        resume = await client.expect("broadcaster:resume")
        epoch = str(resume["data"]["position"]).rpartition(":")[0]
        await client.send("pusher:unsubscribe", {"channel": channel})
        answer = await client.subscribe(channel, position=f"{epoch}:0")
        assert answer["event"] == "pusher_internal:subscription_succeeded", answer
        records: list[Record] = []
        ended = 0
        while ended < runs:
            message = await client.recv(within=15)
            if not str(message["event"]).startswith("agent."):
                continue
            envelope = message["data"]
            records.append((message.get("position"), envelope))
            payload = envelope["payload"]
            nested = payload.get("parent_execution_id") is not None
            if envelope["type"] == "agent.status" and payload["status"] in ("completed", "failed"):
                ended += 0 if nested else 1
        return records
    finally:
        await client.close()
