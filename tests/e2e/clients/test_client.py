"""broadcaster.client: watch_session follows real runs on a real server (resume after a
drop, a gap told and reloaded, clear errors), and ``agent-broadcaster tail``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from broadcaster.cli import main
from broadcaster.client import (
    InvalidPosition,
    Resume,
    RunView,
    SessionNotFound,
    SessionRefused,
    WatchError,
    create_run_view,
    reconcile,
    reduce_run,
    watch_session,
)
from broadcaster.envelope import parse_envelope
from broadcaster.publishers import PusherHTTPPublisher
from tests.support.hostile import EXECUTION_ID, controls, hostile_run, hostile_state
from tests.support.live import APP_ID, KEY, SECRET
from tests.support.processes import REPO, ServerFactory, ServerProcess
from tests.support.reliability import publish, publish_sync

pytestmark = pytest.mark.slow

WEATHER = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def demo() -> Iterator[ServerProcess]:
    """One demo server (scripted agent, memory backend) for the module."""
    server = ServerProcess(["--demo"]).start()
    yield server
    server.stop()


async def start_run(url: str, **body: Any) -> dict[str, Any]:
    body.setdefault("input", WEATHER)
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{url}/run", json=body)
    assert response.status_code == (200 if body.get("wait") else 202), response.text
    answer: dict[str, Any] = response.json()
    return answer


async def state(url: str, session_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{url}/api/sessions/{session_id}/state")
    assert response.status_code == 200, response.text
    snapshot: dict[str, Any] = response.json()
    return snapshot


async def follow(url: str, session_id: str, **options: Any) -> tuple[RunView, list[str | None]]:
    """The view a whole watch builds, and the positions it delivered."""
    view, positions = create_run_view(session_id), []
    async with asyncio.timeout(30):
        async for envelope in (watch := watch_session(url, session_id, **options)):
            positions.append(watch.position)
            view = reduce_run(view, envelope, watch.position)
    return view, positions


async def test_watch_session_follows_a_run_in_sync_with_the_stored_state(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url, pace_ms=5)
    view, positions = await follow(demo.url, run["session_id"], since=run["position"])
    assert view["status"] == "completed"
    assert [step["number"] for step in view["steps"]] == [1, 2, 3]
    assert view["steps"][0]["tools"][0]["name"] == "get_weather"
    assert view["steps"][0]["tools"][0]["state"] == "done"
    assert "Oslo" in view["steps"][-1]["text"]
    assert view["steps"][-1]["continuation"]["evaluations"], "every criterion is kept"
    assert len(positions) == len(set(positions)) == view["event_count"]
    assert reconcile(view, await state(demo.url, run["session_id"])) == []


async def test_without_since_the_whole_history_of_a_finished_run_is_replayed(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url)
    first, _ = await follow(demo.url, run["session_id"], since=run["position"])
    again, _ = await follow(demo.url, run["session_id"])
    assert again == first


async def test_a_dropped_connection_resumes_with_nothing_lost_or_twice(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url, pace_ms=40)
    resumes: list[Resume] = []
    watch = watch_session(
        demo.url, run["session_id"], since=run["position"], on_resume=resumes.append
    )
    view, positions = create_run_view(run["session_id"]), []
    async with asyncio.timeout(30):
        async for envelope in watch:
            positions.append(watch.position)
            view = reduce_run(view, envelope, watch.position)
            if len(positions) == 4:
                assert watch._ws is not None
                await watch._ws.close()  # the socket goes, as a network drop would
    assert [r.recovered for r in resumes] == [True, True]
    assert resumes[1].after_drop
    assert len(positions) == len(set(positions))
    whole, whole_positions = await follow(demo.url, run["session_id"], since=run["position"])
    assert positions == whole_positions
    assert view == whole
    assert reconcile(view, await state(demo.url, run["session_id"])) == []


async def test_a_gap_the_server_cannot_fill_is_told_and_the_state_reloaded(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url)
    await follow(demo.url, run["session_id"], since=run["position"])
    watch = watch_session(demo.url, run["session_id"], since="another-epoch:3")
    async with asyncio.timeout(30):
        delivered = [envelope async for envelope in watch]
    assert delivered == []
    assert [r.recovered for r in watch.resumes] == [False]
    assert watch.state == "reloaded"
    assert watch.snapshot is not None
    assert watch.snapshot["status"] == "completed"


async def test_a_bad_since_is_refused_at_once(demo: ServerProcess) -> None:
    with pytest.raises(InvalidPosition, match="not a position"):
        watch_session(demo.url, "s-1", since="yesterday")
    with pytest.raises(WatchError, match="invalid session id"):
        watch_session(demo.url, "has spaces")


async def test_an_unknown_session_is_an_error_not_a_hang(demo: ServerProcess) -> None:
    async with asyncio.timeout(20):
        with pytest.raises(SessionNotFound, match="unknown session 'never-ran'"):
            async for _ in watch_session(demo.url, "never-ran"):
                pass


async def test_a_refused_token_is_an_error_not_a_hang(demo: ServerProcess) -> None:
    run = await start_run(demo.url)
    async with asyncio.timeout(20):
        with pytest.raises(SessionRefused, match="does not grant"):
            async for _ in watch_session(demo.url, run["session_id"], token="not-the-token"):
                pass


async def test_a_server_that_is_not_there_is_an_error_not_a_hang() -> None:
    async with asyncio.timeout(20):
        with pytest.raises(WatchError, match="cannot connect"):
            async for _ in watch_session("http://127.0.0.1:9", "s-1", key="agent-key"):
                pass


# --- agent-broadcaster tail -------------------------------------------------------------


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def tail(*args: str) -> Done:
    """``agent-broadcaster tail`` in this process (click's runner: the exit status it
    would give, and what it printed)."""
    result = CliRunner().invoke(main, ["tail", *args], catch_exceptions=False)
    return Done(result.exit_code, result.stdout, result.stderr)


def test_tail_in_a_real_process_exits_2_for_an_unknown_session(demo: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broadcaster", "tail", "never-ran", "--url", demo.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown session 'never-ran'" in done.stderr


async def test_tail_traces_a_completed_run_and_exits_0(demo: ServerProcess) -> None:
    run = await start_run(demo.url, pace_ms=5)
    done = await asyncio.to_thread(
        tail, run["session_id"], "--url", demo.url, "--since", run["position"]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for text in (
        "── step 1",
        "⚙ get_weather",
        "✓ get_weather",
        "decision after step 3",
        "ToolCallPresenceCheck",
        "■ completed",
        "reconcile: in sync",
    ):
        assert text in done.stdout, done.stdout


async def test_tail_exits_1_for_a_run_that_failed_on_its_last_allowed_step(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url, input=f"{WEATHER} [fail:model]", max_steps=2)
    done = await asyncio.to_thread(tail, run["session_id"], "--url", demo.url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "■ failed" in done.stdout
    assert "StepsLimit: forbid" in done.stdout
    assert "reconcile: in sync" in done.stdout


async def test_tail_json_prints_each_envelope_with_its_position_then_the_result(
    demo: ServerProcess,
) -> None:
    run = await start_run(demo.url)
    done = await asyncio.to_thread(tail, run["session_id"], "--url", demo.url, "--json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    envelopes = [r for r in records if "envelope" in r]
    assert all(r["position"] for r in envelopes)
    assert envelopes[-1]["envelope"]["payload"]["status"] == "completed"
    assert records[-2]["type"] == "broadcaster:resume"
    result = records[-1]
    assert (result["type"], result["status"], result["differences"]) == (
        "tail.result",
        "completed",
        [],
    )
    # The run's start came as a replay (the tail subscribed late), which the server
    # answered as recovered: nothing lost.
    [resume] = result["resumes"]
    assert resume["recovered"]
    assert 1 <= resume["missed"] <= len(envelopes)


async def publish_hostile_run(url: str, session_id: str) -> list[dict[str, Any]]:
    """Publish :func:`hostile_run` on ``session_id`` through the signed HTTP API, with an
    envelope tail cannot fold among them (its step number is markup, not a number),
    and store a state that differs in hostile text; returns the valid envelopes."""
    run = hostile_run(session_id, EXECUTION_ID)
    channel = f"agent.{session_id}"
    invalid = {**run[2], "payload": {"step_number": "[link=https://evil.example/]9[/link]"}}
    async with PusherHTTPPublisher(url, APP_ID, KEY, SECRET, timeout=30) as pusher:
        for envelope in run[:2]:
            await pusher.broadcast(channel, parse_envelope(envelope))
        await pusher.flush(30)
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await publish(http, url, channel, "agent.step.started", json.dumps(invalid))
            assert answer.status_code == 200, answer.text
        for envelope in run[2:]:
            await pusher.broadcast(channel, parse_envelope(envelope))
        await pusher.save(channel, json.dumps(hostile_state(EXECUTION_ID)).encode())
    return run


def tail_bytes(url: str, session_id: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``agent-broadcaster tail`` in a real process: its exit status and the very bytes
    it wrote."""
    return subprocess.run(
        [sys.executable, "-m", "broadcaster", "tail", session_id, "--url", url, *args],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )


