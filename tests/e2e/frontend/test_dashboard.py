"""The live agent dashboard in a real browser (Debian's chromium via playwright).

The server runs the demo (``--demo``): the page at ``/`` starts a run of the scripted
agent through ``POST /run`` and follows ``agent.<session>`` with pusher-js. Assertions
read the visible page; ``window.dashboard`` is only used for failure diagnostics and to
read the position the page will resume from.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import APIResponse, Browser, Page, Route, expect
from websockets.sync.client import connect

from tests.support.pages import (
    WAIT_MS,
    screenshot,
    start_run,
)
from tests.support.processes import RedisServer, ServerFactory, ServerProcess, free_port
from tests.support.proxy import CuttableProxy

pytestmark = pytest.mark.browser

# The scripted demo agent (agent_core.app.demo_tools.demo_script): three steps.
STEPS = 3
TOOL_CALLS = {1: ["call_weather_1"], 2: ["call_calc_1"], 3: []}
STATE_URL = re.compile(r"/api/sessions/[^/]+/state$")


def expect_complete_run(page: Page, city: str) -> None:
    """Everything the scripted run shows: steps, tools, text, continuation, totals."""
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    steps = page.locator("#timeline > li.step")
    expect(steps).to_have_count(STEPS)
    for number, ids in TOOL_CALLS.items():
        step = page.locator(f"#step-{number}")
        expect(step).to_have_attribute("data-state", "done")
        expect(step.locator(".step-meta")).to_contain_text(re.compile(r"\d+ tokens"))
        expect(step.locator(".step-meta")).to_contain_text(re.compile(r"\d+(\.\d+)? m?s"))
        tools = step.locator("li.tool")
        expect(tools).to_have_count(len(ids))
        for call_id in ids:
            tool = step.locator(f'li.tool[data-tool-call-id="{call_id}"]')
            expect(tool).to_have_attribute("data-state", "ok")
            expect(tool.locator(".tool-outcome")).to_have_text("ok")
            expect(tool.locator(".tool-duration")).to_have_text(re.compile(r"\d"))
        continuation = step.locator("details.continuation")
        expect(continuation).to_be_visible()
        expect(continuation.locator(".cont-resolved")).not_to_be_empty()
        expect(continuation.locator("tbody tr").first).to_be_visible()
    weather = page.locator('#step-1 li.tool[data-tool-call-id="call_weather_1"]')
    expect(weather.locator(".tool-name")).to_have_text("get_weather")
    expect(weather.locator(".tool-args")).to_contain_text(city)
    expect(page.locator("#step-1 .finish")).to_have_text("tool_calls")
    expect(page.locator("#step-3 .finish")).to_have_text("stop")
    expect(page.locator("#step-1 .continuation .should-continue")).to_have_text("true")
    expect(page.locator("#step-3 .continuation .should-continue")).to_have_text("false")
    expect(page.locator("#step-3 .continuation .decision")).to_contain_text("stop")
    answer = page.locator("#answer")
    expect(answer).to_contain_text(f"In {city} it is")
    expect(answer).to_contain_text("°F")
    expect(page.locator("#total-steps")).to_have_text(str(STEPS))
    expect(page.locator("#total-tools")).to_have_text("2")
    expect(page.locator("#total-tokens")).not_to_have_text("0")
    expect(page.locator("#total-time")).to_have_text(re.compile(r"\d"))
    reconcile = page.get_by_role("status").filter(has_text="In sync")
    expect(reconcile).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync")


def diagnostics(page: Page) -> str:
    return str(
        page.evaluate(
            "JSON.stringify({positions: window.dashboard.positions,"
            " resumes: window.dashboard.resumes,"
            " reconcile: window.dashboard.reconcile})"
        )
    )


def test_a_run_started_from_the_page_shows_steps_tools_text_continuation_and_is_in_sync(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    start_run(page, demo_server.url, "What is the weather in Lisbon?")
    expect(page.get_by_role("status", name="Connection")).to_contain_text("Live")
    # The text streams in: the first step's sentence appears before the run ends.
    expect(page.locator("#step-1 .step-text")).to_contain_text(
        "Let me check the weather in Lisbon", timeout=WAIT_MS
    )
    try:
        expect_complete_run(page, "Lisbon")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(page)}") from None
    positions = page.evaluate("window.dashboard.positions")
    offsets = [int(p.rsplit(":", 1)[1]) for p in positions]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets
    screenshot(page, artifacts, "run-completed")


def _wait_for_step_completed(ws_url: str, channel: str, position: str, step: int) -> None:
    """Subscribe directly to the server from ``position`` and return once the channel
    has published ``agent.step.completed`` for ``step`` (replayed or live): the
    events after ``position`` up to there are what the disconnected page missed."""
    with connect(f"{ws_url}/app/agent-key?protocol=7&client=py&version=1", open_timeout=10) as ws:
        established = json.loads(ws.recv(timeout=10))
        assert established["event"] == "pusher:connection_established", established
        subscribe = {"channel": channel, "position": position}
        ws.send(json.dumps({"event": "pusher:subscribe", "data": subscribe}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("event") == "agent.step.completed":
                envelope = json.loads(message["data"])
                if envelope["payload"]["step_number"] >= step:
                    return
        raise TimeoutError(f"no agent.step.completed for step {step} on {channel}")


def test_the_page_resumes_after_the_websocket_drops_mid_run_with_no_missing_step(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    proxy = CuttableProxy(int(demo_server.url.rsplit(":", 1)[1]))
    try:
        session = start_run(page, proxy.url, "What is the weather in Oslo?", pace="150")
        # Cut while the first step is still streaming its text.
        expect(page.locator("#step-1 .step-text")).to_contain_text("Let me", timeout=WAIT_MS)
        proxy.block()
        assert proxy.cut() > 0
        connection = page.get_by_role("status", name="Connection")
        expect(connection).to_contain_text(re.compile("Reconnecting|Offline"), timeout=WAIT_MS)
        position = page.evaluate("window.dashboard.position")
        assert position, diagnostics(page)
        # While the page is cut off, the run publishes the rest of step 1 and all of step 2.
        _wait_for_step_completed(demo_server.ws_url, f"agent.{session}", position, 2)
        expect(page.locator('.step[data-state="done"]')).to_have_count(0)
        screenshot(page, artifacts, "reconnecting")
        proxy.unblock()

        expect(connection).to_contain_text("Live", timeout=WAIT_MS)
        expect(connection).to_contain_text(re.compile(r"history recovered \(\d+ events? missed\)"))
        try:
            expect_complete_run(page, "Oslo")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics(page)}") from None
        positions = page.evaluate("window.dashboard.positions")
        offsets = [int(p.rsplit(":", 1)[1]) for p in positions]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets
        resumes = page.evaluate("window.dashboard.resumes")
        assert any(r["recovered"] and r["missed"] > 0 and not r["initial"] for r in resumes)
        screenshot(page, artifacts, "resumed")
    finally:
        proxy.close()


def test_a_run_that_fails_on_its_last_allowed_step_is_shown_failed_with_its_error(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """Step limit 2 and a model that fails in step 2 (``[fail:model]``): the error wins
    over the step limit, on the page as in the stored snapshot."""
    start_run(page, demo_server.url, "What is the weather in Oslo? [fail:model]", max_steps="2")
    expect(page.get_by_label("Run status")).to_have_text("failed", timeout=WAIT_MS)
    expect(page.locator("#run-error")).to_be_visible()
    expect(page.locator("#run-error")).to_contain_text("the demo model failed on purpose")
    expect(page.locator("#stop-reason")).to_have_text("error")
    expect(page.locator("#timeline > li.step")).to_have_count(2)
    failed = page.locator("#step-2")
    expect(failed.locator(".finish")).to_have_text("error")
    expect(failed.locator(".step-meta")).to_contain_text("1 error")
    expect(failed.locator(".continuation .cont-resolved")).to_have_text("ErrorPolicyCriterion")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    screenshot(page, artifacts, "failed-on-last-step")


@pytest.mark.parametrize("mode", ["agent", "route"])
def test_a_run_stopped_at_its_maximum_duration_is_failed_and_reconciled_truthfully(
    page: Page, server_factory: ServerFactory, artifacts: Path, mode: str
) -> None:
    """A run stopped mid-stream by AGENT_DEMO_MAX_RUN_SECONDS is shown failed with the
    limit's message. An agent run's state as of its last completed step is stored and
    in sync with the events (the text of the step cut off is in no state); a routed run
    stores none, and the page says so instead of reading the session's state."""
    server = server_factory("--demo", env={"AGENT_DEMO_MAX_RUN_SECONDS": "2.5"})
    page.goto(server.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("Mode").select_option(mode)
    page.get_by_label("Pace").select_option("400")
    page.get_by_label("Ask the agent").fill("What is the weather in Lima? " * 40)
    page.get_by_role("button", name="Start run").click()
    expect(page.get_by_label("Run status")).to_have_text("failed", timeout=WAIT_MS)
    expect(page.locator("#run-error")).to_contain_text("AGENT_DEMO_MAX_RUN_SECONDS")
    cut = page.locator("#step-1")  # cut off mid-way: stopped, not still running
    expect(cut).to_have_attribute("data-state", "stopped")
    expect(cut.locator(".finish")).to_have_text("stopped")
    expect(cut.locator('li.tool[data-state="running"]')).to_have_count(0)
    reconcile = page.locator("#reconcile")
    if mode == "agent":
        expect(reconcile).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    else:
        expect(reconcile).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(reconcile).to_contain_text("this run stored no final state")
    screenshot(page, artifacts, f"stopped-at-maximum-duration-{mode}")


def test_attaching_to_a_finished_session_replays_its_history_and_is_in_sync(
    browser: Browser, page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    session = start_run(page, demo_server.url, "What is the weather in Rome?")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        late = context.new_page()
        late.goto(demo_server.url + "/")
        expect(late.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
        late.get_by_label("attach to a session id").fill(session)
        late.get_by_role("button", name="Attach").press("Enter")
        expect(late.get_by_role("status", name="Connection")).to_contain_text(
            re.compile(r"history replayed \(\d+ events?\)"), timeout=WAIT_MS
        )
        try:
            expect_complete_run(late, "Rome")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics(late)}") from None
        screenshot(late, artifacts, "attached")
    finally:
        context.close()


def test_a_private_session_is_authorised_with_the_run_token_and_followed(
    browser: Browser, server_factory: ServerFactory
) -> None:
    server = server_factory("--demo", env={"AGENT_DEMO_PRIVATE_SESSIONS": "true"})
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        page = context.new_page()
        start_run(page, server.url, "What is the weather in Nairobi?")
        expect_complete_run(page, "Nairobi")
        session = page.locator("#session-id").inner_text()
        expect(page.locator("#channel-name")).to_have_text(f"private-agent.{session}")
    finally:
        context.close()


def test_a_snapshot_that_differs_from_the_events_is_marked_difference_by_difference(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """The real snapshot is altered in flight (as a server that lost or double-counted
    something would answer): the page lists each difference and marks the step."""

    def altered(route: Route) -> None:
        response = route.fetch()
        snapshot = response.json()
        snapshot["usage"]["total"] += 5
        step_two = next(step for step in snapshot["steps"] if step["step_number"] == 2)
        step_two["tool_calls"] = [{"id": "call_other", "name": "calculator"}]
        route.fulfill(response=response, json=snapshot)

    page.route(re.compile(r"/api/sessions/[^/]+/state$"), altered)
    start_run(page, demo_server.url, "What is the weather in Lima?")
    reconcile = page.locator("#reconcile")
    expect(reconcile).to_have_attribute("data-state", "differs", timeout=WAIT_MS)
    expect(reconcile).to_contain_text("2 differences from the snapshot")
    differences = reconcile.locator("ul.differences > li")
    expect(differences).to_have_count(2)
    expect(differences.filter(has_text="total tokens")).to_have_count(1)
    tool_ids = differences.filter(has_text="step 2: tool call ids")
    expect(tool_ids).to_contain_text("call_calc_1")
    expect(tool_ids).to_contain_text("call_other")
    expect(page.locator("#step-2 .chip.diff")).to_be_visible()
    expect(page.locator("#step-1 .chip.diff")).to_be_hidden()
    screenshot(page, artifacts, "reconcile-differs")


def test_after_a_server_restart_the_page_reconnects_and_says_history_was_not_recovered(
    page: Page, server_factory: ServerFactory
) -> None:
    """A restarted in-memory server has lost the channel's history (a new epoch): the
    page reconnects by itself, shows that the gap could not be filled, and keeps what it
    had built."""
    port = str(free_port())
    first = server_factory("--demo", "--port", port)
    start_run(page, first.url, "What is the weather in Cairo?")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    first.stop()
    connection = page.get_by_role("status", name="Connection")
    expect(connection).not_to_contain_text("Live", timeout=WAIT_MS)
    server_factory("--demo", "--port", port)
    expect(connection).to_contain_text("Live", timeout=WAIT_MS)
    expect(connection).to_contain_text("history not recovered", timeout=WAIT_MS)
    # The restarted server has no snapshot of that run either; the page says so.
    expect(page.locator("#history-text")).to_contain_text("no snapshot", timeout=WAIT_MS)
    expect(page.locator("#timeline > li.step")).to_have_count(STEPS)
    expect(page.get_by_label("Run status")).to_have_text("completed")


# --- a session's second run ------------------------------------------------------------
# A session runs one run at a time; its step numbers and the stored snapshot count on
# across its runs. The page keeps the runs apart: it shows the latest run alone (its
# steps 4-6) and lists the earlier one, which opens to its own steps 1-3. The page has
# no control to continue a session, so the second run is started through POST /run
# with the session id, as another client would.


def continue_session(url: str, session: str, question: str, pace: str = "40") -> None:
    """Start another run of ``session`` through ``POST /run``, as another client would."""
    body = {"input": question, "session_id": session, "pace_ms": int(pace)}
    response = httpx.post(f"{url}/run", json=body, timeout=10)
    assert response.status_code == 202, response.text
    assert response.json()["session_id"] == session


def expect_run_steps(page: Page, first: int) -> None:
    """The timeline shows one run of the scripted agent: steps ``first`` to ``first + 2``
    and nothing of any other run."""
    numbers = [str(n) for n in range(first, first + STEPS)]
    expect(page.locator("#timeline > li.step")).to_have_count(STEPS, timeout=WAIT_MS)
    expect(page.locator("#timeline .step-number")).to_have_text(numbers)
    for number, ids in TOOL_CALLS.items():
        step = page.locator(f"#step-{first - 1 + number}")
        expect(step).to_have_attribute("data-state", "done")
        expect(step.locator("li.tool")).to_have_count(len(ids))
        for call_id in ids:
            expect(step.locator(f'li.tool[data-tool-call-id="{call_id}"]')).to_be_visible()
    expect(page.locator(f"#step-{first + STEPS - 1} .finish")).to_have_text("stop")
    expect(page.locator("#total-steps")).to_have_text(str(STEPS))


def expect_second_run(page: Page, first_city: str | None, city: str) -> None:
    """The page shows the session's second run alone: its steps 4-6 (numbered on after
    the first run's 1-3), its answer, its totals, in sync with the session's snapshot.
    The first run is listed apart when the page saw its events (``first_city``), and
    opens to its own steps 1-3; None: its events were gone, the second run's steps were
    filled from the snapshot."""
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect_run_steps(page, STEPS + 1)
    expect(page.locator("#answer")).to_contain_text(f"In {city} it is")
    reconcile = page.locator("#reconcile")
    expect(reconcile).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    expect(page.get_by_role("status").filter(has_text="In sync")).to_be_visible()
    expect(reconcile.locator("ul.differences > li")).to_have_count(0)
    expect(page.locator(".step .chip.diff:visible")).to_have_count(0)
    facts = page.locator("#run-facts")
    expect(facts).to_have_attribute("data-status", "completed")
    expect(facts).to_have_attribute("data-steps", str(STEPS))
    if not first_city:
        return
    # The events give the tools' arguments (the snapshot's steps do not).
    expect(page.locator(f"#step-{STEPS + 1} .tool-args")).to_contain_text(city)
    runs = page.get_by_role("list", name="Runs of this session").locator("> li")
    expect(runs).to_have_count(2)
    latest, earlier = runs.nth(0), runs.nth(1)
    expect(latest.get_by_role("button")).to_have_attribute("aria-current", "true")
    expect(earlier).to_have_attribute("data-status", "completed")
    second_id = facts.get_attribute("data-execution-id")
    earlier.get_by_role("button").click()
    expect(facts).not_to_have_attribute("data-execution-id", second_id or "")
    expect_run_steps(page, 1)
    expect(page.locator("#step-1 .tool-args")).to_contain_text(first_city)
    expect(page.locator("#answer")).to_contain_text(f"In {first_city} it is")
    page.get_by_role("button", name="Follow the latest run").click()
    expect(facts).to_have_attribute("data-execution-id", second_id or "")
    expect_run_steps(page, STEPS + 1)


def test_a_page_following_a_session_shows_its_second_run_numbered_on_and_in_sync(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """The page that ran the first question stays on the session's channel while a
    second run of the session starts: the page switches to it as it starts (its steps
    4, 5, 6 alone; the first run moves to the list, with its own verdict); while it
    runs, the first run's verdict is not shown as its own and its clock runs; at its end
    the page is in sync."""
    session = start_run(page, demo_server.url, "What is the weather in Lisbon?")
    expect_complete_run(page, "Lisbon")
    first_run_time = page.locator("#total-time").inner_text()
    continue_session(demo_server.url, session, "And what is the weather in Oslo?", pace="150")
    expect(page.locator(f"#step-{STEPS + 1} .step-text")).to_contain_text("Let me", timeout=WAIT_MS)
    expect(page.locator("#step-1")).to_have_count(0)
    status = page.get_by_label("Run status")
    expect(status).to_have_text("in progress")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "waiting")
    earlier = page.get_by_role("list", name="Runs of this session").locator("> li").nth(1)
    expect(earlier).to_have_attribute("data-reconcile", "in_sync")
    # Two more seconds of paced text to go: the summary's clock ticks (every 0.5 s).
    expect(page.locator("#total-time")).not_to_have_text(first_run_time)
    expect(status).to_have_text("in progress")
    try:
        expect_second_run(page, "Lisbon", "Oslo")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(page)}") from None
    screenshot(page, artifacts, "second-run-live")


def test_a_late_snapshot_answer_about_the_first_run_does_not_overwrite_the_second_runs(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """The snapshot fetched when the first run ended answers only after the second run
    ended in sync (held here, as a slow network would): the page drops that stale answer
    instead of listing the first run's snapshot as differences."""
    held: list[tuple[Route, APIResponse]] = []

    def hold_the_first(route: Route) -> None:
        if held:
            route.continue_()
        else:
            held.append((route, route.fetch()))

    page.route(STATE_URL, hold_the_first)
    session = start_run(page, demo_server.url, "What is the weather in Lisbon?")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "checking")
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)  # lets playwright run the route handler
    assert held, "the page did not ask for the first run's snapshot"
    continue_session(demo_server.url, session, "And what is the weather in Oslo?")
    expect_second_run(page, "Lisbon", "Oslo")

    route, first_snapshot = held[0]
    assert first_snapshot.json()["step_count"] == STEPS
    with page.expect_response(STATE_URL):
        route.fulfill(response=first_snapshot)
    # A dropped answer leaves nothing to wait for: give its handler time to run.
    page.wait_for_timeout(300)
    expect_second_run(page, "Lisbon", "Oslo")
    screenshot(page, artifacts, "second-run-stale-snapshot-dropped")


def test_attaching_after_a_sessions_second_run_replays_both_runs_and_is_in_sync(
    browser: Browser, page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """A page attaching by session id once the second run has started replays both runs
    (two final statuses, hence two reconciles) and ends in sync with the session."""
    session = start_run(page, demo_server.url, "What is the weather in Lisbon?")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    continue_session(demo_server.url, session, "And what is the weather in Oslo?")

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        late = context.new_page()
        late.goto(demo_server.url + "/")
        expect(late.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
        late.get_by_label("attach to a session id").fill(session)
        late.get_by_role("button", name="Attach").click()
        expect(late.get_by_role("status", name="Connection")).to_contain_text(
            re.compile(r"history replayed \(\d+ events?\)"), timeout=WAIT_MS
        )
        try:
            expect_second_run(late, "Lisbon", "Oslo")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics(late)}") from None
        screenshot(late, artifacts, "second-run-attached")
    finally:
        context.close()


def test_a_second_run_whose_first_run_left_the_history_is_filled_and_in_sync(
    browser: Browser, page: Page, server_factory: ServerFactory, artifacts: Path
) -> None:
    """With a short channel history the first run's events are gone when a page attaches
    after the second run: it fills steps 4-6 from the snapshot and, comparing the
    session's totals, is in sync."""
    server = server_factory("--demo", "--history-size", "8")
    session = start_run(page, server.url, "What is the weather in Lisbon?")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    continue_session(server.url, session, "And what is the weather in Oslo?")
    expect_second_run(page, "Lisbon", "Oslo")

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        late = context.new_page()
        late.goto(f"{server.url}/#session={session}")
        expect(late.locator("#history-text")).to_contain_text(
            "filled from the snapshot", timeout=WAIT_MS
        )
        try:
            expect_second_run(late, None, "Oslo")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics(late)}") from None
        expect(late.locator(f"#step-{STEPS + 1} .chip.snapshot")).to_be_visible()
        screenshot(late, artifacts, "second-run-from-snapshot")
    finally:
        context.close()


WATCH_CONNECTION = """() => {
  window.watched = {states: [], errors: []};
  const connection = window.dashboard.pusher.connection;
  connection.bind("state_change", ({current}) => window.watched.states.push(current));
  connection.bind("error", (e) => window.watched.errors.push(e?.data?.code ?? null));
}"""


def _wait_until(page: Page, condition: str, what: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while not page.evaluate(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {diagnostics(page)}")
        page.wait_for_timeout(50)


@pytest.mark.redis
def test_the_page_resumes_after_its_history_read_failed_while_redis_was_frozen(
    page: Page, server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    """The page reconnects while Redis does not answer: its resume's history read times
    out and the server closes with 4100 (not a silent unsubscribe); pusher-js retries
    by itself, and once Redis answers the page resumes (recovered) and is live again."""
    redis = redis_factory()
    server = server_factory(
        "--demo", "--backend", redis.url, "--history-read-timeout", "1", "--log-level", "warning"
    )
    proxy = CuttableProxy(int(server.url.rsplit(":", 1)[1]))
    try:
        start_run(page, proxy.url, "What is the weather in Lima?")
        expect(page.locator("#reconcile")).to_have_attribute(
            "data-state", "in_sync", timeout=WAIT_MS
        )
        resumes_before = len(page.evaluate("window.dashboard.resumes"))
        page.evaluate(WATCH_CONNECTION)
        connection = page.get_by_role("status", name="Connection")
        assert redis.proc is not None
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            assert proxy.cut() > 0
            _wait_until(page, "window.watched.errors.includes(4100)", "a 4100 from the server")
            assert len(page.evaluate("window.dashboard.resumes")) == resumes_before
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        expect(connection).to_contain_text("Live", timeout=WAIT_MS)
        expect(connection).to_contain_text(re.compile(r"history recovered"), timeout=WAIT_MS)
        # Reconnected after the cut, and again (by itself) after the 4100.
        assert page.evaluate("window.watched.states").count("connecting") >= 2
        resumes = page.evaluate("window.dashboard.resumes")
        assert resumes[-1]["recovered"], diagnostics(page)
        assert not resumes[-1]["initial"], diagnostics(page)
        expect(page.locator("#timeline > li.step")).to_have_count(STEPS)
        expect(page.get_by_label("Run status")).to_have_text("completed")
    finally:
        proxy.close()
