"""What the page tells a user, in a real browser: that the agent is a scripted stand-in
for a model, the step limit each mode really applies, why each step's continuation
went as it did (which criterion won, by which precedence rule), and a routed run
whose capability failed shown failed and in sync."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.pages import WAIT_MS, screenshot, start_run
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def demo() -> Iterator[ServerProcess]:
    server = ServerProcess(("--demo",)).start()
    yield server
    server.stop()


def test_the_page_says_the_agent_is_scripted_and_labels_each_modes_step_limit(
    page: Page,
    demo: ServerProcess,
) -> None:
    page.goto(demo.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    note = page.locator("#driver-note")
    expect(note).to_contain_text("scripted stand-in for a model")
    expect(note).to_contain_text("agent_core/drivers/openai.py")
    limit = page.get_by_label("Step limit")
    default = limit.locator("option[value='']")
    expect(default).to_have_text("default (20)")
    limit.select_option("5")
    page.get_by_label("Mode").select_option("route")
    expect(default).to_have_text("default (5)")
    expect(limit.locator("option[value='5']")).to_be_enabled()
    page.get_by_label("Mode").select_option("agent")
    expect(default).to_have_text("default (20)")
    expect(limit).to_have_value("5")


def test_the_page_explains_which_criterion_won_and_by_which_rule(
    page: Page,
    demo: ServerProcess,
    artifacts: Path,
) -> None:
    start_run(page, demo.url, "What is the weather in Oslo?")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    first, last = page.locator("#step-1 .cont-why"), page.locator("#step-3 .cont-why")
    expect(first).to_have_attribute("data-rule", "first-request")
    expect(first).to_contain_text(
        "ToolCallPresenceCheck won: nothing forbade, and a request continues the run"
    )
    expect(last).to_have_attribute("data-rule", "first-stop")
    expect(last).to_contain_text("the first criterion that proposed the stop decides")

    # [fail:tool] on the last allowed step: the tool error and the step limit both
    # forbid, and the error wins.
    start_run(page, demo.url, "What is the weather in Oslo? [fail:tool]", max_steps="2")
    expect(page.get_by_label("Run status")).to_have_text("failed", timeout=WAIT_MS)
    why = page.locator("#step-2 .cont-why")
    expect(why).to_have_attribute("data-rule", "error-wins")
    expect(why).to_contain_text("an error wins over any limit that forbade")
    expect(why).to_contain_text("StepsLimit")
    screenshot(page, artifacts, "continuation-why")

    # Arithmetic: the calculator, with the real result.
    start_run(page, demo.url, "What is 6 * 7?")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#answer")).to_contain_text("6 * 7 = 42.")
    expect(page.locator("#step-1 li.tool .tool-name")).to_have_text("calculator")


def test_a_routed_run_whose_capability_failed_is_failed_and_in_sync(
    page: Page,
    demo: ServerProcess,
) -> None:
    page.goto(demo.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    page.get_by_label("Ask the agent").fill("What is the weather in Oslo? [fail:tool]")
    page.get_by_label("Mode").select_option("route")
    page.get_by_role("button", name="Start run").click()
    expect(page.get_by_label("Run status")).to_have_text("failed", timeout=WAIT_MS)
    expect(page.locator("#run-error")).to_contain_text("capability 'weather_agent'")
    tools = page.locator("#step-1 li.tool")
    expect(tools).to_have_count(1)  # the capability; the routing phases are not tools
    expect(tools).to_have_attribute("data-state", "error")
    routing = page.locator("#step-1 .routing")
    expect(routing.locator(".route-memory")).to_have_text("turn remembered · 1 kept")
    expect(page.locator("#step-1 .cont-why")).to_have_attribute("data-rule", "error-forbid")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
