"""The sessions page and the run page in a real browser (Debian's chromium via
playwright), on a real demo server and its real run index (``GET /api/sessions``,
``/api/sessions/{id}/runs``, ``/api/sessions/{id}/trace``).

The runs are real: started through ``POST /run`` on the demo server (an agent run, a
routed run, a run failed by ``[fail:tool]`` at a low ``max_steps``, two runs on one
session; a private session on a server with private sessions). The few tests that need
a run of exact content (2,000 envelopes, hostile text, the golden run's timings) publish
recorded envelopes through the signed HTTP API and store the run's state, which is how
the real index records an outside agent's run (``recorded.py``). The list and run pages
are also read on a Redis-backed server.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Response, expect

from tests.e2e.frontend.recorded import golden_records, long_run, publish_run, renamed, trace_of
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 20_000
LISBON = "What is the weather in Lisbon?"


@dataclass(frozen=True)
class Run:
    """A run as the server's index has it: its summary and its trace's records."""

    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def session_id(self) -> str:
        return str(self.summary["session_id"])

    @property
    def execution_id(self) -> str:
        return str(self.summary["execution_id"])


def start_run(url: str, question: str, **options: Any) -> dict[str, Any]:
    """Start a real run with ``POST /run`` (``wait``: answered when it ends)."""
    response = httpx.post(f"{url}/run", json={"input": question, **options}, timeout=30)
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


def indexed(url: str, session_id: str, execution_id: str, **params: str) -> Run:
    trace = trace_of(url, session_id, execution_id, **params)
    return Run(trace["summary"], trace["envelopes"])


def ran(url: str, question: str, **options: Any) -> Run:
    """A real run to its end, as the index has it."""
    answer = start_run(url, question, wait=True, **options)
    assert answer["waited"] is True, answer
    return indexed(url, answer["session_id"], answer["execution_id"])


def listed(url: str, **params: str) -> list[dict[str, Any]]:
    """Every run the list shows a stranger, newest first."""
    answer = httpx.get(f"{url}/api/sessions", params={"limit": "200", **params}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["next_cursor"] is None
    return list(answer.json()["runs"])


@pytest.fixture(scope="module")
def demo() -> Iterator[ServerProcess]:
    """One real demo server for the module: it serves the pages, the client kit, the
    runs and their index (history long enough for a 2,000-envelope run)."""
    server = ServerProcess(["--demo", "--history-size", "5000"]).start()
    yield server
    server.stop()


@dataclass(frozen=True)
class Runs:
    completed: Run
    failed: Run
    routed: Run
    first: Run  # the two runs of one session
    second: Run
    golden: Run  # the golden ``completed`` run, published as recorded (its timings)


@pytest.fixture(scope="module")
def runs(demo: ServerProcess) -> Runs:
    """Real runs on the demo server, and the golden run published as recorded."""
    golden = publish_run(demo.url, golden_records("completed")[0], "What is the weather in Oslo?")
    completed = ran(demo.url, LISBON)
    failed = ran(demo.url, "[fail:tool] What is the weather in Porto?", max_steps=2)
    routed = ran(demo.url, "What is the weather in Oslo? And 3*7?", mode="route")
    first = ran(demo.url, f"[fail:model] {LISBON}", max_steps=2)
    second = ran(demo.url, LISBON, session_id=first.session_id)
    return Runs(
        completed,
        failed,
        routed,
        first,
        second,
        Run(golden["summary"], golden["envelopes"]),
    )


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    yield context
    context.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    assert not errors, f"JavaScript errors on the page: {errors}"


def answers(page: Page) -> list[tuple[str, int]]:
    """The (path?query, status) of every index request the page makes from now on, as
    the browser received the answers."""
    seen: list[tuple[str, int]] = []

    def note(response: Response) -> None:
        path = response.url.split("://", 1)[-1]
        path = "/" + path.split("/", 1)[1] if "/" in path else "/"
        if path.startswith("/api/sessions"):
            seen.append((path, response.status))

    page.on("response", note)
    return seen


def screenshot(page: Page, folder: Path, name: str) -> None:
    """Save the whole page at 1280 px and at 390 px wide as artifacts."""
    page.screenshot(path=folder / f"{name}-1280.png", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=folder / f"{name}-390.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def open_sessions(page: Page, demo: ServerProcess, query: str = "") -> None:
    page.goto(f"{demo.url}/demo/sessions.html{query}")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)


def rows(page: Page) -> Any:
    return page.locator("#sessions tbody tr")


def open_run(
    page: Page, demo: ServerProcess, session: str, execution: str = "", extra: str = ""
) -> None:
    query = f"?session={session}" + (f"&execution={execution}" if execution else "") + extra
    page.goto(f"{demo.url}/demo/run.html{query}")
    expect(page.locator("body")).to_have_attribute(
        "data-rendered", re.compile("x-"), timeout=WAIT_MS
    )


# --- the sessions page ---------------------------------------------------------------------


def test_the_sessions_page_lists_runs_newest_first_with_badges_duration_and_tokens(
    page: Page, demo: ServerProcess, runs: Runs, artifacts: Path
) -> None:
    open_sessions(page, demo)
    public = listed(demo.url)
    assert len(public) >= 6
    expect(rows(page)).to_have_count(len(public), timeout=WAIT_MS)
    executions = rows(page).evaluate_all("rows => rows.map(row => row.dataset.executionId)")
    assert executions == [s["execution_id"] for s in public]
    starts = [s["started_at"] for s in public]
    assert starts == sorted(starts, reverse=True)
    failed = runs.failed.summary
    assert failed["status"] == "failed"
    row = page.locator(f'tr[data-execution-id="{failed["execution_id"]}"]')
    expect(row.locator(".badge")).to_have_text("failed")
    expect(row.locator(".badge")).to_have_attribute("data-status", "failed")
    cells = row.locator("td")
    expect(cells.nth(3)).to_contain_text("[fail:tool]")
    expect(cells.nth(5)).to_have_text(re.compile(r"^\d+ ms$"))
    expect(cells.nth(6)).to_have_text(str(failed["steps"]))
    expect(cells.nth(8)).to_have_text(str(failed["tokens"]["total"]))
    expect(cells.nth(10)).to_have_text("ErrorPolicyCriterion")
    screenshot(page, artifacts, "sessions")


def test_a_private_session_is_not_listed_and_its_run_page_is_refused_without_the_token(
    page: Page,
) -> None:
    """A demo server with private sessions: a real run on a private session (its token
    from ``POST /run``) next to a public run an outside agent published."""
    server = ServerProcess(["--demo"], env={"AGENT_DEMO_PRIVATE_SESSIONS": "true"}).start()
    try:
        records = renamed(golden_records("completed")[0], "s-public-neighbour")
        publish_run(server.url, records, "a public question")
        private = start_run(server.url, f"a private question: {LISBON}", wait=True)
        session, token = private["session_id"], private["auth"]["token"]
        assert private["channel"] == f"private-agent.{session}"
        seen = answers(page)
        open_sessions(page, server)
        expect(rows(page)).to_have_count(1, timeout=WAIT_MS)
        expect(rows(page).first).to_have_attribute("data-session-id", "s-public-neighbour")
        expect(page.locator(f'tr[data-session-id="{session}"]')).to_have_count(0)
        expect(page.locator("#sessions")).not_to_contain_text("a private question")
        # Nor found by searching for it.
        page.get_by_label("Search").fill(session)
        page.get_by_role("button", name="Apply").click()
        expect(page.locator("#list-empty")).to_be_visible(timeout=WAIT_MS)
        # Its run page says it is refused; with the token (in the fragment) it opens.
        page.goto(f"{server.url}/demo/run.html?session={session}")
        expect(page.get_by_role("alert")).to_contain_text("private", timeout=WAIT_MS)
        expect(page.get_by_role("alert")).to_contain_text("403")
        page.goto(f"{server.url}/demo/run.html?session={session}#token={token}")
        page.reload()
        expect(page.locator("#run-status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("#execution-id")).to_have_text(private["execution_id"])
        assert any(
            path.startswith(f"/api/sessions/{session}/runs") and status == 403
            for path, status in seen
        ), seen
        assert any(
            path.startswith(f"/api/sessions/{session}/runs") and status == 200
            for path, status in seen
        ), seen
    finally:
        server.stop()


def test_the_filters_and_search_narrow_the_list_and_bad_input_is_reported(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    seen = answers(page)
    open_sessions(page, demo)
    expect(rows(page).first).to_be_visible(timeout=WAIT_MS)
    page.get_by_label("Status").select_option("failed")
    failed = listed(demo.url, status="failed")
    assert {s["execution_id"] for s in failed} >= {runs.failed.execution_id}
    expect(rows(page)).to_have_count(len(failed), timeout=WAIT_MS)
    for badge in page.locator("#sessions tbody .badge").all():
        expect(badge).to_have_text("failed")
    page.get_by_label("Status").select_option("")
    page.get_by_label("Resolved by").fill("ContinuationDecider")
    page.get_by_role("button", name="Apply").click()
    expect(rows(page)).to_have_count(1, timeout=WAIT_MS)
    expect(rows(page).first).to_have_attribute("data-execution-id", runs.routed.execution_id)
    page.get_by_role("button", name="Clear").click()
    page.get_by_label("Search").fill("[FAIL:")
    page.get_by_role("button", name="Apply").click()
    expect(rows(page)).to_have_count(2, timeout=WAIT_MS)  # [fail:tool], [fail:model]
    found = rows(page).evaluate_all("rows => rows.map(row => row.dataset.executionId)")
    assert set(found) == {runs.failed.execution_id, runs.first.execution_id}
    assert "q=%5BFAIL%3A" in page.url
    # A time range after every run leaves nothing; the server answered the query.
    page.get_by_label("From").fill("2099-01-01T00:00:00")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#list-empty")).to_be_visible(timeout=WAIT_MS)
    assert any("from=" in path and status == 200 for path, status in seen), seen
    # A 400 from the server is shown with its message.
    page.goto(f"{demo.url}/demo/sessions.html?status=bogus")
    expect(page.locator("#list-error")).to_contain_text("status must be one of", timeout=WAIT_MS)


def test_the_list_updates_live_as_a_run_starts_and_ends_and_idle_polls_are_304(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    seen = answers(page)
    open_sessions(page, demo)
    expect(rows(page)).to_have_count(len(listed(demo.url)), timeout=WAIT_MS)
    # An idle poll is answered 304 (If-None-Match with the ETag of the last answer).
    page.wait_for_function("window.sessionsPage.notModified >= 1", timeout=WAIT_MS)
    # A real run, paced to last a few polls (about 7 s: some 27 deltas, 250 ms apart).
    started = start_run(demo.url, "What is the weather in Bergen?", pace_ms=250)
    row = page.locator(f'tr[data-session-id="{started["session_id"]}"]')
    expect(row.locator(".badge")).to_have_text("running", timeout=WAIT_MS)
    expect(row.locator(".badge")).to_have_text("completed", timeout=WAIT_MS)
    expect(row.locator("td").nth(6)).not_to_have_text("0")
    expect(row.locator(".preview")).to_have_text("What is the weather in Bergen?")
    # The poll went on sending the ETag it got.
    assert any(status == 304 for _, status in seen), seen


def test_a_row_opens_the_run_page_of_that_run(page: Page, demo: ServerProcess, runs: Runs) -> None:
    open_sessions(page, demo)
    routed = runs.routed.summary
    page.locator(f'tr[data-execution-id="{routed["execution_id"]}"] td').nth(3).click()
    expect(page).to_have_url(re.compile(r"/demo/run\.html\?session=.*execution="), timeout=WAIT_MS)
    expect(page.locator("#execution-id")).to_have_text(routed["execution_id"], timeout=WAIT_MS)
    expect(page.locator("#run-status")).to_have_text("completed")


# --- the run page ----------------------------------------------------------------------------


def test_two_runs_on_one_session_are_shown_apart_each_with_its_own_totals(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    first, second = runs.first, runs.second
    assert (first.summary["steps"], second.summary["steps"]) == (2, 3)
    open_run(page, demo, first.session_id)
    items = page.locator("#run-list > li")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_contain_text("failed")
    expect(items.nth(0)).to_contain_text("2 steps")
    expect(items.nth(1)).to_contain_text("completed")
    expect(items.nth(1)).to_contain_text("3 steps")
    # The run boundaries, as channel positions: the first run's, then the second's.
    for item, run in ((items.nth(0), first), (items.nth(1), second)):
        bounds = f"positions {run.records[0]['position']} \u2013 {run.records[-1]['position']}"
        assert run.summary["first_position"] == run.records[0]["position"]
        expect(item.locator(".run-positions")).to_have_text(bounds)
    # The latest run is shown: only its own steps (3, 4, 5) and totals.
    expect(page.locator("#execution-id")).to_have_text(second.execution_id)
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-steps")).to_have_text("3")
    expect(page.locator("#run-tokens")).to_have_text(str(second.summary["tokens"]["total"]))
    steps = page.locator('#waterfall li[data-kind="step"] .span-name')
    expect(steps).to_have_text(["Step 3", "Step 4", "Step 5"])
    expect(page.locator("#run-envelopes")).to_have_text(str(len(second.records)))
    # The first run, chosen in the selector: its two steps, failed, with its error.
    items.nth(0).get_by_role("button").click()
    expect(page.locator("#execution-id")).to_have_text(first.execution_id)
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(steps).to_have_text(["Step 1", "Step 2"])
    expect(page.locator("#run-steps")).to_have_text("2")
    expect(page.locator("#run-error")).to_be_visible()
    expect(page.locator("#run-tokens")).to_have_text(str(first.summary["tokens"]["total"]))
    assert f"execution={first.execution_id}" in page.url


def test_the_waterfall_puts_steps_model_and_tool_calls_on_one_time_axis(
    page: Page, demo: ServerProcess, runs: Runs, artifacts: Path
) -> None:
    run = runs.golden  # recorded: its timings are known
    open_run(page, demo, run.session_id)
    waterfall = page.locator("#waterfall")
    kinds = waterfall.locator("li").evaluate_all("rows => rows.map(r => r.dataset.kind)")
    assert kinds == ["step", "model", "tool", "step", "model", "tool", "step", "model"], kinds
    tool = waterfall.locator('li[data-tool-call-id="call_weather_1"]')
    expect(tool.locator(".span-name")).to_have_text("get_weather")
    expect(tool).to_have_attribute("data-depth", "1")
    # Start offsets come from the envelope timestamps: step 3 starts 98 ms after the run.
    step3 = waterfall.locator('li[data-kind="step"][data-step="3"]')
    expect(step3.locator(".span-time")).to_have_text(re.compile(r"^\+98 ms · 72 ms$"))
    left = step3.locator(".span-bar").evaluate("bar => parseFloat(bar.style.left)")
    assert 50 < left < 60, left  # 98 of 171 ms
    expect(page.locator("#waterfall-scale")).to_have_text("0 \u2013 171 ms")
    page.locator("#inspector .envelope-line").nth(4).click()
    screenshot(page, artifacts, "run-page")


def test_a_routed_capabilitys_work_is_nested_under_its_call(
    page: Page, demo: ServerProcess, runs: Runs, artifacts: Path
) -> None:
    run = runs.routed
    assert run.summary["capability"] == "weather_agent"
    open_run(page, demo, run.session_id)
    rows_ = page.locator("#waterfall li")
    found = rows_.evaluate_all(
        "rows => rows.map(r => [r.dataset.kind, r.dataset.depth,"
        " r.querySelector('.span-name').textContent])"
    )
    assert found == [
        ["step", "0", "Step 1"],
        ["stage", "1", "intent_classifier"],
        ["capability", "1", "weather_agent"],
        # The capability's inner agent, a run nested under the call: its own steps.
        ["step", "2", "Step 1"],
        ["model", "3", "model call"],
        ["tool", "3", "get_weather"],
        ["step", "2", "Step 2"],
        ["model", "3", "model call"],
        ["tool", "3", "calculator"],
        ["step", "2", "Step 3"],
        ["model", "3", "model call"],
        ["stage", "2", "continuation_decider"],
        ["stage", "1", "session_memory"],  # after the step: the exchange remembered
    ], found
    capability = page.locator('#waterfall li[data-kind="capability"]')
    expect(capability.locator(".span-detail")).to_contain_text("In Oslo it is cloudy")
    # The nested run is the inner agent's (its own execution id), not listed as a run.
    inner = {e["envelope"]["execution_id"] for e in run.records} - {run.execution_id}
    assert len(inner) == 1, inner
    nested = page.locator(f'#waterfall li[data-kind="step"][data-nested="{inner.pop()}"]')
    expect(nested).to_have_count(3)
    expect(page.locator("#run-list > li")).to_have_count(1)
    expect(page.locator("#run-steps")).to_have_text("1")  # the routed run's own step
    assert run.summary["steps"] == 1
    # One tool call, the capability's; the classifier, decider and memory are phases.
    assert (run.summary["tool_calls"], run.summary["routing_phases"]) == (1, 3)
    # In the inspector the inner agent's envelopes are in the step of the call they serve.
    steps = page.locator("#filter-step option").evaluate_all("options => options.map(o => o.value)")
    assert steps == ["", "1"], steps
    page.locator("#filter-step").select_option("1")
    own_status = [r for r in run.records if r["envelope"]["type"] == "agent.status"]
    own_status = [r for r in own_status if "parent_execution_id" not in r["envelope"]["payload"]]
    expect(page.locator("#inspector > li")).to_have_count(len(run.records) - len(own_status))
    screenshot(page, artifacts, "run-page-routed")


def test_a_nested_runs_continuation_decisions_are_shown_under_the_call_that_ran_it(
    page: Page, demo: ServerProcess, runs: Runs, artifacts: Path
) -> None:
    """The capability's inner agent decided after each of its steps: those decisions
    are in the routed step's block, under the capability's call, collapsible."""
    run = runs.routed
    open_run(page, demo, run.session_id)
    inner = {e["envelope"]["execution_id"] for e in run.records} - {run.execution_id}
    [call] = [
        e["envelope"]["payload"]["tool_call_id"]
        for e in run.records
        if e["envelope"]["type"] == "agent.tool.started"
        and e["envelope"]["payload"]["tool_name"] == "weather_agent"
    ]
    outer = page.locator('#continuations > article[data-step="1"]')
    expect(outer).to_have_attribute("data-outcome", "completed", timeout=WAIT_MS)
    expect(outer.locator("> h3")).to_have_text("Step 1: stop (completed)")
    nested = outer.locator(f'details.nested-decisions[data-execution-id="{inner.pop()}"]')
    expect(nested).to_have_attribute("data-parent-tool-call-id", call)
    expect(nested).to_have_attribute("data-parent-execution-id", run.execution_id)
    expect(nested).to_have_attribute("data-status", "completed")
    summary = nested.locator("> summary")
    expect(summary).to_contain_text(f"weather_agent ({call}) ran")
    expect(summary).to_contain_text("3 continuation decisions")
    blocks = nested.locator("> .continuations > article.cont-block")
    expect(blocks).to_have_count(3)
    expect(blocks.locator("> h3")).to_have_text(
        ["Step 1: continue", "Step 2: continue", "Step 3: stop (completed)"]
    )
    expect(blocks.nth(2)).to_have_attribute("data-outcome", "completed")
    expect(blocks.nth(0).locator(".why-winner dd")).to_have_text("ToolCallPresenceCheck")
    expect(blocks.nth(0).locator("tbody tr").first).to_be_visible()
    screenshot(page, artifacts, "run-page-nested-decisions")
    summary.click()  # collapsed
    expect(blocks.first).to_be_hidden()
    summary.click()
    expect(blocks.first).to_be_visible()


def test_the_continuation_panel_says_who_forbade_requested_won_and_by_which_rule(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    run = runs.failed
    open_run(page, demo, run.session_id)
    step1 = page.locator('#continuations article[data-step="1"]')
    expect(step1.locator(".why-forbade dd")).to_have_text("none")
    expect(step1.locator(".why-requested dd")).to_have_text("ToolCallPresenceCheck")
    expect(step1.locator(".why-winner dd")).to_have_text("ToolCallPresenceCheck")
    expect(step1.locator(".why-rule dd")).to_contain_text("request beats stop")
    step2 = page.locator('#continuations article[data-step="2"]')
    expect(step2).to_have_attribute("data-decision", "stop")
    expect(step2.locator(".why-forbade dd")).to_have_text("StepsLimit, ErrorPolicyCriterion")
    expect(step2.locator(".why-winner dd")).to_have_text("ErrorPolicyCriterion")
    expect(step2.locator(".why-rule dd")).to_contain_text("errors win")
    expect(step2.locator("tr.winner td").first).to_have_text("ErrorPolicyCriterion")


def test_the_inspector_shows_every_envelope_filters_expands_and_copies(
    page: Page, context: BrowserContext, demo: ServerProcess, runs: Runs
) -> None:
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    run = runs.completed
    envelopes_of = [r["envelope"] for r in run.records]
    open_run(page, demo, run.session_id)
    envelopes = page.locator("#inspector > li")
    expect(envelopes).to_have_count(len(run.records))
    first = envelopes.first
    expect(first.locator(".envelope-position")).to_have_text(run.records[0]["position"])
    expect(first.locator(".envelope-type")).to_have_text("agent.status")
    page.locator("#filter-type").select_option("agent.tool.completed")
    expect(envelopes).to_have_count(2)  # the weather, then the calculator
    page.locator("#filter-type").select_option("")
    page.locator("#filter-step").select_option("3")
    in_step3 = [e for e in envelopes_of if e["payload"].get("step_number") == 3]
    assert in_step3[0]["type"] == "agent.step.started"
    expect(envelopes).to_have_count(len(in_step3))
    page.locator("#filter-step").select_option("")
    calculator = next(
        e["payload"]["tool_call_id"]
        for e in envelopes_of
        if e["type"] == "agent.tool.started" and e["payload"]["tool_name"] == "calculator"
    )
    page.locator("#filter-tool").select_option(calculator)
    expect(envelopes).to_have_count(2)
    line = envelopes.first.locator(".envelope-line")
    line.click()
    expect(line).to_have_attribute("aria-expanded", "true")
    shown = json.loads(envelopes.first.locator("pre").inner_text())
    started = next(e for e in envelopes_of if e["payload"].get("tool_call_id") == calculator)
    assert started["type"] == "agent.tool.started"
    assert shown == started
    envelopes.first.get_by_role("button", name="Copy").click()
    expect(envelopes.first.get_by_role("button", name="Copied")).to_be_visible()
    assert json.loads(page.evaluate("navigator.clipboard.readText()")) == started


def test_a_run_of_2000_envelopes_is_paginated_with_none_left_out(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    trace = publish_run(demo.url, unique(long_run(2000, "s-long-inspector")), "a long run")
    run = Run(trace["summary"], trace["envelopes"])
    assert len(run.records) == 2000
    assert trace["trimmed"] is False
    open_run(page, demo, run.session_id)
    expect(page.locator("#inspector-count")).to_have_text("2,000 envelopes")
    expect(page.locator("#inspector > li")).to_have_count(100)
    expect(page.locator("#page-info")).to_have_text("page 1 of 20")
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#page-info")).to_have_text("page 2 of 20")
    expect(page.locator("#inspector .envelope-index").first).to_have_text("#101")
    page.get_by_role("button", name="Last").click()
    expect(page.locator("#page-info")).to_have_text("page 20 of 20")
    last = page.locator("#inspector > li").last
    expect(last.locator(".envelope-index")).to_have_text("#2000")
    expect(last.locator(".envelope-position")).to_have_text(run.records[-1]["position"])
    expect(page.get_by_role("button", name="Next")).to_be_disabled()
    page.get_by_role("button", name="Previous").click()
    expect(page.locator("#inspector .envelope-index").first).to_have_text("#1801")
    # Filters apply to all 2,000: one agent.status at each end.
    page.locator("#filter-type").select_option("agent.status")
    expect(page.locator("#inspector > li")).to_have_count(2)
    expect(page.locator("#inspector .envelope-index")).to_have_text(["#1", "#2000"])
    expect(page.locator("#page-info")).to_have_text("page 1 of 1")
    expect(page.locator('#waterfall li[data-kind="step"]')).to_have_count(run.summary["steps"])


def unique(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records under an execution id of their own (published runs are made from the
    golden run, whose id is the same)."""
    execution = f"x-{uuid.uuid4().hex[:16]}"
    return [
        {"position": r["position"], "envelope": {**r["envelope"], "execution_id": execution}}
        for r in records
    ]