async def test_tail_shows_escape_sequences_a_run_carries_as_text_never_acts_on_them(
    demo: ServerProcess,
) -> None:
    """Clipboard writes (OSC 52), titles, clear-screen, hyperlinks (OSC 8), C1 controls
    and rich markup in every field a model, tool or publisher writes, and in the stored
    state: none reaches the terminal. Before, 21 raw ESC bytes did."""
    await publish_hostile_run(demo.url, "s-hostile-tail")
    done = await asyncio.to_thread(tail_bytes, demo.url, "s-hostile-tail")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count(b"\x1b") == 0
    text = done.stdout.decode("utf-8")
    assert controls(text) == []
    shown = text.replace("\n", "")
    for visible in (
        "\\x1b]52;c;ZXZpbA==\\x07",  # shown as escapes, in full
        "\\x9b31m",
        "[link=https://evil.example/]markup[/link][bold]",  # markup shown as text
        "⚠ skipped an envelope tail cannot read ('agent.step.started': TypeError",
        "reconcile: ",
        "run 1 · x-\\x1b]0;run\\x07\\x9b2J[link=https://evil.example/]x[/link]",
        "┌ nested run n-\\x1b]8;;https://evil.example/",
    ):
        assert visible in shown, text
    assert "\nline two" in text  # streamed text keeps its line breaks
    assert "■ failed" in text


