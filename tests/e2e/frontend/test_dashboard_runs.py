"""The live dashboard tells the truth about a session's runs, in Chromium: the runs of one
session apart (the latest shown, the earlier ones listed and openable, each reconciled on
its own), failures drawn as failures, "no such session" for an id the server never saw,
and a run whose server went away shown as such with its clock stopped.

The run's facts are read off ``#run-facts`` (data-* attributes: docs/operations.md, "The
live dashboard"), the colours off the computed style of what the failure attributes
select.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.pages import WAIT_MS, screenshot, start_run
from tests.support.processes import RedisServer, ServerFactory, ServerProcess, free_port
from tests.support.reliability import publish_sync

pytestmark = pytest.mark.browser

BAD = "rgb(198, 40, 40)"  # --bad in styles.css
OK = "rgb(26, 127, 55)"  # --ok


def continue_session(url: str, session: str, question: str, pace: int = 5) -> None:
    """Start another run of ``session`` through ``POST /run``, as another client would."""
    body = {"input": question, "session_id": session, "pace_ms": pace}
    response = httpx.post(f"{url}/run", json=body, timeout=10)
    assert response.status_code == 202, response.text


def facts(page: Page) -> Locator:
    return page.locator("#run-facts")


def runs_list(page: Page) -> Locator:
    return page.get_by_role("list", name="Runs of this session").locator("> li")


def colour(locator: Locator, prop: str) -> str:
    return str(locator.evaluate(f"(node) => getComputedStyle(node).{prop}"))


# --- six runs of one session, apart ------------------------------------------------------

QUESTIONS = [
    "What is the weather in Lisbon?",
    "What is 6 * 7?",
    "What is the weather in Oslo? [fail:model]",
    "Hello there",
    "What is the weather in Rome?",
    "What is 2 + 2?",
]


def test_six_runs_of_one_session_are_shown_apart_each_reconciled_on_its_own(
    browser: Browser, page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """Each run that starts while the page follows the session is shown as it starts
    (its own steps, status, totals, answer), the one before moving to the list with its
    own verdict; an earlier run opens to its own steps. A page attaching afterwards
    lists the six, shows the latest in sync, and says the earlier ones cannot be checked
    against the session's state (it is the latest run's)."""
    session = start_run(page, demo_server.url, QUESTIONS[0], pace="40")
    seen: list[dict[str, str]] = []
    for number, question in enumerate(QUESTIONS, start=1):
        if number > 1:
            continue_session(demo_server.url, session, question)
        if seen:
            expect(facts(page)).not_to_have_attribute("data-execution-id", seen[-1]["id"])
        expect(facts(page)).to_have_attribute(
            "data-status", re.compile("completed|failed"), timeout=WAIT_MS
        )
        expect(facts(page)).to_have_attribute("data-reconcile", "in_sync", timeout=WAIT_MS)
        first = page.locator("#timeline .step-number").first.inner_text()
        run = {
            "id": facts(page).get_attribute("data-execution-id") or "",
            "status": facts(page).get_attribute("data-status") or "",
            "steps": facts(page).get_attribute("data-steps") or "",
            "first": first,
        }
        if seen:  # step numbers go on across the session's runs, each run shows its own
            assert int(run["first"]) > int(seen[-1]["first"]), (seen, run)
        expect(page.locator("#timeline > li.step")).to_have_count(int(run["steps"]))
        seen.append(run)
    assert [run["status"] for run in seen] == [
        "completed",
        "completed",
        "failed",
        "completed",
        "completed",
        "completed",
    ]
    expect(facts(page)).to_have_attribute("data-runs", "6")
    items = runs_list(page)
    expect(items).to_have_count(6)
    for index, run in enumerate(reversed(seen)):
        item = items.nth(index)
        expect(item).to_have_attribute("data-execution-id", run["id"])
        expect(item).to_have_attribute("data-status", run["status"])
        expect(item).to_have_attribute("data-reconcile", "in_sync")
    expect(page.get_by_role("status").filter(has_text="In sync")).to_be_visible()
    screenshot(page, artifacts, "six-runs-live")

    # An earlier run opens to its own steps and verdict; the latest is followed again.
    failed = seen[2]
    items.nth(3).get_by_role("button").click()
    expect(facts(page)).to_have_attribute("data-execution-id", failed["id"])
    expect(facts(page)).to_have_attribute("data-status", "failed")
    expect(page.get_by_label("Run status")).to_have_text("failed")
    expect(page.locator("#timeline > li.step")).to_have_count(int(failed["steps"]))
    expect(page.locator("#timeline .step-number").first).to_have_text(failed["first"])
    expect(page.locator("#run-error")).to_contain_text("failed on purpose")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync")
    page.get_by_role("button", name="Follow the latest run").click()
    expect(facts(page)).to_have_attribute("data-execution-id", seen[-1]["id"])

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        late = context.new_page()
        late.goto(f"{demo_server.url}/#session={session}")
        expect(facts(late)).to_have_attribute("data-execution-id", seen[-1]["id"], timeout=WAIT_MS)
        expect(facts(late)).to_have_attribute("data-reconcile", "in_sync", timeout=WAIT_MS)
        expect(late.locator("#timeline > li.step")).to_have_count(int(seen[-1]["steps"]))
        late_items = runs_list(late)
        expect(late_items).to_have_count(6)
        for index in range(1, 6):
            expect(late_items.nth(index)).to_have_attribute("data-reconcile", "superseded")
        late_items.nth(5).get_by_role("button").click()
        expect(late.locator("#timeline .step-number").first).to_have_text("1")
        expect(late.locator("#reconcile")).to_contain_text("Not checked against the stored state")
        screenshot(late, artifacts, "six-runs-attached")
    finally:
        context.close()


# --- failures drawn as failures ------------------------------------------------------------


def test_a_failed_step_a_stop_for_an_error_and_a_failed_run_are_drawn_red_on_both_pages(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """Step limit 2 and a model failing in step 2: the step is ``failed`` (red border),
    its decision ``stop (error)`` is an ``error`` outcome (red), the run's badge is red;
    the run page draws the same decision red. A completed step and stop stay green."""
    session = start_run(page, demo_server.url, "Weather in Oslo? [fail:model]", max_steps="2")
    expect(facts(page)).to_have_attribute("data-status", "failed", timeout=WAIT_MS)
    failed = page.locator("#step-2")
    expect(failed).to_have_attribute("data-state", "failed")
    assert colour(failed.locator("article"), "borderLeftColor") == BAD
    decision = failed.locator("details.continuation")
    expect(decision).to_have_attribute("data-outcome", "error")
    expect(decision.locator(".decision")).to_have_text("stop (error)")
    assert colour(decision.locator(".decision"), "color") == BAD
    badge = page.get_by_label("Run status")
    expect(badge).to_have_attribute("data-status", "failed")
    assert colour(badge, "color") == BAD
    done = page.locator("#step-1")
    expect(done).to_have_attribute("data-state", "done")
    assert colour(done.locator("article"), "borderLeftColor") == OK
    screenshot(page, artifacts, "failure-styling")

    page.goto(f"{demo_server.url}/demo/run.html?session={session}")
    block = page.locator('#continuations > .cont-block[data-step="2"]')
    expect(block).to_have_attribute("data-outcome", "error", timeout=WAIT_MS)
    assert colour(block, "borderLeftColor") == BAD
    assert colour(block.locator("h3 .outcome"), "color") == BAD
    expect(page.locator('#waterfall .span-row[data-kind="step"][data-step="2"]')).to_have_attribute(
        "data-state", "error"
    )
    run_badge = page.get_by_label("Run status")
    expect(run_badge).to_have_attribute("data-status", "failed")
    assert colour(run_badge, "color") == BAD
    expect(facts(page)).to_have_attribute("data-status", "failed")
    expect(facts(page)).to_have_attribute("data-stop-reason", "error")


def test_a_failed_tool_call_is_drawn_red(page: Page, demo_server: ServerProcess) -> None:
    start_run(page, demo_server.url, "What is the weather in Oslo? [fail:tool]")
    expect(facts(page)).to_have_attribute(
        "data-status", re.compile("completed|failed"), timeout=WAIT_MS
    )
    tool = page.locator('li.tool[data-state="error"]')
    expect(tool).to_have_count(1)
    expect(tool.locator(".tool-outcome")).to_have_text("error")
    assert colour(tool.locator(".tool-outcome"), "color") == BAD
    assert colour(tool.locator(".tool-detail"), "color") == BAD


# --- a session the server never saw ----------------------------------------------------------


def test_an_unknown_session_says_no_such_session_and_one_without_a_run_says_so(
    page: Page, demo_server: ServerProcess, artifacts: Path
) -> None:
    """An id the server has no events, state or runs of is "no such session" on the
    live page and the run page, not an empty page; a session whose channel has events
    but no run says it has no run yet, and shows its run as it starts."""
    page.goto(f"{demo_server.url}/#session=never-ran-1")
    notice = page.locator("#session-notice")
    expect(notice).to_have_attribute("data-kind", "no-such-session", timeout=WAIT_MS)
    expect(notice).to_contain_text("No such session")
    expect(notice).to_be_visible()
    screenshot(page, artifacts, "no-such-session")

    page.goto(f"{demo_server.url}/demo/run.html?session=never-ran-1")
    error = page.locator("#page-error")
    expect(error).to_have_attribute("data-kind", "no-such-session", timeout=WAIT_MS)
    expect(error).to_contain_text("No such session")

    answer = publish_sync(demo_server.url, "agent.quiet-1", "client-note", "{}")
    assert answer.status_code == 200, answer.text
    page.goto(f"{demo_server.url}/#session=quiet-1")
    expect(notice).to_have_attribute("data-kind", "no-run-yet", timeout=WAIT_MS)
    expect(notice).to_contain_text("has no run yet")
    continue_session(demo_server.url, "quiet-1", "What is the weather in Oslo?")
    expect(facts(page)).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(notice).to_be_hidden()

    page.goto(f"{demo_server.url}/demo/run.html?session=never-ran-2")
    expect(error).to_have_attribute("data-kind", "no-such-session", timeout=WAIT_MS)


# --- a server that went away -------------------------------------------------------------------


def test_a_run_whose_server_was_killed_says_the_server_went_away_and_its_clock_stops(
    page: Page, server_factory: ServerFactory, artifacts: Path
) -> None:
    """SIGKILL the server mid-run: the page says the connection was lost, then that the
    server went away, and the run's clock stops (never "in progress" with a clock
    running). The server restarted on the same address (memory: it lost everything) does
    not bring the run back: the page still says so, the clock still stopped."""
    port = str(free_port())
    server = server_factory("--demo", "--port", port)
    page.goto(server.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("Pace").select_option("400")
    page.get_by_label("Ask the agent").fill("What is the weather in Lima? " * 20)
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#step-1 .step-text")).to_contain_text("Lima", timeout=WAIT_MS)
    badge = page.get_by_label("Run status")
    expect(badge).to_have_text("in progress")
    server.kill()
    expect(badge).to_have_text("connection lost", timeout=WAIT_MS)
    expect(badge).to_have_text("server went away", timeout=WAIT_MS)
    expect(facts(page)).to_have_attribute("data-link", "gone")
    expect(facts(page)).to_have_attribute("data-status", "in_progress")  # it never ended
    expect(page.locator("#run-link")).to_contain_text("The server went away")
    assert colour(badge, "color") == BAD
    stopped = page.locator("#total-time").inner_text()
    page.wait_for_timeout(1500)  # the clock ticks every 0.5 s while a run goes on
    expect(page.locator("#total-time")).to_have_text(stopped)
    expect(page.locator("#step-1")).to_have_attribute("data-state", "stopped")
    screenshot(page, artifacts, "server-went-away")

    server_factory("--demo", "--port", port)
    connection = page.get_by_role("status", name="Connection")
    expect(connection).to_contain_text("Live", timeout=WAIT_MS)
    expect(page.locator("#run-link")).to_contain_text("came back without this run", timeout=WAIT_MS)
    expect(badge).to_have_text("server went away")
    page.wait_for_timeout(1000)
    expect(page.locator("#total-time")).to_have_text(stopped)


@pytest.mark.redis
def test_a_run_whose_node_died_is_shown_gone_by_a_page_on_another_node(
    page: Page, server_factory: ServerFactory, redis_server: RedisServer, artifacts: Path
) -> None:
    """Two nodes on one Redis; the run goes on node A, the page follows it on node B.
    SIGKILL A: B's connection stays up and the run index still lists the run running,
    but its claim lapses (lease 1 s), so B answers it ``abandoned`` and the page, hearing
    nothing of the run, asks and says its server went away (never a clock running on);
    the run page says so too."""
    args = ["--demo", "--backend", redis_server.url, "--redis-prefix", f"t{uuid.uuid4().hex[:10]}"]
    env = {"AGENT_DEMO_RUN_LEASE": "1"}
    runner = server_factory(*args, env=env)
    watcher = server_factory(*args, env=env)
    body = {"input": "What is the weather in Lima? " * 20, "pace_ms": 400}
    started = httpx.post(f"{runner.url}/run", json=body, timeout=10)
    assert started.status_code == 202, started.text
    session = started.json()["session_id"]
    page.goto(f"{watcher.url}/#session={session}")
    expect(page.locator("#step-1 .step-text")).to_contain_text("Lima", timeout=WAIT_MS)
    expect(page.get_by_label("Run status")).to_have_text("in progress")
    runner.kill()
    badge = page.get_by_label("Run status")
    expect(badge).to_have_text("server went away", timeout=WAIT_MS)
    expect(page.locator("#run-link")).to_contain_text("nothing runs it")
    expect(page.get_by_role("status", name="Connection")).to_contain_text("Live")
    stopped = page.locator("#total-time").inner_text()
    page.wait_for_timeout(1500)
    expect(page.locator("#total-time")).to_have_text(stopped)
    screenshot(page, artifacts, "run-node-died")
    [run] = httpx.get(f"{watcher.url}/api/sessions/{session}/runs", timeout=10).json()["runs"]
    assert (run["status"], run["abandoned"]) == ("running", True)

    page.goto(f"{watcher.url}/demo/run.html?session={session}")
    expect(page.get_by_label("Run status")).to_have_text("server went away", timeout=WAIT_MS)
    expect(page.locator("#run-gone")).to_be_visible()
    expect(facts(page)).to_have_attribute("data-link", "gone")
