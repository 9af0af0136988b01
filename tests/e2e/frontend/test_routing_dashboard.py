"""A routed run (``mode: route``) on the live dashboard in a real browser: the
page shows which capability ran and why (intent, confidence, reason, decider verdict),
keeps the routing phases apart from the step's tool calls, and reconciles in sync."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.pages import WAIT_MS, screenshot
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.browser


def start(tab: Page, url: str, question: str, mode: str) -> None:
    tab.goto(url + "/")
    expect(tab.locator("body")).to_have_attribute("data-ready", "true", timeout=WAIT_MS)
    tab.get_by_label("Ask the agent").fill(question)
    tab.get_by_label("Mode").select_option(mode)
    tab.get_by_role("button", name="Start run").click()
    expect(tab.locator("#session-id")).not_to_have_text("—", timeout=WAIT_MS)


def test_a_routed_run_shows_its_capability_intent_confidence_and_decider_verdict(
    page: Page,
    demo_server: ServerProcess,
    artifacts: Path,
) -> None:
    start(page, demo_server.url, "What is the weather in Lisbon?", "route")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    steps = page.locator("#timeline > li.step")
    expect(steps).to_have_count(1)
    routing = page.get_by_role("article").get_by_label("Routing")
    expect(routing).to_be_visible()
    expect(routing.locator(".route-capability")).to_have_text("weather_agent")
    expect(routing.locator(".route-intent")).to_have_text("weather_agent")
    expect(routing.locator(".route-confidence")).to_have_text("0.90")
    expect(routing.locator(".route-reason")).to_have_text("the request is about the weather")
    expect(routing.locator(".route-decider")).to_have_text("done")
    expect(routing.locator(".route-decider")).to_have_attribute("data-verdict", "done")
    # The capability is the step's one tool call; the phases are not tool calls.
    tools = page.locator("#step-1 li.tool")
    expect(tools).to_have_count(1)
    expect(tools.locator(".tool-name")).to_have_text("weather_agent")
    expect(tools).to_have_attribute("data-state", "ok")
    expect(page.locator("#step-1 .continuation .cont-resolved")).not_to_be_empty()
    expect(page.locator("#answer")).to_contain_text("In Lisbon it is")
    expect(page.locator("#total-tokens")).not_to_have_text("0")
    expect(page.locator("#reconcile")).to_have_attribute("data-state", "in_sync", timeout=WAIT_MS)
    screenshot(page, artifacts, "routed-run")

    start(page, demo_server.url, "summarize: the quick brown fox jumps", "route")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    routing = page.locator("#step-1 .routing")
    expect(routing.locator(".route-capability")).to_have_text("summarize")
    expect(routing.locator(".route-confidence")).to_have_text("0.95")
    expect(page.locator("#answer")).to_contain_text("Summary (5 words)")

    start(page, demo_server.url, "What is the weather in Lisbon?", "agent")
    expect(page.get_by_label("Run status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#step-1 .routing")).to_be_hidden()