async def test_tail_json_escapes_every_control_character_and_keeps_the_text(
    demo: ServerProcess,
) -> None:
    """One JSON object a line with C1 controls, DEL and the line separators escaped as
    \\uXXXX (json writes them raw): no ESC byte and no control code point, and each
    line parses back to the very text published."""
    run = await publish_hostile_run(demo.url, "s-hostile-json")
    done = await asyncio.to_thread(tail_bytes, demo.url, "s-hostile-json", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count(b"\x1b") == 0
    text = done.stdout.decode("utf-8")
    assert controls(text) == []
    records = [json.loads(line) for line in text.split("\n") if line]
    envelopes = [r["envelope"] for r in records if "envelope" in r and "unreadable" not in r]
    assert envelopes == [parse_envelope(e).model_dump(mode="json") for e in run]
    [unreadable] = [r for r in records if "unreadable" in r]
    assert unreadable["unreadable"].startswith("'agent.step.started': TypeError")
    assert unreadable["envelope"]["payload"]["step_number"].startswith("[link=")
    assert records[-1]["type"] == "tail.result"


async def test_tail_keeps_a_sessions_runs_apart_and_follows_the_latest_to_its_end(
    demo: ServerProcess,
) -> None:
    """Two runs ended (the second failed) and a third still going when tail starts: each
    run is printed under its own header, and tail follows the third to its end (it used
    to stop after the history, as the first run had ended) and exits by it: 0."""
    first = await start_run(demo.url, pace_ms=5, wait=True)
    session = first["session_id"]
    await start_run(demo.url, session_id=session, input=f"{WEATHER} [fail:model]", wait=True)
    third = await start_run(demo.url, session_id=session, pace_ms=80)
    done = await asyncio.to_thread(tail, session, "--url", demo.url)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    headers = [out.index(f"run {n} · ") for n in (1, 2, 3)]
    assert headers == sorted(headers), out
    assert f"run 3 · {third['execution_id']}" in out
    assert out.index("■ failed") < headers[2] < out.index("■ completed", headers[2]), out
    assert "followed: run 3 of the session's 3" in out
    assert "reconcile: in sync" in out


def _publish(url: str, envelope: dict[str, Any]) -> None:
    """Publish ``envelope`` on its session's channel through the signed HTTP API, as an
    agent outside the server does."""
    channel = f"agent.{envelope['session_id']}"
    response = publish_sync(url, channel, envelope["type"], json.dumps(envelope))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("inner", "outer", "code"), [("failed", "completed", 0), ("completed", "failed", 1)]
)
def test_tail_exits_by_the_run_it_follows_not_by_a_run_nested_in_it(
    demo: ServerProcess, inner: str, outer: str, code: int
) -> None:
    """A run nested in the one followed (a capability's inner agent) is printed indented
    under its call, and its end neither ends tail nor sets its exit status."""
    session = f"nested-{inner}"

    def status(execution: str, value: str, **link: str) -> dict[str, Any]:
        payload: dict[str, Any] = {"status": value, **link}
        if value == "failed":
            payload.update(stop_reason="error", error_message=f"{execution} failed")
        return {
            "type": "agent.status",
            "session_id": session,
            "execution_id": execution,
            "timestamp": "2024-05-01T12:00:00Z",
            "payload": payload,
        }

    link = {"parent_execution_id": "x-outer", "parent_tool_call_id": "cap_1"}
    for envelope in (
        status("x-outer", "in_progress"),
        status("x-inner", "in_progress", **link),
        status("x-inner", inner, **link),
        status("x-outer", outer),
    ):
        _publish(demo.url, envelope)
    done = tail(session, "--url", demo.url)
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].strip() == "run 1 · x-outer"
    assert "┌ nested run x-inner for call cap_1" in lines
    assert f"  │ ■ {inner}" in "\n".join(lines)
    assert any(line.startswith(f"■ {outer}") for line in lines), lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["never-ran"], "unknown session"),
        (["s-1", "--since", "bad"], "not a position"),
        (["s-1", "--url", "http://127.0.0.1:9"], "cannot connect"),
    ],
)
async def test_tail_exits_2_with_a_clear_message_when_it_cannot_follow(
    demo: ServerProcess, args: list[str], message: str
) -> None:
    if "--url" not in args:
        args = [*args, "--url", demo.url]
    done = await asyncio.to_thread(tail, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr.replace("\n", " ")


async def test_a_private_session_is_followed_with_its_token(
    server_factory: ServerFactory,
) -> None:
    server = server_factory("--demo", env={"AGENT_DEMO_PRIVATE_SESSIONS": "true"})
    run = await start_run(server.url)
    token = run["auth"]["token"]
    assert run["channel"].startswith("private-")
    view, _ = await follow(server.url, run["session_id"], since=run["position"], token=token)
    assert view["status"] == "completed"
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"{server.url}/api/sessions/{run['session_id']}/state",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert reconcile(view, response.json()) == []
    async with asyncio.timeout(20):
        with pytest.raises(SessionRefused, match="private"):
            async for _ in watch_session(server.url, run["session_id"]):
                pass