def test_model_and_tool_text_is_shown_as_text_never_as_html(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    records, _ = golden_records("completed")
    hostile = '<img src=x onerror="window.__xss=1">'
    tampered = []
    for record in unique(renamed(records, "s-hostile")):
        envelope = json.loads(json.dumps(record["envelope"]))
        payload = envelope["payload"]
        for key in ("chunk", "result_summary", "args_summary", "reason", "error_message"):
            if isinstance(payload.get(key), str):
                payload[key] = hostile
        for evaluation in payload.get("evaluations", []):
            evaluation["reason"] = hostile
        tampered.append({"position": record["position"], "envelope": envelope})
    publish_run(demo.url, tampered, hostile)
    open_sessions(page, demo)
    expect(page.locator('tr[data-session-id="s-hostile"] .preview')).to_have_text(hostile)
    open_run(page, demo, "s-hostile")
    page.locator("#inspector .envelope-line").nth(2).click()
    expect(page.locator("#inspector pre")).to_contain_text(hostile.replace('"', '\\"'))
    expect(page.locator("#continuations td").filter(has_text=hostile).first).to_be_visible()
    expect(page.locator("#waterfall .span-detail").filter(has_text=hostile).first).to_be_visible()
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__xss") is None


SHARED_OBJECTS = """() => Object.fromEntries(
  [["Object", Object], ["Object.prototype", Object.prototype], ["Function", Function],
   ["Function.prototype", Function.prototype], ["Array.prototype", Array.prototype]]
  .map(([name, object]) => [name, Object.getOwnPropertyNames(object).sort().join(",")]))"""


@pytest.mark.parametrize("key", ["__proto__", "constructor", "prototype"])
def test_prototype_keys_in_a_nested_run_set_nothing_on_the_pages_objects(
    page: Page, demo: ServerProcess, key: str
) -> None:
    """The golden routed run with its capability call, the nested run's execution id and
    the inner tool calls all named ``key``: the run page and the live dashboard (the
    kit's reducer, vendored) show it and leave Object.prototype and the other shared
    objects as they were. Before, ``__proto__`` set properties on Object.prototype."""
    records, _ = golden_records("routed-nested")
    session = f"s-proto-{key.strip('_')}"
    text = json.dumps(renamed(records, session))
    for name in ("cap_c9df1bfa-7bf9-4ee6-a3fe-173b44e47055", "x-0cc87a0432da4967"):
        text = text.replace(name, key)
    text = text.replace("call_weather_1", key).replace("call_calc_1", key)
    text = text.replace("x-ad8563b4ee99e820", f"x-{uuid.uuid4().hex[:16]}")
    publish_run(demo.url, json.loads(text), "What is the weather in Oslo? And 3*7?")
    page.add_init_script(f"window.__sharedBefore = ({SHARED_OBJECTS})();")
    open_run(page, demo, session)
    expect(page.locator(f'#waterfall li[data-kind="step"][data-nested="{key}"]')).to_have_count(3)
    assert page.evaluate(SHARED_OBJECTS) == page.evaluate("window.__sharedBefore")
    assert page.evaluate("({}).status === undefined && ({}).steps === undefined")
    page.goto(f"{demo.url}/#session={session}")
    expect(page.get_by_role("status", name="Connection")).to_contain_text(
        re.compile(r"history replayed"), timeout=WAIT_MS
    )
    expect(page.locator("#status-badge")).to_have_attribute(
        "data-status", "completed", timeout=WAIT_MS
    )
    assert page.evaluate(SHARED_OBJECTS) == page.evaluate("window.__sharedBefore")
    followed = page.evaluate("Object.hasOwn(window.dashboard.view.nested, " + json.dumps(key) + ")")
    assert followed


def test_two_runs_compared_side_by_side_with_the_first_divergence_highlighted(
    page: Page, demo: ServerProcess, runs: Runs, artifacts: Path
) -> None:
    first, second = runs.first, runs.second
    open_run(page, demo, first.session_id, first.execution_id, f"&compare={second.execution_id}")
    table = page.locator("#compare")
    expect(table).to_be_visible()
    expect(table.locator("tbody tr")).to_have_count(3)  # two steps against three
    expect(table.locator("tbody tr").nth(0)).to_contain_text("Steps 1 / 3")
    # The second run's first step read a longer history: the tokens differ first.
    divergent = table.locator("tbody tr.first-divergence")
    expect(divergent).to_have_count(1)
    expect(divergent).to_have_attribute("data-index", "1")
    expect(divergent).to_have_attribute("data-differs", "tokens")
    marked = divergent.locator(".first-divergence")
    expect(marked).to_have_count(2)
    expect(marked.first).to_have_attribute("data-field", "tokens")
    expect(page.locator("#compare-verdict")).to_have_text(
        "First divergence: step #1 of each run, tokens."
    )
    # Then the tool calls: none in the failed run's step 2, the calculator in step 4.
    second_row = table.locator('tbody tr[data-index="2"]')
    expect(second_row).to_have_attribute("data-differs", re.compile("^tools arguments"))
    expect(second_row.locator("td .fact-tools.differs")).to_have_count(2)
    expect(second_row.locator("td").nth(1)).to_contain_text("calculator")
    expect(table.locator('tbody tr[data-index="3"] td').first).to_contain_text("no such step")
    screenshot(page, artifacts, "run-page-compare")
    # The same run on both sides: no divergence.
    page.get_by_label("with run").select_option(first.execution_id)
    expect(page.locator("#compare-verdict")).to_contain_text("Choose another run")
    page.locator("#run-list > li").nth(1).get_by_role("button").click()
    page.get_by_label("with run").select_option(first.execution_id)
    expect(page.locator("#compare-verdict")).to_contain_text("First divergence: step #1")


def test_a_run_is_exported_as_json_and_otlp_from_the_trace_endpoint(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    run = runs.completed
    open_run(page, demo, run.session_id)
    links = {}
    for name in ("JSON", "OTLP"):
        link = page.get_by_role("link", name=name)
        links[name] = (link.get_attribute("href"), link.get_attribute("download"))
    session, execution = run.session_id, run.execution_id
    assert links == {
        "JSON": (
            f"/api/sessions/{session}/trace?execution_id={execution}&format=json",
            f"{session}-{execution}.json",
        ),
        "OTLP": (
            f"/api/sessions/{session}/trace?execution_id={execution}&format=otlp",
            f"{session}-{execution}.otlp.json",
        ),
    }
    # What the links download, fetched by the page itself.
    fetched = page.evaluate(
        """async (hrefs) => Promise.all(hrefs.map(async (href) => {
            const response = await fetch(href);
            return [response.headers.get("Content-Disposition"), await response.json()];
        }))""",
        [links["JSON"][0], links["OTLP"][0]],
    )
    (json_disposition, body), (otlp_disposition, otlp) = fetched
    assert json_disposition == f'attachment; filename="{session}-{execution}.json"'
    assert body["envelopes"] == run.records
    assert [r["envelope"]["type"] for r in run.records][-1] == "agent.status"
    assert otlp_disposition == f'attachment; filename="{session}-{execution}.otlp.json"'
    spans = otlp["resourceSpans"][0]
    names = [span["name"] for scope in spans["scopeSpans"] for span in scope["spans"]]
    assert "execute_tool get_weather" in names, names


# --- the run page following a session's channel ------------------------------------------------


def post_run(url: str, question: str, session: str | None = None, pace: int = 40) -> str:
    body: dict[str, Any] = {"input": question, "pace_ms": pace}
    if session:
        body["session_id"] = session
    response = httpx.post(f"{url}/run", json=body, timeout=10)
    assert response.status_code == 202, response.text
    return str(response.json()["session_id"])


def test_following_the_channel_the_run_page_keeps_two_runs_apart(
    page: Page, demo: ServerProcess
) -> None:
    """Real runs on the real demo server, read from the session's channel
    (``source=live``: history, then live) rather than the index: the page splits the
    runs by execution id and shows the second one as it starts, steps 4-6 apart from the
    first run's 1-3."""
    session = post_run(demo.url, "What is the weather in Lisbon?")
    page.goto(f"{demo.url}/demo/run.html?session={session}&source=live")
    expect(page.locator("#source")).to_have_text("live from the channel", timeout=WAIT_MS)
    expect(page.locator("#run-status")).to_have_text("completed", timeout=WAIT_MS)
    steps = page.locator('#waterfall li[data-kind="step"] .span-name')
    expect(steps).to_have_text(["Step 1", "Step 2", "Step 3"])
    first_execution = page.locator("#execution-id").text_content() or ""
    first_tokens = page.locator("#run-tokens").inner_text()

    post_run(demo.url, "And what is the weather in Oslo?", session=session, pace=150)
    items = page.locator("#run-list > li")
    expect(items).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator("#execution-id")).not_to_have_text(first_execution)
    expect(page.locator("#run-status")).to_have_text("completed", timeout=WAIT_MS)
    expect(steps).to_have_text(["Step 4", "Step 5", "Step 6"])
    expect(page.locator("#run-steps")).to_have_text("3")
    expect(items.nth(0)).to_contain_text("3 steps")
    expect(items.nth(1)).to_contain_text("3 steps")
    expect(page.locator("#inspector .envelope-type").first).to_have_text("agent.status")
    # The first run is still its own: three steps, its own tokens.
    items.nth(0).get_by_role("button").click()
    expect(page.locator("#execution-id")).to_have_text(first_execution)
    expect(steps).to_have_text(["Step 1", "Step 2", "Step 3"])
    expect(page.locator("#run-tokens")).to_have_text(first_tokens)
    # Exported from the envelopes received (the trace endpoint's shape).
    exported = page.evaluate(
        "async () => (await fetch(document.getElementById('export-json').href)).json()"
    )
    assert exported["execution_id"] == first_execution
    assert [r["envelope"]["type"] for r in exported["envelopes"]][-1] == "agent.status"
    assert all(r["envelope"]["execution_id"] == first_execution for r in exported["envelopes"])
    expect(page.get_by_role("link", name="OTLP")).to_be_hidden()  # needs the trace endpoint
    assert f"execution={first_execution}" in page.url
    assert "source=live" in page.url


def test_the_live_page_links_to_its_sessions_runs(page: Page, demo: ServerProcess) -> None:
    page.goto(f"{demo.url}/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("Ask the agent").fill("What is the weather in Lisbon?")
    page.get_by_role("button", name="Start run").click()
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    session = page.locator("#session-id").inner_text().strip()
    page.get_by_role("link", name="Runs of this session").click()
    expect(page).to_have_url(re.compile(rf"/demo/run\.html\?session={session}"))
    # The run is in the index: the page reads it there (not from the channel).
    (summary,) = httpx.get(f"{demo.url}/api/sessions/{session}/runs", timeout=10).json()["runs"]
    expect(page.locator("#execution-id")).to_have_text(summary["execution_id"], timeout=WAIT_MS)
    expect(page.locator("#run-status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#source")).to_be_hidden()
    expect(page.locator("#run-list > li")).to_have_count(1)
    expect(page.locator("#run-steps")).to_have_text(str(summary["steps"]))


def test_two_runs_of_different_sessions_ticked_on_the_list_are_compared(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    completed, later = runs.completed, runs.second  # the same question, alone and second
    open_sessions(page, demo)
    link = page.get_by_role("link", name="Compare the two selected runs")
    page.get_by_label(f"Compare {completed.execution_id}").check()
    expect(link).to_be_hidden()
    page.get_by_label(f"Compare {later.execution_id}").check()
    expect(page).to_have_url(re.compile(r"/demo/sessions\.html"))  # ticking opens nothing
    link.click()
    expect(page).to_have_url(re.compile(rf"compare_session={later.session_id}"), timeout=WAIT_MS)
    expect(page.locator("#execution-id")).to_have_text(completed.execution_id, timeout=WAIT_MS)
    expect(page.locator("#compare-right-head")).to_contain_text(later.session_id)
    expect(page.locator("#compare tbody tr")).to_have_count(3)
    # The same three steps, tool calls and decisions; the later run read a longer history.
    expect(page.locator("#compare-verdict")).to_have_text(
        "First divergence: step #1 of each run, tokens."
    )
    expect(page.locator("#compare tbody tr").first).to_have_attribute("data-differs", "tokens")


def test_a_run_read_while_still_going_offers_to_follow_the_session_live(
    page: Page, demo: ServerProcess, runs: Runs
) -> None:
    going = start_run(demo.url, "What is the weather in Tromso?", pace_ms=400)
    session, execution = going["session_id"], going["execution_id"]
    open_run(page, demo, session)
    expect(page.locator("#execution-id")).to_have_text(execution)
    expect(page.locator("#run-status")).to_have_text("in progress")
    expect(page.locator("#run-running")).to_be_visible()
    href = page.get_by_role("link", name="Follow the session live").get_attribute("href")
    assert href == f"?session={session}&execution={execution}&source=live"
    # A finished run does not offer it.
    open_run(page, demo, runs.completed.session_id)
    expect(page.locator("#run-running")).to_be_hidden()


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_the_list_and_the_run_page_read_the_index_of_each_backend(
    page: Page, backend: str, request: pytest.FixtureRequest
) -> None:
    """A fresh demo server on the backend (memory, or a real Redis), two real runs on
    one session: the list shows both, newest first; the run page shows them apart."""
    args = ["--demo"]
    if backend == "redis":
        redis = request.getfixturevalue("redis_server")
        args += ["--backend", redis.url, "--redis-prefix", f"t{uuid.uuid4().hex[:10]}"]
    server = ServerProcess(args).start()
    try:
        first = ran(server.url, f"[fail:model] {LISBON}", max_steps=2)
        second = ran(server.url, LISBON, session_id=first.session_id)
        open_sessions(page, server)
        expect(rows(page)).to_have_count(2, timeout=WAIT_MS)
        executions = rows(page).evaluate_all("rows => rows.map(row => row.dataset.executionId)")
        assert executions == [second.execution_id, first.execution_id]
        expect(rows(page).nth(1).locator(".badge")).to_have_text("failed")
        expect(rows(page).nth(0).locator("td").nth(6)).to_have_text("3")
        rows(page).nth(0).locator("td").nth(3).click()
        expect(page.locator("#execution-id")).to_have_text(second.execution_id, timeout=WAIT_MS)
        items = page.locator("#run-list > li")
        expect(items).to_have_count(2)
        expect(page.locator("#run-status")).to_have_text("completed")
        steps = page.locator('#waterfall li[data-kind="step"] .span-name')
        expect(steps).to_have_text(["Step 3", "Step 4", "Step 5"])
        expect(page.locator("#run-envelopes")).to_have_text(str(len(second.records)))
        items.nth(0).get_by_role("button").click()
        expect(page.locator("#run-status")).to_have_text("failed")
        expect(steps).to_have_text(["Step 1", "Step 2"])
    finally:
        server.stop()
